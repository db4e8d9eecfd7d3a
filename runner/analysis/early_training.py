"""`deepinit analyze early-training`: T-Fixup's Figs. 2 and 3a/b (section 3). Over the first K
updates of training, once with learning-rate warmup and once without (same model, same data
order, everything else as the configuration says):

  * the encoder input-embedding gradient: dL/dE for the token rows of the batch, through the
    encoder's lookup only (the table may be tied to the decoder and output projection; their
    gradient is left out), as a log-scale histogram per update (Fig. 2 left);
  * the optimizer's update of the input-embedding table, W_after - W_before, non-zero entries,
    as a log-scale histogram per update (Fig. 2 right);
  * the average L2 norm (over real target tokens) of the input to the layer norm after each
    decoder self-attention, i.e. omega*x + alpha*a of that sublayer (Fig. 3a/b). With Pre-LN or
    no LN this is the residual stream at the same place.

Each update is the train loop's own `Trainer.step` (same lr schedule, loss, clipping, optimizer
and batch order), on the padded layout, without checkpoints or validation; the measurements are
a callback."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import torch
from rich.table import Table

from runner.analysis import common
from runner.analysis.hooks import EncoderEmbeddingGrad, SublayerRecorder
from runner.config import Config
from runner.console import fmt
from runner.run.build import build_run, check_config
from runner.train.loop import Callback, StepOutput, Trainer

# log10|value| bins of the histograms: T-Fixup's Fig. 2 spans about 1e-12 .. 1.
BINS = np.linspace(-12.0, 1.0, 66)


def _histogram(values: torch.Tensor) -> tuple[list[int], dict]:
    mags = values.detach().abs().reshape(-1).double()
    nonzero = mags[mags > 0]
    logs = torch.log10(nonzero).numpy() if nonzero.numel() else np.zeros(0)
    counts, _ = np.histogram(np.clip(logs, BINS[0], BINS[-1]), bins=BINS)
    stats = {"zeros": int(mags.numel() - nonzero.numel()), "count": int(mags.numel())}
    if nonzero.numel():
        q = np.quantile(nonzero.numpy(), [0.1, 0.5, 0.9])
        stats.update(p10=float(q[0]), median=float(q[1]), p90=float(q[2]),
                     max=float(nonzero.max()), rms=float(mags.pow(2).mean().sqrt()))
    return counts.tolist(), stats


def arm_config(cfg: Config, warmup: int, updates: int) -> Config:
    """One arm: the configuration with this warmup, trained on the padded layout (the probes
    read per-position activations) without activation checkpointing (hooks fire once)."""
    cfg = copy.deepcopy(cfg)
    cfg.warmup.updates = warmup
    cfg.trainer.max_updates = max(cfg.trainer.max_updates, warmup, updates)
    cfg.trainer.unpad = False
    cfg.trainer.device = "cpu"
    # one micro-batch per update in fp32, eager: the probes read one forward's activations
    cfg.trainer.update_freq = 1
    cfg.trainer.precision = "fp32"
    cfg.trainer.compile = False
    cfg.trainer.threads = 0  # leave torch's thread count to `deepinit analyze --threads`
    cfg.model.activation_checkpointing = False
    check_config(cfg)
    return cfg


class EarlyTrainingProbe(Callback):
    """Per update: the encoder embedding gradient and the optimizer's update of the table as
    histograms, and the decoder self-attention LN-input norms of that update's forward."""

    def __init__(self, model):
        self.model = model
        self.table = model.embedding_tables()["encoder"]
        self.steps: list[dict] = []

    def on_step_start(self, trainer: Trainer) -> None:
        self.recorder = SublayerRecorder(self.model, keep=("sum_in",)).__enter__()
        self.embedding = EncoderEmbeddingGrad(self.model).__enter__()
        self.before = self.table.detach().clone()

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        self.recorder.__exit__(None, None, None)
        self.embedding.__exit__(None, None, None)
        tgt_keep = out.batches[0].target != self.model.pad_index
        ln_norms = [float(r.sum_in[tgt_keep].norm(dim=-1).mean())
                    for r in self.recorder.side("decoder") if r.ref.kind == "self_attn"]
        grad_counts, grad_stats = _histogram(self.embedding.grad_rows)
        update_counts, update_stats = _histogram(self.table.detach() - self.before)
        self.steps.append({"step": trainer.state.step, "lr": out.lr,
                           "loss": float(out.loss_per_token), "grad_norm": float(out.grad_norm),
                           "ln_input_norms": ln_norms,
                           "embedding_grad": grad_stats, "embedding_grad_hist": grad_counts,
                           "adam_update": update_stats, "adam_update_hist": update_counts})


def train_arm(cfg: Config, updates: int) -> dict:
    """K updates of the train loop's own step from the configured init, with the probe."""
    parts = build_run(cfg, data=common.data_for(cfg))
    probe = EarlyTrainingProbe(parts.model)
    trainer = Trainer(parts, [probe])
    parts.model.train()
    for _ in range(updates):
        trainer.step()
        if not math.isfinite(probe.steps[-1]["loss"]):
            break
    return {"steps": probe.steps}


