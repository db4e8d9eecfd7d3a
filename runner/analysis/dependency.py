"""`deepinit analyze dependency`: the Admin paper's layer dependency beta_{i,j} (section 4.1,
Figs. 7 and 8).

The paper writes each normalized sublayer output as a mix of normalized residual-branch
outputs, x_i/sqrt(Var x_i) = sum_{j<=i} beta_{i,j} a_j/sqrt(Var a_j), so beta_{i,j} is the share
of branch j's output in layer i's output, with every norm's scaling folded in. We compute it
exactly rather than by the paper's variance approximation: given the norm statistics of the
actual forward pass, every norm is affine in its input (LayerNorm: centre, divide by the
per-token sigma, times gamma, plus nu; RMSNorm: divide by the per-token rms, times gamma), and
the residual sum is omega*x + alpha*a. So the stream splits into one additive component per
source: the stack input (embedding), each branch output a_j, and the norms' biases. The
components sum to the real output (checked: `reconstruction_error`), and

    beta_{i,j} = std(component of a_j in x_i) / std(x_i)     (over the real tokens' elements)

For Pre-LN this is exactly the paper's sqrt(Var a_j) / sqrt(Var sum_{k<=i} a_k) (plus the
embedding in the sum); branch outputs a_j are taken after branch_norm and dropout, before the
layer's alpha, so ReZero's alpha = 0 shows as beta = 0."""
from __future__ import annotations

from pathlib import Path

import torch
from rich.table import Table
from torch import nn

from runner.analysis import common
from runner.analysis.hooks import SublayerRecorder
from runner.model.norms import RMSNorm, ScaleNorm


def _apply_norm(norm: nn.Module, z: torch.Tensor, comps: dict[str, torch.Tensor]) -> None:
    """Push every component through `norm` linearised at its actual input z (in place)."""
    if isinstance(norm, nn.Identity):
        return
    if isinstance(norm, nn.LayerNorm):
        sigma = torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + norm.eps)
        gamma = norm.weight if norm.weight is not None else 1.0
        for k, v in comps.items():
            comps[k] = (v - v.mean(-1, keepdim=True)) / sigma * gamma
        if norm.bias is not None:
            comps["bias"] = comps.get("bias", torch.zeros_like(z)) + norm.bias
        return
    if isinstance(norm, RMSNorm):
        rms = torch.sqrt(z.pow(2).mean(-1, keepdim=True) + norm.eps)
        for k, v in comps.items():
            comps[k] = v / rms * norm.weight
        return
    if isinstance(norm, ScaleNorm):
        length = torch.linalg.vector_norm(z, dim=-1, keepdim=True).clamp(min=norm.eps)
        for k, v in comps.items():
            comps[k] = v / length * norm.weight
        return
    raise TypeError(f"dependency: no linearisation for {type(norm).__name__}")


def _std(t: torch.Tensor, keep: torch.Tensor) -> float:
    return float(t[keep].float().std(unbiased=False))


@torch.no_grad()
def decompose(records, keep: torch.Tensor) -> dict:
    """beta matrix (rows: sublayer outputs i, columns: branches j <= i) for one stack, plus the
    share of the stack input and of the norms' biases, and the reconstruction error."""
    first = records[0]
    comps: dict[str, torch.Tensor] = {"input": first.x_in.clone()}
    names = [r.ref.name for r in records]
    beta = [[0.0] * len(records) for _ in records]
    input_share, bias_share, worst = [], [], 0.0
    for i, rec in enumerate(records):
        sub = rec.ref.module
        omega, alpha = sub.omega.detach(), rec.ref.alpha.detach()
        for k in comps:
            comps[k] = comps[k] * omega
        comps[rec.ref.name] = rec.branch * alpha
        _apply_norm(sub.post_norm, rec.sum_in, comps)
        total = sum(comps.values())
        scale = float(rec.out[keep].abs().max()) or 1.0
        worst = max(worst, float((total - rec.out)[keep].abs().max()) / scale)
        sd = _std(rec.out, keep)
        for j in range(i + 1):
            beta[i][j] = _std(comps[names[j]], keep) / sd
        input_share.append(_std(comps["input"], keep) / sd)
        bias_share.append(_std(comps["bias"], keep) / sd if "bias" in comps else 0.0)
    return {"names": names, "beta": beta, "input": input_share, "bias": bias_share,
            "reconstruction_error": worst}


@torch.no_grad()
def measure(model, batch) -> dict:
    """beta for the encoder and the decoder of `model` on `batch` (eval mode)."""
    model.eval()
    if any(getattr(layer, "bottom_to_top", False)
           for layer in [*model.encoder.layers, *model.decoder.layers]):
        raise TypeError("dependency: no decomposition of the B2T shortcut (norm=b2t)")
    with SublayerRecorder(model, keep=("x_in", "branch", "sum_in", "out")) as rec:
        model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad)
    src_keep = (batch.src_tokens != model.pad_index)
    tgt_keep = (batch.target != model.pad_index)
    out = {"encoder": decompose(rec.side("encoder"), src_keep),
           "decoder": decompose(rec.side("decoder"), tgt_keep)}
    for side in ("encoder", "decoder"):
        out[side].update(diagonal_stats(out[side]["beta"]))
    return out


def diagonal_stats(beta: list[list[float]]) -> dict:
    """Mean beta_{i,i} (dependency on the own branch) and mean beta_{i,j<i}."""
    n = len(beta)
    diag = [beta[i][i] for i in range(n)]
    off = [beta[i][j] for i in range(n) for j in range(i)]
    return {"mean_diagonal": sum(diag) / n, "mean_off_diagonal": sum(off) / len(off) if off else 0.0}


def run(settings: list[common.Setting], depth: int | None, seed: int | None, sentences: int,
        progress=None) -> dict:
    """beta at initialization for each setting; for a run folder also at each checkpoint."""
    out = {"depth": depth, "sentences": sentences, "settings": []}
    for setting in settings:
        cfg = common.for_depth(setting, [] if depth is None or setting.run_dir
                               else [f"model.layers={depth}"])
        batch = common.input_batch(cfg, sentences)
        stages = [("init", 0, common.fresh_model(cfg, seed if setting.run_dir is None else None))]
        for path in setting.checkpoints:
            model, step = common.model_from_checkpoint(cfg, path)
            stages.append((f"update {step}", step, model))
        entry = {"label": setting.label, "overrides": setting.overrides,
                 "run_dir": setting.run_dir, "stages": []}
        for name, step, model in stages:
            entry["stages"].append({"stage": name, "step": step, **measure(model, batch)})
            if progress:
                progress(f"{setting.label} {name}")
        out["settings"].append(entry)
    return out


def plot(result: dict, path: Path) -> None:
    """Checkpoints: one row per (configuration, stack), one column per stage (init, then
    checkpoints). Initialization only: one row per configuration, encoder and decoder."""
    plt = common.pyplot()
    cols = max(len(entry["stages"]) for entry in result["settings"])
    if cols == 1:
        cols = 2
        rows = [[(entry, entry["stages"][0], side) for side in ("encoder", "decoder")]
                for entry in result["settings"]]
    else:
        rows = [[(entry, stage, side) for stage in entry["stages"]]
                for entry in result["settings"] for side in ("encoder", "decoder")]
    fig, axes = plt.subplots(len(rows), cols, figsize=(3.3 * cols + 0.6, 3.1 * len(rows)),
                             squeeze=False)
    image = None
    for row_axes, panels in zip(axes, rows):
        for ax in row_axes[len(panels):]:
            ax.axis("off")
        for ax, (entry, stage, side) in zip(row_axes, panels):
            beta = torch.tensor(stage[side]["beta"])
            masked = beta.masked_fill(torch.ones_like(beta).triu(1).bool(), float("nan"))
            image = ax.imshow(masked.numpy(), cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"{entry['label']} @ {stage['stage']}: {side}\n"
                         f"mean β_ii={stage[side]['mean_diagonal']:.2f}, "
                         f"β_i,j<i={stage[side]['mean_off_diagonal']:.2f}", fontsize=8)
            ax.set_xlabel("branch j", fontsize=7)
            ax.set_ylabel("sublayer output i", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.suptitle("Layer dependency β_ij (Admin Figs. 7/8)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.93, 0.98))
    if image is not None:
        fig.colorbar(image, cax=fig.add_axes((0.945, 0.3, 0.012, 0.4)))
    fig.savefig(path, dpi=60)
    plt.close(fig)


def summary(result: dict):
    table = Table(title="layer dependency beta (mean own-branch beta_ii vs earlier branches)",
                  title_justify="left")
    for col in ("config", "stage", "enc β_ii", "enc β_i,j<i", "dec β_ii", "dec β_i,j<i",
                "recon. err"):
        table.add_column(col)
    for entry in result["settings"]:
        for stage in entry["stages"]:
            e, d = stage["encoder"], stage["decoder"]
            table.add_row(entry["label"], stage["stage"], f"{e['mean_diagonal']:.3f}",
                          f"{e['mean_off_diagonal']:.3f}", f"{d['mean_diagonal']:.3f}",
                          f"{d['mean_off_diagonal']:.3f}",
                          f"{max(e['reconstruction_error'], d['reconstruction_error']):.1e}")
    return [table]
