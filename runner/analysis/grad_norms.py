"""`deepinit analyze grad-norms`: the Admin paper's Fig. 3 (section 3.1). At initialization,
one backward of the training loss on a fixed batch; for every sublayer output x_i the norm
||dL/dx_i||_2, shown relative to the largest norm in the same stack (encoder or decoder).
The paper's finding: only the Post-LN decoder loses gradient, and the drop happens from the
encoder-attention outputs to their inputs (the self-attention outputs)."""
from __future__ import annotations

import math
from pathlib import Path

from rich.table import Table

from runner.analysis import common
from runner.analysis.hooks import SublayerRecorder


def measure(model, cfg, batch) -> dict:
    """Absolute and relative gradient norms per sublayer output, in forward order, per stack."""
    model.eval()  # no dropout: the measurement depends on W and x0 only
    model.zero_grad(set_to_none=True)
    with SublayerRecorder(model, keep=("grad_out",)) as rec:
        loss = common.loss_of(model, cfg, batch)
        loss.backward()
    model.zero_grad(set_to_none=True)
    out = {"loss": float(loss.detach())}
    for side in ("encoder", "decoder"):
        rows = [{"layer": r.ref.layer, "kind": r.ref.kind, "name": r.ref.name,
                 "norm": float(r.grad_out.norm())} for r in rec.side(side)]
        top = max(row["norm"] for row in rows)
        for row in rows:
            row["relative"] = row["norm"] / top if top > 0 else 0.0
        out[side] = rows
    out["decoder_drop"] = decoder_drop(out["decoder"])
    out["encoder_bottom_over_top"] = bottom_over_top(out["encoder"])
    return out


def decoder_drop(rows: list[dict]) -> dict:
    """The paper's pattern in two numbers: across each decoder layer, ||dL/d self-attn out|| /
    ||dL/d encoder-attn out|| (the backprop step through encoder attention; < 1 is a drop),
    its geometric mean over layers, and the smallest relative norm in the decoder."""
    by_layer: dict[int, dict[str, float]] = {}
    for row in rows:
        by_layer.setdefault(row["layer"], {})[row["kind"]] = row["norm"]
    ratios = [v["self_attn"] / v["cross_attn"] for _, v in sorted(by_layer.items())
              if v.get("cross_attn", 0) > 0]

    geo = math.exp(sum(math.log(max(r, 1e-30)) for r in ratios) / len(ratios)) if ratios else None
    return {"self_over_cross": ratios, "geomean_self_over_cross": geo,
            "min_relative": min(r["relative"] for r in rows),
            "bottom_over_top": bottom_over_top(rows)}


def bottom_over_top(rows: list[dict]) -> float:
    """||dL/dx|| at the lowest sublayer output over the topmost: < 1 means the gradient shrinks
    on its way down (vanishing), >= 1 that it does not."""
    return rows[0]["norm"] / rows[-1]["norm"] if rows[-1]["norm"] > 0 else float("inf")


def run(settings: list[common.Setting], depth: int | None, seeds: list[int], sentences: int,
        progress=None) -> dict:
    out = {"depth": depth, "seeds": seeds, "sentences": sentences, "settings": []}
    for setting in settings:
        cfg = common.for_depth(setting, [] if depth is None else [f"model.layers={depth}"])
        batch = common.input_batch(cfg, sentences)
        per_seed = []
        for seed in seeds:
            per_seed.append(measure(common.fresh_model(cfg, seed), cfg, batch))
            if progress:
                progress(f"{setting.label} seed={seed}")
        entry = {"label": setting.label, "overrides": setting.overrides,
                 "layers": cfg.model.num_encoder_layers, "per_seed": per_seed}
        # The plotted bars: relative norms averaged over seeds.
        for side in ("encoder", "decoder"):
            rows = []
            for i, row in enumerate(per_seed[0][side]):
                rel = [s[side][i]["relative"] for s in per_seed]
                rows.append({"name": row["name"], "layer": row["layer"], "kind": row["kind"],
                             "relative": sum(rel) / len(rel)})
            entry[side] = rows
        entry["decoder_drop"] = decoder_drop([
            {**r, "norm": sum(s["decoder"][i]["norm"] for s in per_seed) / len(per_seed)}
            for i, r in enumerate(entry["decoder"])])
        entry["encoder_min_relative"] = min(r["relative"] for r in entry["encoder"])
        enc = entry["encoder"]
        entry["encoder_bottom_over_top"] = enc[0]["relative"] / enc[-1]["relative"]
        out["settings"].append(entry)
    return out


COLOURS = {"self_attn": "tab:blue", "cross_attn": "tab:red", "ffn": "tab:green"}


def plot(result: dict, path: Path) -> None:
    plt = common.pyplot()
    n = len(result["settings"])
    fig, axes = plt.subplots(n, 2, figsize=(11, 2.6 * n), squeeze=False)
    for row_axes, entry in zip(axes, result["settings"]):
        for ax, side in zip(row_axes, ("encoder", "decoder")):
            rows = entry[side]
            xs = range(len(rows))
            ax.bar(xs, [r["relative"] for r in rows],
                   color=[COLOURS[r["kind"]] for r in rows], width=0.85)
            ax.set_yscale("log")
            ax.set_ylim(min(0.5, min(r["relative"] for r in rows) * 0.5), 1.5)
            ax.set_title(f"{entry['label']}: {side}", fontsize=9)
            starts = [i for i, r in enumerate(rows) if i == 0 or r["layer"] != rows[i - 1]["layer"]]
            step = max(1, len(starts) // 12)
            ax.set_xticks(starts[::step], [str(rows[i]["layer"] + 1) for i in starts[::step]],
                          fontsize=7)
            ax.set_xlabel("layer (its sublayer outputs in forward order, bottom to top)",
                          fontsize=8)
            ax.set_ylabel("‖∂L/∂x‖ / max", fontsize=8)
            ax.grid(alpha=0.3, axis="y")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    fig.legend(handles, ["self-attention", "encoder-attention", "FFN"], loc="upper right",
               fontsize=8)
    fig.suptitle("Relative gradient norm of sublayer outputs at initialization (Admin Fig. 3)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.9, 0.97))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def summary(result: dict):
    table = Table(title="gradient norms of sublayer outputs at init (relative to each stack's max)",
                  title_justify="left")
    for col in ("config", "encoder bottom/top", "decoder bottom/top", "decoder min",
                "decoder self/enc-attn (geo. mean)"):
        table.add_column(col)
    for entry in result["settings"]:
        drop = entry["decoder_drop"]
        table.add_row(entry["label"], f"{entry['encoder_bottom_over_top']:.3f}",
                      f"{drop['bottom_over_top']:.3f}", f"{drop['min_relative']:.3f}",
                      f"{drop['geomean_self_over_cross']:.3f}")
    return [table]
