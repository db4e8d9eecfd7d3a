"""`deepinit report SWEEP_DIR`: tables and plots of a sweep, read from its run folders only.

A cell is a run folder (`.hydra/`, `metrics.jsonl`, `result.json`, `checkpoint_last.pt`). Launcher
return values are never used, so a report works on a sweep that is still running, was
interrupted, or was run by several launchers in turn. Expected cells come from `multirun.yaml`
(the sweeper's params plus the command line), so cells that have not started count as pending.

Axes: the overrides that differ between cells. A preset's `sweep:` block (see sweeps/*.yaml)
says which are nuisance; every other varying axis is scientific. The isolation table gives, for
each combination of scientific values, the best cell over the nuisance axes (the tuning
playbook's "best over nuisance"). Diverged cells are results, shown as "failed" in plots as the
papers do.
"""
from __future__ import annotations

import csv
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from runner.console import fmt, format_duration
from runner.run import folder
from runner.run.attempt import INTERRUPTED_FILE
from runner.run.status import (
    ENDED,
    FAILED,
    INTERRUPTED,
    OK,
    PENDING,
    RUNNING,
    STALLED,
    STATUSES,
    STYLE,
    UNFINISHED,
    UNTRAINED,
    ended_status,
)
from runner.sweep.plan import parse_overrides

# Statuses: runner/run/status.py. A report reads folders only, so a cell is never "queued" here;
# stalled and failed cells are shown like divergences (UNTRAINED).
# metric name -> True when larger is better
METRICS = {"best_valid_loss": False, "valid_loss": False, "train_loss": False, "bleu": True,
           # task=lm's result.json (runner/run/train.py): bits per character or per token, perplexity
           "best_valid_bpc": False, "best_valid_bpt": False, "valid_ppl": False}


@dataclass
class Cell:
    path: Optional[Path]  # None for a pending cell (no folder yet)
    overrides: list[str]
    status: str
    config: dict = field(default_factory=dict)
    choices: dict = field(default_factory=dict)
    result: dict = field(default_factory=dict)
    valid_curve: list[tuple[int, float]] = field(default_factory=list)
    last_step: Optional[int] = None

    def value(self, name: str) -> Optional[float]:
        """A metric: from result.json, else (while running) from metrics.jsonl."""
        v = self.result.get(name)
        finite = [loss for _, loss in self.valid_curve if math.isfinite(loss)]
        if not self.result and finite:  # still running: what metrics.jsonl shows so far
            v = {"best_valid_loss": min(finite), "valid_loss": finite[-1]}.get(name)
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return None
        return float(v)

    @property
    def updates(self) -> Optional[int]:
        u = self.result.get("updates")
        return int(u) if u is not None else self.last_step


@dataclass
class Sweep:
    root: Path
    cells: list[Cell]
    scientific: list[str]  # varying axes compared
    nuisance: list[str]  # varying axes optimized over
    name: Optional[str] = None

    @property
    def axes(self) -> list[str]:
        return self.scientific + self.nuisance

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for c in self.cells:
            out[c.status] += 1
        out["done"] = sum(out[s] for s in ENDED)
        out["total"] = len(self.cells)
        return out


# ---------------------------------------------------------------------------------------------
# reading folders


def _key(override: str) -> str:
    """The axis an override sets: `method=admin` -> `method`."""
    return override.split("=", 1)[0].lstrip("+~")


def _val(override: str) -> str:
    return override.split("=", 1)[1] if "=" in override else ""


def _is_task_override(override: str) -> bool:
    return not _key(override).startswith("hydra")


def _load_yaml(path: Path) -> Any:
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None


def _read_metrics(run_dir: Path) -> tuple[list[tuple[int, float]], Optional[int]]:
    curve, last = [], None
    for rec in folder.read_metrics(run_dir):
        step = rec.get("step")
        if step is None:
            continue
        last = step if last is None else max(last, step)
        if rec.get("split") == "valid" and rec.get("loss") is not None:
            curve.append((int(step), float(rec["loss"])))
    return curve, last


