"""`deepinit analyze mode-gap CHECKPOINT`: is a run's train/valid loss gap the model's train/eval
mode (dropout) or the data?

The label-smoothed loss per target token of one checkpoint on the same first batches of train
and valid, with the model in eval mode (dropout off, as validation runs) and in train mode
(dropout on, as the logged training loss), under one fixed dropout seed. Post-LN without warmup
(results/table2/real/postln-no-warmup-mode-gap.json) scores the same on both splits in each mode:
the gap is the mode, not overfitting.
"""
from __future__ import annotations

from pathlib import Path

import torch

from runner.config import config_from_dict
from runner.data.batching import collate
from runner.init import options_class
from runner.model.loss import label_smoothed_nll
from runner.model.sublayer import norm_options_class
from runner.run import folder
from runner.run.build import build_run

PROBE_SEED = 0  # the dropout masks of train mode


def run(checkpoint: Path, batches: int = 8) -> dict:
    """{"checkpoint", "batches", "loss_per_token": {"train/eval", "train/train", "valid/eval",
    "valid/train"}} for the checkpoint's own config, on one CPU thread."""
    state = folder.load_checkpoint(checkpoint)
    cfg = config_from_dict(state["config"], options_class, norm_options_class)
    cfg.trainer.device, cfg.trainer.threads = "cpu", 1
    parts = build_run(cfg, initialize=False)
    parts.model.load_state_dict(state["model"])
    pad, eos = parts.pad, parts.eos
    out = {}
    splits = (("train", parts.train_split, parts.batches), ("valid", parts.valid_split, parts.valid_batches))
    for split_name, split, split_batches in splits:
        for mode in ("eval", "train"):
            torch.manual_seed(PROBE_SEED)
            parts.model.train(mode == "train")
            loss_sum = tokens = 0.0
            with torch.no_grad():
                for idx in split_batches[:batches]:
                    b = collate(split, idx, pad, eos)
                    logits = parts.model(b.src_tokens, b.prev_tokens, b.src_has_pad)
                    loss, _ = label_smoothed_nll(logits, b.target, cfg.trainer.label_smoothing, pad)
                    loss_sum += float(loss)
                    tokens += b.ntokens
            out[f"{split_name}/{mode}"] = loss_sum / tokens
    return {"checkpoint": str(checkpoint), "batches": batches, "loss_per_token": out}