def run(settings: list[common.Setting], updates: int, warmup_updates: int,
        progress=None) -> dict:
    out = {"updates": updates, "warmup_updates": warmup_updates, "bins_log10": BINS.tolist(),
           "settings": []}
    for setting in settings:
        base = common.for_depth(setting, [])
        entry = {"label": setting.label, "overrides": setting.overrides, "arms": {}}
        for arm, warmup in (("warmup", warmup_updates), ("no_warmup", 0)):
            cfg = arm_config(base, warmup, updates)
            entry["arms"][arm] = {"warmup_updates": warmup, "peak_lr": cfg.optim.lr,
                                  **train_arm(cfg, updates)}
            if progress:
                progress(f"{setting.label} {arm}")
        out["settings"].append(entry)
    return out


ARMS = ("warmup", "no_warmup")


def plot_histograms(result: dict, path: Path) -> None:
    """Rows: configurations; columns: gradient and update, each with and without warmup."""
    plt = common.pyplot()
    n = len(result["settings"])
    fig, axes = plt.subplots(n, 4, figsize=(15, 2.9 * n), squeeze=False, sharey=True)
    bins = np.array(result["bins_log10"])
    panels = [(key, title, arm) for key, title in (("embedding_grad_hist", "input-emb. gradient"),
                                                   ("adam_update_hist", "optimizer update"))
              for arm in ARMS]
    for row_axes, entry in zip(axes, result["settings"]):
        for ax, (key, title, arm) in zip(row_axes, panels):
            steps = entry["arms"][arm]["steps"]
            counts = np.array([st[key] for st in steps], dtype=float).T
            ax.imshow(np.log1p(counts), aspect="auto", origin="lower", cmap="magma",
                      extent=(0.5, len(steps) + 0.5, bins[0], bins[-1]))
            ax.set_title(f"{entry['label']}, {arm.replace('_', ' ')}: {title}", fontsize=8)
            ax.set_xlabel("update", fontsize=8)
        row_axes[0].set_ylabel("log10 |value|", fontsize=8)
    fig.suptitle("Encoder input embeddings over the first updates (T-Fixup Fig. 2)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=48)
    plt.close(fig)


def plot_ln_norms(result: dict, path: Path) -> None:
    plt = common.pyplot()
    n = len(result["settings"])
    fig, axes = plt.subplots(n, 2, figsize=(10, 3.2 * n), squeeze=False, sharey="row")
    for row_axes, entry in zip(axes, result["settings"]):
        for ax, arm in zip(row_axes, ARMS):
            steps = entry["arms"][arm]["steps"]
            norms = np.array([st["ln_input_norms"] for st in steps])
            for layer in range(norms.shape[1]):
                ax.plot(range(1, len(steps) + 1), norms[:, layer], label=f"layer {layer + 1}")
            ax.set_title(f"{entry['label']}, {arm.replace('_', ' ')}", fontsize=9)
            ax.set_xlabel("update", fontsize=8)
            ax.set_ylabel("‖LN input‖₂ after dec. self-attn", fontsize=8)
            ax.grid(alpha=0.3)
        row_axes[1].legend(fontsize=6, ncol=2)
    fig.suptitle("Decoder LN-input norms over the first updates (T-Fixup Fig. 3a/b)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=60)
    plt.close(fig)


def arm_summary(arm: dict) -> dict:
    steps = arm["steps"]
    first, last = steps[0], steps[-1]
    return {
        "grad_median_first": first["embedding_grad"].get("median"),
        "grad_median_last": last["embedding_grad"].get("median"),
        "grad_median_min": min((st["embedding_grad"]["median"] for st in steps
                                if "median" in st["embedding_grad"]), default=None),
        "update_median_first": first["adam_update"].get("median"),
        "update_median_max": max((st["adam_update"]["median"] for st in steps
                                  if "median" in st["adam_update"]), default=None),
        "ln_norm_first": first["ln_input_norms"], "ln_norm_last": last["ln_input_norms"],
        "ln_norm_max": [max(st["ln_input_norms"][i] for st in steps)
                        for i in range(len(first["ln_input_norms"]))],
        "loss_first": first["loss"], "loss_last": last["loss"],
    }


def summary(result: dict):
    table = Table(title=f"first {result['updates']} updates (medians of |value|; LN norm of the "
                        "top decoder layer)", title_justify="left")
    for col in ("config", "arm", "emb. grad first→min→last", "update first / max",
                "LN norm first→max→last",
                "loss first→last"):
        table.add_column(col)
    for entry in result["settings"]:
        for arm in ARMS:
            s = arm_summary(entry["arms"][arm])
            entry["arms"][arm]["summary"] = s
            table.add_row(entry["label"], arm,
                          f"{fmt(s['grad_median_first'], '.2e')} → {fmt(s['grad_median_min'], '.2e')} → "
                          f"{fmt(s['grad_median_last'], '.2e')}",
                          f"{fmt(s['update_median_first'], '.2e')} / {fmt(s['update_median_max'], '.2e')}",
                          f"{s['ln_norm_first'][-1]:.2f} → {s['ln_norm_max'][-1]:.2f} → "
                          f"{s['ln_norm_last'][-1]:.2f}",
                          f"{s['loss_first']:.2f} → {s['loss_last']:.2f}")
    return [table]
