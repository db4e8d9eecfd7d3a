"""`init=ds_init`: depth-scaled init of Zhang, Titov, Sennrich (EMNLP 2019, Improving Deep Transformer
with Depth-Scaled Initialization and Merged Attention): every matrix of layer l (1-based, counted per
stack) is Xavier-uniform with its bound shrunk by l^-1/2 (the paper's formula, default) or l^-1/4
(the code, bzhangGo/zero models/transformer.py, init.ds_init_form=code)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from runner.config import InitConfig
from runner.config.options import options
from runner.init.base import BRANCH_WEIGHTS, InitScheme
from runner.init.common import branch_linears, fairseq_xavier, store_effective_, t5_qk_adjust_


@options
@dataclass
class DSInitOptions(InitConfig):
    # paper (l^-1/2, default) | code (l^-1/4, bzhangGo/zero)
    ds_init_form: Literal["paper", "code"] = "paper"
    ds_init_gain: float = 1.0


def bound(fan_in: int, fan_out: int, layer: int, form: str, gain: float) -> float:
    """layer is 1-based. paper: gain*sqrt(6/(fi+fo))/sqrt(l); code: TF variance_scaling with
    scale gain*l^-1/2, mode fan_avg, uniform = sqrt(3*scale/((fi+fo)/2))."""
    if form == "paper":
        return gain * math.sqrt(6.0 / (fan_in + fan_out)) / math.sqrt(layer)
    if form == "code":
        return math.sqrt(3.0 * gain * layer ** -0.5 / ((fan_in + fan_out) / 2.0))
    raise ValueError(f"unknown ds_init_form {form!r}")


class DSInit(InitScheme):
    # l is a layer's depth in its own stack (bzhangGo/zero models/transformer.py counts encoder and
    # decoder layers apart), so the LM's one stack gets l = 1..L
    tasks = ("translation", "lm")
    name = "ds_init"
    options = DSInitOptions
    changes = BRANCH_WEIGHTS  # embeddings and the output matrix keep N(0, d^-1/2)

    @torch.no_grad()
    def apply(self, model, cfg, batch=None) -> dict:
        return apply_ds_init(model, cfg)


def apply_ds_init(model, cfg) -> dict:
    # Embeddings N(0, d^-1/2), zero biases and norms 1/0 stay as in the baseline (bzhangGo/zero:
    # outside the layer scopes / explicit initializers).
    fairseq_xavier(model, cfg)
    form, gain = cfg.init.ds_init_form, cfg.init.ds_init_gain
    factors = {}
    for ref in model.sublayers():
        depth = ref.layer + 1
        for role, linear in branch_linears(ref).items():
            b = bound(linear.in_features, linear.out_features, depth, form, gain)
            nn.init.uniform_(linear.weight, -b, b)
            store_effective_(linear)
            t5_qk_adjust_(model, role, linear)
        factors[f"{ref.side}.{ref.layer}"] = depth ** (-0.5 if form == "paper" else -0.25)
    return {"rule": f"DS-Init (Zhang, Titov, Sennrich 2019; bzhangGo/zero models/transformer.py), "
                    f"{form} form", "gain": gain,
            "bound_factor_vs_xavier": factors}