def read_cell(run_dir: Path) -> Cell:
    """One run folder -> Cell. Status: result.json's, else interrupted (interrupted.json), else
    running once the job has started."""
    run_dir = Path(run_dir)
    overrides = _load_yaml(run_dir / ".hydra" / "overrides.yaml") or []
    config = _load_yaml(run_dir / ".hydra" / "config.yaml") or {}
    hydra_cfg = _load_yaml(run_dir / ".hydra" / "hydra.yaml") or {}
    choices = (((hydra_cfg.get("hydra") or {}).get("runtime") or {}).get("choices") or {})
    result: dict = folder.read_result(run_dir) or {}
    if not overrides and result.get("overrides"):
        overrides = list(result["overrides"])
    curve, last = _read_metrics(run_dir)
    if result:
        status = ended_status(result)
    else:
        status = INTERRUPTED if (run_dir / INTERRUPTED_FILE).exists() else RUNNING
    return Cell(path=run_dir, overrides=[o for o in overrides if _is_task_override(o)],
                status=status, config=config, choices=choices, result=result,
                valid_curve=sorted(curve), last_step=last)


def _is_run_dir(d: Path) -> bool:
    return (d / ".hydra" / "overrides.yaml").exists() or (d / "result.json").exists()


def find_run_dirs(root: Path) -> list[Path]:
    """Run folders anywhere below root (override names with '/' nest), skipping submitit's."""
    found = []
    for marker in itertools.chain(root.rglob(".hydra"), root.rglob("result.json")):
        d = marker.parent
        if ".submitit" in d.relative_to(root).parts:  # root itself may be a single run
            continue
        if _is_run_dir(d):
            found.append(d)
    return sorted(set(found))


def expected_cells(multirun_yaml: Path) -> list[list[str]]:
    """The cells the sweeper launches, rebuilt as BasicSweeper does: preset params first, the
    command line's overrides replacing params of the same key, then the cartesian product."""
    data = _load_yaml(multirun_yaml) or {}
    hydra_node = data.get("hydra") or {}
    params = ((hydra_node.get("sweeper") or {}).get("params")) or {}
    task = list(((hydra_node.get("overrides") or {}).get("task")) or [])

    lines = [f"{k}={v}" for k, v in params.items()] + task
    axes: dict[str, list[str]] = {}
    for o in parse_overrides(lines):
        if o.sweep is not None:
            axes[o.key] = [f"{o.key}={v}" for v in o.sweep]
        else:
            axes[o.key] = [f"{o.key}={o.value}"]
    return [list(combo) for combo in itertools.product(*axes.values())]


def _lookup(cell: Cell, axis: str) -> Any:
    if axis in cell.choices:
        return cell.choices[axis]
    node: Any = cell.config
    for part in axis.split("."):
        if not isinstance(node, dict) or part not in node:
            node = None
            break
        node = node[part]
    if node is not None:
        return node
    for o in cell.overrides:  # pending cells have only their overrides
        if _key(o) == axis:
            return _val(o)
    return None


def axis_value(cell: Cell, axis: str) -> str:
    """An axis' value for display and grouping, read from the override when there is one."""
    for o in cell.overrides:
        if _key(o) == axis:
            return _val(o)
    v = _lookup(cell, axis)
    return "" if v is None else str(v)


def _declared_axes(cells: Sequence[Cell], multirun: Any) -> tuple[Optional[str], list, list]:
    blocks = [c.config.get("sweep") for c in cells if c.config.get("sweep")]
    if isinstance(multirun, dict) and multirun.get("sweep"):
        blocks.append(multirun["sweep"])
    for b in blocks:
        if isinstance(b, dict):
            return b.get("name"), list(b.get("scientific") or []), list(b.get("nuisance") or [])
    return None, [], []


