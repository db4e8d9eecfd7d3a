"""`init=admin_torch`: the closed-form Admin of microsoft/admin-torch (admin_torch/admin.py): every
sublayer's shortcut scale is omega(n) with n the number of residual sublayers of its stack; no
profiling. Weights are the default Xavier."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Literal

import torch

from runner.config.options import options
from runner.init.admin import AdminOptions, residual_for
from runner.init.base import InitScheme
from runner.init.common import fairseq_xavier


@options
@dataclass
class AdminTorchOptions(AdminOptions):
    # omega's growth with the number of sublayers (microsoft/admin-torch, admin_torch/admin.py)
    output_change_scale: Literal["O(logn)", "O(1)", "O(n)"] = "O(logn)"


def omega(n: int, output_change_scale: str) -> float:
    """calculate_init of microsoft/admin-torch, admin_torch/admin.py."""
    if output_change_scale == "O(logn)":
        return math.sqrt((n + 1) / math.log(n + 1) - 1)
    if output_change_scale == "O(1)":
        return math.sqrt(n)
    if output_change_scale == "O(n)":
        return 1.0
    raise ValueError(f"unknown output_change_scale {output_change_scale!r}")


def residual_sublayers(model) -> dict[str, int]:
    """n per stack: its residual sublayers, admin-torch's num_res_layers. 2N for an N-layer encoder
    (admin-torch's docstring example); 3M for a decoder with cross-attention (our count; the fairseq
    integration's value, LiyuanLucasLiu/fairseq 33ad76ae, is unverified); 2L for task=lm's
    decoder-only stack."""
    return dict(Counter(ref.side for ref in model.sublayers()))


class AdminTorch(InitScheme):
    name = "admin_torch"
    options = AdminTorchOptions
    changes = ("*.omega",)
    tasks = ("translation", "lm")
    placements = ("post",)
    placement_hint = "admin_torch rescales the Post-LN shortcut"

    def residual(self, cfg):
        return residual_for(cfg.init.omega)

    @torch.no_grad()
    def apply(self, model, cfg, batch=None) -> dict:
        fairseq_xavier(model, cfg)
        n = residual_sublayers(model)
        values = {side: omega(count, cfg.init.output_change_scale) for side, count in n.items()}
        for ref in model.sublayers():
            ref.module.omega.fill_(values[ref.side])
        return {"rule": f"admin-torch closed form, {cfg.init.output_change_scale} "
                        "(microsoft/admin-torch, admin_torch/admin.py calculate_init)",
                "omega_mode": cfg.init.omega, "n": n, "omega": values}
