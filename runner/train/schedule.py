"""Learning rate as a pure function of the update count (fairseq lr_scheduler semantics:
the lr used for update k+1 is lr_at(k))."""
from __future__ import annotations

import math


def lr_at(step: int, cfg) -> float:
    """cfg: the full config (optim.lr, warmup.*, schedule.*, trainer.max_updates)."""
    peak = cfg.optim.lr
    warmup, init_lr = cfg.warmup.updates, cfg.warmup.init_lr
    if step < warmup:
        return init_lr + step * (peak - init_lr) / warmup
    name = cfg.schedule.name
    if name == "constant":
        return peak
    if name == "inverse_sqrt":
        if warmup > 0:
            return peak * math.sqrt(warmup / step)
        # T-Fixup's inverse_sqrt_nowarmup (layer6ai-labs/T-Fixup,
        # fairseq/optim/lr_scheduler/inverse_sqrt_nowarmup_schedule.py):
        # lr(D) = lr/sqrt(2), lr(3D) = lr/2.
        decay = cfg.schedule.decay_period
        return peak * math.sqrt(decay / (decay + step))
    if name == "linear":
        # Linear decay from peak at the end of warmup to min_lr at max_updates (Transformer-Clinic
        # radam_fairseq/linear_schedule.py; warmup.updates=1 + init_lr=1e-7 reproduces the recipe
        # exactly).
        total, min_lr = cfg.trainer.max_updates, cfg.schedule.min_lr
        span = max(total - warmup, 1)
        return (peak - min_lr) * max(0.0, 1.0 - (step - warmup) / span) + min_lr
    if name == "cosine":
        # Half a cosine from peak at the end of warmup to min_lr at max_updates (karpathy/nanoGPT
        # train.py get_lr, lr_decay_iters = max_iters as its shakespeare_char config sets them).
        total, min_lr = cfg.trainer.max_updates, cfg.schedule.min_lr
        progress = min(1.0, (step - warmup) / max(total - warmup, 1))
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - min_lr)
    raise ValueError(f"unknown schedule {name!r}")
