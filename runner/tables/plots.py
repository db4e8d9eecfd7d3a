"""A suite's figures: validation curves by arm (curves.png), a grid preset's heatmaps
(heatmap.png) and, for claims that the best setting transfers, the metric against the tuned
setting by depth (transfer.png). matplotlib is imported only when a figure is drawn."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from runner.files import atomic_path
from runner.run.status import FAILED_TO_TRAIN
from runner.sweep.plan import load_preset, norm_key
from runner.tables.claims import selector_matches
from runner.tables.evidence import numeric_order
from runner.tables.suite import SEED_AXIS, SuiteCell, finite_values, preset_claims


def _matplotlib():
    """matplotlib on the Agg backend (files, no display) with pyplot loaded, as
    `_matplotlib().pyplot`: imported when a figure is drawn, since it adds 0.5 s to an import."""
    import matplotlib  # noqa: PLC0415 (+0.5 s at import; only plots need it)

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: PLC0415 (see above)

    return matplotlib


def _save(plt, fig, path: Path) -> Path:
    """The figure as a PNG at `path` (written atomically), then closed."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def plot_curves(cells: Sequence[SuiteCell], path: Path) -> Optional[Path]:
    """Validation loss against updates, one colour per arm, one line per seed."""
    done = [c for c in cells if c.record and c.record.get("valid_curve")]
    if not done:
        return None
    plt = _matplotlib().pyplot

    arms = sorted({" ".join(f"{k}={v}" for k, v in c.arm.items()) for c in done})
    colours = {a: plt.cm.tab10(i % 10) for i, a in enumerate(arms)}
    fig, ax = plt.subplots(figsize=(8, 5))
    seen = set()
    for c in done:
        label = " ".join(f"{k}={v}" for k, v in c.arm.items())
        steps, losses = zip(*c.record["valid_curve"])
        ax.plot(steps, losses, color=colours[label], alpha=0.8,
                label=None if label in seen else label)
        seen.add(label)
    ax.set_xlabel("update")
    ax.set_ylabel("validation loss (label-smoothed, nats/token)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(plt, fig, path)


def grid_axes(preset: str) -> Optional[tuple[str, str]]:
    """(x, y) when the preset is a grid: exactly two swept nuisance axes besides the seed (the
    Admin no-warmup figure's lr x beta2, per method); None otherwise."""
    axes = [norm_key(a) for a in ((load_preset(preset).get("sweep") or {}).get("nuisance") or [])
            if norm_key(a) != SEED_AXIS]
    return (axes[0], axes[1]) if len(axes) == 2 else None


def grid_panels(cells: Sequence[SuiteCell], x: str, y: str) -> dict[str, dict]:
    """Per arm of the other axes (e.g. per method): the x and y values, the mean best validation
    loss over the ok seeds of each (y, x) setting (NaN when none), and its label: the mean, or
    how many seeds diverged / stalled, or "-" when no seed has run."""
    panels: dict[str, dict] = {}
    xs = sorted({c.arm[x] for c in cells}, key=numeric_order)
    ys = sorted({c.arm[y] for c in cells}, key=numeric_order)
    for cell in cells:
        name = " ".join(f"{k}={v}" for k, v in cell.arm.items() if k not in (x, y)) or "all"
        panel = panels.setdefault(name, {"xs": xs, "ys": ys, "records": {}})
        if cell.record is not None:
            panel["records"].setdefault((cell.arm[y], cell.arm[x]), []).append(cell.record)
    for panel in panels.values():
        values = [[math.nan] * len(xs) for _ in ys]
        labels = [["-"] * len(xs) for _ in ys]
        for (yv, xv), records in panel.pop("records").items():
            i, j = ys.index(yv), xs.index(xv)
            ok = finite_values(records, "best_valid_loss")
            bad = [f"{sum(r['status'] == st for r in records)}/{len(records)} {word}"
                   for st, word in (("diverged", "div"), ("stalled", "stall"))
                   if any(r["status"] == st for r in records)]
            if ok:
                values[i][j] = sum(ok) / len(ok)
            labels[i][j] = "\n".join(([f"{values[i][j]:.2f}"] if ok else []) + bad)
        panel.update(values=values, labels=labels)
    return panels


def _short(value: str) -> str:
    try:
        return f"{float(value):g}"
    except ValueError:
        return value


def plot_grid(preset: str, cells: Sequence[SuiteCell], path: Path) -> Optional[Path]:
    """A grid preset's heatmaps, one panel per arm of the other axes on one colour scale: mean
    best validation loss over the ok seeds, with the diverged and stalled seed counts."""
    spec = grid_axes(preset)
    if spec is None or not any(c.record for c in cells):
        return None
    mpl = _matplotlib()
    plt = mpl.pyplot

    x, y = spec
    panels = grid_panels(cells, x, y)
    finite = [v for p in panels.values() for row in p["values"] for v in row if math.isfinite(v)]
    vmin, vmax = (min(finite), max(finite)) if finite else (0.0, 1.0)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.2, 3.4), squeeze=False,
                             layout="constrained")
    cmap = mpl.colormaps["viridis_r"].with_extremes(bad="#d9d9d9")  # lower loss: brighter
    image = None
    for ax, (name, panel) in zip(axes[0], panels.items()):
        data = np.ma.masked_invalid(np.array(panel["values"], dtype=float))
        image = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", origin="lower")
        for i, row in enumerate(panel["labels"]):
            for j, text in enumerate(row):
                value = panel["values"][i][j]
                r, g, b, _ = cmap((value - vmin) / ((vmax - vmin) or 1.0)) if math.isfinite(value) else (1, 1, 1, 1)
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white")
        ax.set_xticks(range(len(panel["xs"])), [_short(v) for v in panel["xs"]])
        ax.set_yticks(range(len(panel["ys"])), panel["ys"])
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(name, fontsize=9)
    fig.colorbar(image, ax=list(axes[0]), label="best valid loss (mean of ok seeds)")
    return _save(plt, fig, path)


