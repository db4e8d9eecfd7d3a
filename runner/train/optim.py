"""The reference recipes' optimizers: fairseq adam (AdamW-style), the RAdam variants, SGD.

An init scheme may split the parameters into groups with their own lr and eps multipliers
(runner.init.base.ParamGroup; Depth-muP): each torch param group then carries "lr_scale", and
`set_lr` gives it the schedule's lr times that multiplier. Without groups the optimizer has one
group and no multiplier, as always."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch.optim import Optimizer

from runner.init.base import ParamGroup


def rectification(step: int, beta2: float) -> tuple[float, float]:
    """(rho_t, r_t) of RAdam (LiyuanLucasLiu/RAdam, radam/radam.py); r_t is 0 where rho_t <= 4
    (undefined)."""
    rho_inf = 2.0 / (1.0 - beta2) - 1.0
    beta2_t = beta2 ** step
    rho_t = rho_inf - 2.0 * step * beta2_t / (1.0 - beta2_t)
    if rho_t <= 4.0:
        return rho_t, 0.0
    r_t = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
    return rho_t, r_t


class RAdam(Optimizer):
    """RAdam with decoupled weight decay applied every step, as the reference forks do.

    mode="admin" (LiyuanLucasLiu/Transformer-Clinic radam_fairseq/radam.py): while rho_t < 5 no
    gradient update is made, only the weight decay. mode="sgd_fallback" (LiyuanLucasLiu/RAdam
    nmt/my_module/radam.py, layer6ai-labs/T-Fixup fairseq/optim/radam.py): while rho_t < 5 an
    SGD-momentum step p -= lr * m_t / (1 - beta1^t). Once rho_t >= 5:
    p -= lr * r_t * m_t/(1 - beta1^t) * sqrt(1 - beta2^t) / (sqrt(v_t) + eps).
    """

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, mode: str):
        if mode not in ("admin", "sgd_fallback"):
            raise ValueError(f"RAdam mode {mode!r}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.mode = mode

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            # One list per step count (a parameter without a gradient keeps its count), so that
            # each list shares r_t and the step size: torch._foreach_* then updates a list with a
            # few kernels instead of a few per parameter (on CPU, the same per-tensor kernels).
            by_step: dict[int, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                by_step.setdefault(state["step"], []).append(p)
            for t, params in by_step.items():
                ms = [self.state[p]["exp_avg"] for p in params]
                vs = [self.state[p]["exp_avg_sq"] for p in params]
                grads = [p.grad.float() if p.dtype != torch.float32 else p.grad for p in params]
                torch._foreach_mul_(ms, beta1)
                torch._foreach_add_(ms, grads, alpha=1 - beta1)
                torch._foreach_mul_(vs, beta2)
                torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
                if wd != 0:
                    torch._foreach_mul_(params, 1 - lr * wd)
                rho_t, r_t = rectification(t, beta2)
                bias1 = 1 - beta1 ** t
                if rho_t >= 5:
                    step_size = lr * r_t * math.sqrt(1 - beta2 ** t) / bias1
                    denom = torch._foreach_sqrt(vs)
                    torch._foreach_add_(denom, eps)
                    torch._foreach_addcdiv_(params, ms, denom, value=-step_size)
                elif self.mode == "sgd_fallback":
                    torch._foreach_add_(params, ms, alpha=-lr / bias1)
        return loss


def torch_groups(params, groups: Sequence[ParamGroup], cfg) -> list[dict]:
    """The scheme's groups as torch param groups over the trainable `params`: lr = optim.lr *
    lr_scale, eps = optim.eps * eps_scale (not for SGD), "lr_scale" kept for set_lr. Every
    trainable parameter must be in exactly one group; empty groups are left out."""
    o = cfg.optim
    trainable = {id(p) for p in params}
    owner: dict[int, str] = {}
    out = []
    for group in groups:
        members = []
        for p in group.params:
            if id(p) in owner:
                raise ValueError(f"a parameter is in both param groups {owner[id(p)]!r} and {group.name!r}")
            owner[id(p)] = group.name
            if id(p) in trainable:
                members.append(p)
        if not members:
            continue
        entry = {"params": members, "name": group.name, "lr": o.lr * group.lr_scale,
                 "lr_scale": group.lr_scale}
        if o.name != "sgd":
            entry["eps"] = o.eps * group.eps_scale
        out.append(entry)
    missing = trainable - set(owner)
    if missing:
        raise ValueError(f"{len(missing)} trainable parameters are in no param group")
    return out


def build_optimizer(params, cfg, device_type: str,
                    groups: Optional[Sequence[ParamGroup]] = None) -> Optimizer:
    """The configured optimizer over the trainable `params`; `groups` (runner.init.param_groups)
    gives per-group lr and eps multipliers, None = one group."""
    o = cfg.optim
    params = [p for p in params if p.requires_grad]
    if groups is not None:
        params = torch_groups(params, groups, cfg)
    # fused kernels on CPU too: +7% tiny-peer training, 5 of 5 paired runs (docs/performance.md)
    fused = (device_type in ("cuda", "cpu")) if o.fused is None else o.fused
    betas = (o.beta1, o.beta2)
    if o.name == "adam":
        # fairseq's adam decays decoupled, p <- p - lr*wd*p: exactly AdamW (fairseq/optim/adam.py).
        return torch.optim.AdamW(params, lr=o.lr, betas=betas, eps=o.eps,
                                 weight_decay=o.weight_decay, fused=fused or None)
    if o.name == "radam":
        if o.radam_mode == "torch":
            return torch.optim.RAdam(params, lr=o.lr, betas=betas, eps=o.eps,
                                     weight_decay=o.weight_decay, decoupled_weight_decay=True)
        return RAdam(params, lr=o.lr, betas=betas, eps=o.eps, weight_decay=o.weight_decay,
                     mode=o.radam_mode)
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay,
                               fused=fused or None)
    raise ValueError(f"unknown optimizer {o.name!r}")


def set_lr(optimizer: Optimizer, lr: float) -> None:
    """The schedule's lr for this update, times each group's "lr_scale" where it has one."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr
