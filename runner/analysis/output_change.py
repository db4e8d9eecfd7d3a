"""`deepinit analyze output-change`: the Admin paper's Fig. 4 (section 4.2, Theorem 2,
Corollaries 1-2). For each configuration and depth N, at initialization,

    change = |F(x0, W) - F(x0, W*)|_2^2  (squared L2 over the hidden dimension, averaged over the
                                          real tokens of a fixed input batch x0)

with F the encoder output (the paper's figure; the decoder's final hidden state is recorded
too), and W* = W + delta where
  random: delta = eps * std(W_k) * N(0, 1) for every weight tensor W_k inside a residual branch
          (the W_i of Theorem 2; delta independent of W; tensors with zero spread, i.e. the zero
          biases at init, are left alone), or
  adam:   delta = one update of the configured optimizer (fairseq Adam by default) at the peak
          lr optim.lr on the training loss of x0, all trainable parameters, taken by the train
          loop's own update function (clipping, the loss scaler, the init scheme's hook).
Models are in eval mode (no dropout) so the only difference between F and F* is W*-W.
Averaged over seeds (each seed = a fresh init and a fresh random delta), then fitted against N
and log N with R^2 (fits.py)."""
from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import torch
from rich.table import Table

from runner import init as init_schemes
from runner.analysis import common
from runner.analysis.fits import fit_laws
from runner.train.loop import loss_scaler, optimizer_update
from runner.train.optim import build_optimizer, set_lr

KINDS = ("random", "adam")
OUTPUTS = ("encoder", "decoder")


def _outputs(model, batch) -> dict[str, torch.Tensor]:
    """Encoder output and decoder final hidden state (before the output projection), real
    tokens only, as (tokens, dim)."""
    captured = {}
    # ResiDual's stack output is alpha * x_N + LN(d_N), computed by its `dual` module
    last = model.decoder.final_norm if model.decoder.dual is None else model.decoder.dual
    handle = last.register_forward_hook(
        lambda m, a, out: captured.__setitem__("decoder", out.detach()))
    try:
        with torch.no_grad():
            memory, mask = model.encode(batch.src_tokens, batch.src_has_pad)
            model.decode(batch.prev_tokens, memory, mask)
    finally:
        handle.remove()
    src_keep = batch.src_tokens != model.pad_index
    tgt_keep = batch.target != model.pad_index
    return {"encoder": memory[src_keep], "decoder": captured["decoder"][tgt_keep]}


def change(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float(((a[k] - b[k]) ** 2).sum(-1).mean()) for k in OUTPUTS}


def perturb_branches(model, eps: float, generator: torch.Generator) -> int:
    """W <- W + eps * std(W) * noise for every parameter tensor inside a residual branch.
    Returns how many tensors were perturbed."""
    count = 0
    with torch.no_grad():
        for ref in model.sublayers():
            for p in ref.module.branch.parameters():
                std = float(p.std()) if p.numel() > 1 else 0.0
                if std > 0:
                    p.add_(torch.randn(p.shape, generator=generator) * (eps * std))
                    count += 1
    return count


def adam_step(model, cfg, batch, lr: float) -> float:
    """The first optimizer update on the loss of `batch`, through the train loop's own update
    (runner/train/loop.py optimizer_update: the loss scaler, clipping, the optimizer step and the
    init scheme's per-update hook), in fp32 on the CPU. Returns the loss before the update."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(model.parameters(), cfg, "cpu", init_schemes.param_groups(model, cfg))
    set_lr(optimizer, lr)
    loss = common.loss_of(model, cfg, batch)
    loss.backward()
    clip = cfg.optim.clip_norm if cfg.optim.clip_norm > 0 else float("inf")
    optimizer_update(model, optimizer, params, clip, loss_scaler("fp32"), None,
                     init_schemes.update_hook(cfg), 1)
    return float(loss.detach())


def measure(cfg, seed: int, batch, eps: float, lr: float | None) -> dict:
    """Both output changes for one freshly initialized model."""
    model = common.fresh_model(cfg, seed)
    model.eval()
    base = _outputs(model, batch)
    noisy = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(10_000 + seed)
    perturbed = perturb_branches(noisy, eps, generator)
    result = {"random": change(base, _outputs(noisy, batch)), "perturbed_tensors": perturbed}
    stepped = copy.deepcopy(model)
    loss = adam_step(stepped, cfg, batch, cfg.optim.lr if lr is None else lr)
    result["adam"] = change(base, _outputs(stepped, batch))
    result["loss"] = loss
    return result


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)
    return mean, math.sqrt(var)


def run(settings: list[common.Setting], depths: list[int], seeds: list[int], eps: float,
        sentences: int, lr: float | None = None, progress=None) -> dict:
    """The numbers of Fig. 4 for each setting: per depth, per seed and averaged, plus fits."""
    out = {"eps": eps, "sentences": sentences, "depths": depths, "seeds": seeds,
           "lr": lr, "settings": []}
    for setting in settings:
        entry = {"label": setting.label, "overrides": setting.overrides, "per_depth": []}
        for depth in depths:
            cfg = common.for_depth(setting, [f"model.layers={depth}"])
            batch = common.input_batch(cfg, sentences)
            runs = []
            for seed in seeds:
                t0 = time.perf_counter()
                runs.append(measure(cfg, seed, batch, eps, lr))
                if progress:
                    progress(f"{setting.label} N={depth} seed={seed} "
                             f"({time.perf_counter() - t0:.1f}s)")
            row = {"N": depth, "runs": runs}
            for kind in KINDS:
                for name in OUTPUTS:
                    mean, std = _mean_std([r[kind][name] for r in runs])
                    row[f"{kind}_{name}"] = {"mean": mean, "std": std}
            entry["per_depth"].append(row)
        entry["fits"] = {}
        if len(depths) >= 2:
            for kind in KINDS:
                for name in OUTPUTS:
                    values = [row[f"{kind}_{name}"]["mean"] for row in entry["per_depth"]]
                    entry["fits"][f"{kind}_{name}"] = fit_laws(depths, values)
        out["settings"].append(entry)
    return out


def plot(result: dict, path: Path, output: str = "encoder") -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, kind in zip(axes, KINDS):
        for entry in result["settings"]:
            depths = [row["N"] for row in entry["per_depth"]]
            means = [row[f"{kind}_{output}"]["mean"] for row in entry["per_depth"]]
            stds = [row[f"{kind}_{output}"]["std"] for row in entry["per_depth"]]
            fit = entry["fits"].get(f"{kind}_{output}")
            label = entry["label"]
            if fit:
                label += (f"  R²(N)={fit['N']['r2']:.2f} R²(logN)={fit['logN']['r2']:.2f}"
                          + (f" p={fit['power']['exponent']:.2f}" if fit["power"] else ""))
            ax.errorbar(depths, means, yerr=stds, marker="o", capsize=3, label=label)
        # Linear N axis: a law linear in N is then a straight line, a log N law bends over.
        ax.set_xticks(result["depths"])
        if kind == "adam":
            ax.set_yscale("log")
        ax.set_xlabel("N (layers per stack)")
        ax.set_ylabel(f"|F - F*|² ({output} output, per token)")
        ax.set_title("W* = W + random perturbation" if kind == "random"
                     else "W* = W + one Adam update")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Output change at initialization (Admin Fig. 4); eps={result['eps']}, "
                 f"{len(result['seeds'])} seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def summary(result: dict):
    table = Table(title="output change |F-F*|² (encoder output, mean over seeds)",
                  title_justify="left")
    for col in ("config", "N", "random", "adam"):
        table.add_column(col, justify="right" if col != "config" else "left")
    for entry in result["settings"]:
        for row in entry["per_depth"]:
            table.add_row(entry["label"], str(row["N"]), f"{row['random_encoder']['mean']:.4g}",
                          f"{row['adam_encoder']['mean']:.4g}")
    fits = Table(title="least-squares fits (encoder output)", title_justify="left")
    for col in ("config", "kind", "R² vs N", "R² vs log N", "exponent p (y~N^p)"):
        fits.add_column(col)
    for entry in result["settings"]:
        for kind in KINDS:
            fit = entry["fits"].get(f"{kind}_encoder")
            if fit:
                fits.add_row(entry["label"], kind, f"{fit['N']['r2']:.3f}",
                             f"{fit['logN']['r2']:.3f}",
                             f"{fit['power']['exponent']:.2f}" if fit["power"] else "-")
    return [table, fits]