def load_sweep(root: Path | str, scientific: Optional[Sequence[str]] = None,
               nuisance: Optional[Sequence[str]] = None) -> Sweep:
    """Read every run folder under root plus the cells multirun.yaml still expects."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory")
    cells = [read_cell(d) for d in find_run_dirs(root)]
    multirun = _load_yaml(root / "multirun.yaml")
    if multirun is not None:
        seen = [frozenset(c.overrides) for c in cells]
        for combo in expected_cells(root / "multirun.yaml"):
            want = frozenset(o for o in combo if _is_task_override(o))
            if not any(want <= s for s in seen):
                cells.append(Cell(path=None, overrides=sorted(want), status=PENDING))
    name, sci_decl, nui_decl = _declared_axes(cells, multirun)
    if scientific is not None:
        sci_decl = list(scientific)
    if nuisance is not None:
        nui_decl = list(nuisance)

    varying: list[str] = []
    for c in cells:
        for o in c.overrides:
            k = _key(o)
            if k not in varying and k != "sweep" and len({axis_value(x, k) for x in cells}) > 1:
                varying.append(k)
    # declared axes that vary without being overridden directly (e.g. norm via method)
    for k in sci_decl + nui_decl:
        if k not in varying and len({axis_value(x, k) for x in cells}) > 1:
            varying.append(k)
    nui = [k for k in nui_decl if k in varying]
    sci = [k for k in varying if k not in nui]
    # drop scientific axes that are fully determined by another (norm, init follow method)
    sci = [k for k in sci if not _determined_by_other(cells, k, [a for a in sci if a != k])]
    return Sweep(root=root, cells=sorted(cells, key=lambda c: _sort_key(c, sci + nui)),
                 scientific=sci, nuisance=nui, name=name)


def _determined_by_other(cells: Sequence[Cell], axis: str, others: Sequence[str]) -> bool:
    if axis not in {_key(o) for c in cells for o in c.overrides} and others:
        for other in others:
            mapping: dict[str, set] = {}
            for c in cells:
                mapping.setdefault(axis_value(c, other), set()).add(axis_value(c, axis))
            if all(len(v) == 1 for v in mapping.values()):
                return True
    return False


def _num_or_str(s: str) -> tuple:
    try:
        return (0, float(s), "")
    except ValueError:
        return (1, 0.0, s)


def _sort_key(cell: Cell, axes: Sequence[str]) -> tuple:
    return tuple(_num_or_str(axis_value(cell, a)) for a in axes)


# ---------------------------------------------------------------------------------------------
# tables


def _metric_better(metric: str, a: Optional[float], b: Optional[float]) -> bool:
    if a is None:
        return False
    if b is None:
        return True
    return a > b if METRICS.get(metric, False) else a < b


def isolation_rows(sweep: Sweep, metric: str = "best_valid_loss") -> list[dict]:
    """One row per scientific setting: the best finished cell over the nuisance axes."""
    groups: dict[tuple, list[Cell]] = {}
    for c in sweep.cells:
        groups.setdefault(tuple(axis_value(c, a) for a in sweep.scientific), []).append(c)
    rows = []
    for key in sorted(groups, key=lambda k: tuple(_num_or_str(v) for v in k)):
        members = groups[key]
        best: Optional[Cell] = None
        for c in members:
            if c.status == OK and _metric_better(metric, c.value(metric),
                                                   best.value(metric) if best else None):
                best = c
        counts = {s: sum(c.status == s for c in members) for s in STATUSES}
        rows.append({
            "scientific": dict(zip(sweep.scientific, key)),
            "best": best,
            "metric": best.value(metric) if best else None,
            "best_nuisance": {a: axis_value(best, a) for a in sweep.nuisance} if best else {},
            "counts": counts,
            "cells": len(members),
        })
    return rows


def cell_label(cell: Cell, axes: Sequence[str]) -> str:
    return " ".join(f"{a}={axis_value(cell, a)}" for a in axes) or ",".join(cell.overrides) or "-"


def table_rows(sweep: Sweep) -> list[dict]:
    rows = []
    for c in sweep.cells:
        row = {a: axis_value(c, a) for a in sweep.axes}
        row.update({
            "status": c.status,
            "best_valid_loss": c.value("best_valid_loss"),
            "valid_loss": c.value("valid_loss"),
            "train_loss": c.value("train_loss"),
            "bleu": c.value("bleu"),
            "updates": c.updates,
            "wall_s": c.result.get("wall_s"),
            "tokens_per_s": c.result.get("tokens_per_s"),
            "reason": c.result.get("reason") or "",
            "overrides": " ".join(c.overrides),
            "path": str(c.path.relative_to(sweep.root)) if c.path else "",
        })
        rows.append(row)
    return rows


def write_csv(sweep: Sweep, path: Path) -> None:
    rows = table_rows(sweep)
    cols = sweep.axes + ["status", "best_valid_loss", "valid_loss", "train_loss", "bleu", "updates",
                         "wall_s", "tokens_per_s", "reason", "overrides", "path"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r[k] is None else r[k]) for k in cols})


def _counts_line(sweep: Sweep) -> str:
    n = sweep.counts()
    return (f"{n['total']} cells: {n['done']} done ({n['ok']} ok, {n['diverged']} diverged, "
            f"{n['stalled']} stalled, {n['failed']} failed), "
            + (f"{n['interrupted']} interrupted, " if n["interrupted"] else "")
            + f"{n['running']} running, {n['pending']} pending")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table; '|' inside a cell is escaped."""
    esc = [[str(x).replace("|", "\\|") for x in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in esc]
    return "\n".join(lines)


def _cells_table(sweep: Sweep) -> tuple[list[str], list[list[str]]]:
    axes = sweep.axes or ["overrides"]
    header = axes + ["status", "best valid loss", "BLEU", "updates", "wall"]
    body = []
    for r in table_rows(sweep):
        body.append([r.get(a, r["overrides"]) if sweep.axes else r["overrides"] for a in axes] + [
            r["status"], fmt(r["best_valid_loss"], ".3f", small=1e-3), fmt(r["bleu"], ".2f", small=1e-3),
            "-" if r["updates"] is None else str(r["updates"]),
            "-" if r["wall_s"] is None else format_duration(r["wall_s"], short=True)])
    return header, body


METRIC_WORDS = {"best_valid_loss": "best valid loss", "valid_loss": "valid loss",
                "train_loss": "train loss", "bleu": "BLEU"}


def _best_of(metric: str) -> str:
    """"lowest best valid loss", "highest BLEU": the isolation table's value column."""
    return f"{'highest' if METRICS.get(metric, False) else 'lowest'} {METRIC_WORDS.get(metric, metric)}"


def isolation_title(sweep: Sweep, metric: str) -> str:
    if sweep.nuisance:
        return f"{_best_of(metric)} over {', '.join(sweep.nuisance)}"
    return f"{_best_of(metric)} per setting (the sweep has no nuisance axes)"


def _isolation_table(sweep: Sweep, metric: str) -> tuple[list[str], list[list[str]]]:
    header = (sweep.scientific or ["(all cells)"]) + [_best_of(metric)] + \
        [f"at {a}" for a in sweep.nuisance] + ["ok/diverged/stalled/failed/unfinished"]
    body = []
    for row in isolation_rows(sweep, metric):
        c = row["counts"]
        sci = [row["scientific"][a] for a in sweep.scientific] or ["-"]
        nui = [row["best_nuisance"].get(a, "-") for a in sweep.nuisance]
        body.append(sci + [fmt(row["metric"], ".2f" if metric == "bleu" else ".3f", small=1e-3)] + nui +
                    [f"{c['ok']}/{c['diverged']}/{c['stalled']}/{c['failed']}/"
                     f"{sum(c[s] for s in UNFINISHED)}"])
    return header, body


def render_markdown(sweep: Sweep, metric: str, images: Sequence[Path]) -> str:
    title = f"Sweep report: {sweep.name or sweep.root.name}"
    parts = [f"# {title}", "", f"`{sweep.root}`", "", _counts_line(sweep), "",
             f"Scientific axes: {', '.join(sweep.scientific) or '-'}; "
             f"nuisance axes: {', '.join(sweep.nuisance) or '-'}.", "",
             "## Cells", "", markdown_table(*_cells_table(sweep)), "",
             f"## Isolation table: {isolation_title(sweep, metric)}", "",
             markdown_table(*_isolation_table(sweep, metric)), ""]
    if images:
        parts += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images] + [""]
    return "\n".join(parts)


def print_rich(sweep: Sweep, metric: str) -> None:
    console = Console()
    header, body = _cells_table(sweep)
    t = Table(title=f"{sweep.name or sweep.root.name}: {_counts_line(sweep)}")
    for h in header:
        t.add_column(h, justify="right" if h in {"best valid loss", "BLEU", "updates", "wall"}
                     else "left")
    status_col = header.index("status")
    for r in body:
        r = list(r)
        r[status_col] = f"[{STYLE.get(r[status_col], '')}]{r[status_col]}[/]"
        t.add_row(*r)
    console.print(t)
    header, body = _isolation_table(sweep, metric)
    t = Table(title=f"isolation: {isolation_title(sweep, metric)}")
    for h in header:
        t.add_column(h)
    for r in body:
        t.add_row(*r)
    console.print(t)


# ---------------------------------------------------------------------------------------------
# plots


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_") or "all"


def heatmap_axes(sweep: Sweep) -> Optional[tuple[str, str, list[str]]]:
    """(x axis, y axis, facet axes) for a 2-D grid, or None. Two nuisance axes are the grid
    (faceted by the scientific setting, like the Admin beta2 x lr figure per method); otherwise a
    sweep with exactly two varying axes is one grid."""
    if len(sweep.nuisance) == 2:
        return sweep.nuisance[0], sweep.nuisance[1], list(sweep.scientific)
    if len(sweep.axes) == 2:
        return sweep.axes[0], sweep.axes[1], []
    return None