def transfer_panels(preset: str, cells: Sequence[SuiteCell]) -> dict[str, dict]:
    """The data behind transfer.png, one panel per claim of kind `same_best` (a claim whose cells
    are all another's, such as one kept to part of the grid, shares that claim's panel): per
    `across` value, the `over` values with the mean metric of their ok seeds (NaN when none), each
    ok seed's value, and the cells that diverged or stalled."""
    claims = preset_claims(preset)
    claims = [c for c in claims if c.kind == "same_best"]
    chosen = {c.id: [cell for cell in cells if selector_matches(cell.arm, c.a)] for c in claims}
    cell_ids = {c.id: {id(cell) for cell in chosen[c.id]} for c in claims}
    panels: dict[str, dict] = {}

    def figure(c) -> tuple:  # claims that draw the same figure, on their own cells
        return (c.over, c.across, c.metric, c.higher_is_better)

    for claim in claims:
        mine = cell_ids[claim.id]
        if any(mine < cell_ids[other.id] or (mine == cell_ids[other.id] and other.id in panels)
               for other in claims if other.id != claim.id and figure(other) == figure(claim)):
            continue
        over, across = claim.over or "", claim.across or ""
        xs = sorted({cell.arm.get(over, "") for cell in chosen[claim.id]}, key=numeric_order)
        lines: dict[str, dict] = {}
        for depth in sorted({cell.arm.get(across, "") for cell in chosen[claim.id]}, key=numeric_order):
            at = [cell for cell in chosen[claim.id] if cell.arm.get(across, "") == depth and cell.record]
            seeds, failed, means = [], [], []
            for x in xs:
                ok = finite_values([cell.record for cell in at if cell.arm.get(over, "") == x], claim.metric)
                seeds += [(x, v) for v in ok]
                failed += [x for cell in at if cell.arm.get(over, "") == x
                           and cell.record["status"] in FAILED_TO_TRAIN]
                means.append(sum(ok) / len(ok) if ok else math.nan)
            lines[depth] = {"means": means, "seeds": seeds, "failed": failed}
        title = ", ".join(f"{k}={v}" for k, v in claim.a.items() if isinstance(v, str)) or claim.id
        panels[claim.id] = {"title": title, "over": over, "across": across, "metric": claim.metric, "xs": xs,
                            "higher_is_better": claim.higher_is_better, "lines": lines}
    return panels


def plot_transfer(preset: str, cells: Sequence[SuiteCell], path: Path) -> Optional[Path]:
    """For claims of kind `same_best`: the metric against the tuned setting, one line per depth
    (the Tensor Programs VI transfer figure), the best of each line starred, seeds as dots,
    diverged or stalled cells as crosses on the panel's top edge."""
    panels = transfer_panels(preset, cells)
    if not panels or not any(c.record for c in cells):
        return None
    plt = _matplotlib().pyplot

    one_metric = len({p["metric"] for p in panels.values()}) == 1
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 3.8), squeeze=False,
                             sharey=one_metric, layout="constrained")
    for ax, panel in zip(axes[0], panels.values()):
        # a log axis for positive numbers (learning rates), else evenly spaced categories
        numeric = all(numeric_order(x)[0] == 0 and float(x) > 0 for x in panel["xs"])
        position = {x: float(x) if numeric else i for i, x in enumerate(panel["xs"])}
        xs = [position[x] for x in panel["xs"]]
        for i, (depth, line) in enumerate(panel["lines"].items()):
            colour = plt.cm.tab10(i % 10)
            means = np.array(line["means"], dtype=float)
            ax.plot(xs, means, "-o", color=colour, label=f"{panel['across']}={depth}")
            if line["seeds"]:
                sx, sy = zip(*line["seeds"])
                ax.scatter([position[x] for x in sx], sy, color=colour, s=10, alpha=0.5)
            if np.isfinite(means).any():
                best = int(np.nanargmax(means) if panel["higher_is_better"] else np.nanargmin(means))
                ax.plot(xs[best], means[best], "*", color=colour, markersize=15, markeredgecolor="black")
            for x in line["failed"]:
                ax.plot(position[x], 1.0, "x", color=colour, transform=ax.get_xaxis_transform(), clip_on=False)
        if numeric:
            ax.set_xscale("log")
        ax.set_xticks(xs, [_short(x) for x in panel["xs"]], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel(panel["over"])
        ax.set_title(panel["title"], fontsize=9)
        if panel["lines"]:  # a panel whose arms were all left out of the run has nothing to name
            ax.legend(fontsize=7)
        if ax is axes[0][0] or not one_metric:
            ax.set_ylabel(f"{panel['metric']} (mean of ok seeds)")
    return _save(plt, fig, path)