def plot_heatmaps(sweep: Sweep, metric: str, out_dir: Path) -> list[Path]:
    spec = heatmap_axes(sweep)
    if spec is None:
        return []
    import matplotlib  # noqa: PLC0415 (+0.5 s at import; only plots need it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (+0.5 s at import; only plots need it)

    xa, ya, facets = spec
    xs = sorted({axis_value(c, xa) for c in sweep.cells}, key=_num_or_str)
    ys = sorted({axis_value(c, ya) for c in sweep.cells}, key=_num_or_str)
    groups: dict[tuple, list[Cell]] = {}
    for c in sweep.cells:
        groups.setdefault(tuple(axis_value(c, a) for a in facets), []).append(c)
    paths = []
    for key, members in sorted(groups.items()):
        grid = np.full((len(ys), len(xs)), np.nan)
        text = [["" for _ in xs] for _ in ys]
        for c in members:
            i, j = ys.index(axis_value(c, ya)), xs.index(axis_value(c, xa))
            if c.status in UNTRAINED:
                text[i][j] = STALLED if c.status == STALLED else FAILED
            elif c.status == OK and c.value(metric) is not None:
                grid[i, j] = c.value(metric)
                text[i][j] = fmt(c.value(metric), ".2f", small=1e-3)
            else:
                text[i][j] = c.status
        fig, ax = plt.subplots(figsize=(1.3 * len(xs) + 2.5, 0.8 * len(ys) + 1.8))
        cmap = matplotlib.colormaps["viridis" if METRICS.get(metric, False) else "viridis_r"]
        cmap = cmap.with_extremes(bad="#d9d9d9")
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto", origin="lower")
        for i in range(len(ys)):
            for j in range(len(xs)):
                color = "black"
                if not np.isnan(grid[i, j]):  # readable on both ends of the colormap
                    r, g, b, _ = im.cmap(im.norm(grid[i, j]))
                    color = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
                ax.text(j, i, text[i][j], ha="center", va="center", fontsize=8, color=color)
        ax.set_xticks(range(len(xs)), xs)
        ax.set_yticks(range(len(ys)), ys)
        ax.set_xlabel(xa)
        ax.set_ylabel(ya)
        facet = " ".join(f"{a}={v}" for a, v in zip(facets, key))
        ax.set_title(f"{metric}{' - ' + facet if facet else ''}", fontsize=9)
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        path = out_dir / (f"heatmap_{_slug(facet)}.png" if facet else "heatmap.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_curves(sweep: Sweep, out_dir: Path) -> list[Path]:
    """Validation loss against updates, one figure per scientific setting, one line per cell."""
    if not any(c.valid_curve for c in sweep.cells):
        return []
    import matplotlib  # noqa: PLC0415 (+0.5 s at import; only plots need it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (+0.5 s at import; only plots need it)

    groups: dict[tuple, list[Cell]] = {}
    for c in sweep.cells:
        if c.valid_curve:
            groups.setdefault(tuple(axis_value(c, a) for a in sweep.scientific), []).append(c)
    if all(len(g) == 1 for g in groups.values()):  # nothing to group: one figure, every cell
        groups = {(): [c for g in groups.values() for c in g]}
    paths = []
    for key, members in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for c in members:
            steps, losses = zip(*c.valid_curve)
            label = cell_label(c, sweep.nuisance) if sweep.nuisance and key else \
                cell_label(c, sweep.axes)
            ls = "--" if c.status in UNTRAINED else "-"
            ax.plot(steps, losses, ls, marker=".", label=f"{label} ({c.status})")
        ax.set_xlabel("update")
        ax.set_ylabel("valid loss")
        facet = " ".join(f"{a}={v}" for a, v in zip(sweep.scientific, key)) if key else ""
        ax.set_title(facet or "validation curves", fontsize=9)
        ax.legend(fontsize=6)
        fig.tight_layout()
        path = out_dir / f"curves_{_slug(facet)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------
# entry point


def write_report(sweep: Sweep, metric: str = "best_valid_loss", out_dir: Optional[Path] = None,
                 plots: bool = True) -> dict[str, Any]:
    """Write report.md, report.csv and the plots into out_dir (default: the sweep dir)."""
    out_dir = Path(out_dir or sweep.root)
    out_dir.mkdir(parents=True, exist_ok=True)
    images: list[Path] = []
    if plots:
        images = plot_heatmaps(sweep, metric, out_dir) + plot_curves(sweep, out_dir)
    write_csv(sweep, out_dir / "report.csv")
    (out_dir / "report.md").write_text(render_markdown(sweep, metric, images))
    return {"markdown": out_dir / "report.md", "csv": out_dir / "report.csv", "images": images}


def default_metric(sweep: Sweep) -> str:
    ok = [c for c in sweep.cells if c.status == OK]
    return "bleu" if ok and all(c.value("bleu") is not None for c in ok) else "best_valid_loss"
