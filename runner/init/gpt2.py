"""`init=gpt2`: the GPT-2 initialization as nanoGPT writes it (karpathy/nanoGPT model.py
_init_weights): every linear and embedding weight N(0, 0.02), biases zero, norms 1/0; the
projections that write into the residual stream (attention out_proj, FFN fc2) N(0, 0.02/sqrt(N)),
N the residual branches of their stack (Radford et al. 2019, Language Models are Unsupervised
Multitask Learners, Sec. 2.3: "scale the weights of residual layers at initialization by a factor
of 1/sqrt(N) where N is the number of residual layers"; nanoGPT: 0.02/sqrt(2 * n_layer))."""
from __future__ import annotations

import math
from collections import Counter

import torch
from torch import nn

from runner.init.base import BRANCH_WEIGHTS, InitScheme
from runner.init.common import branch_linears, reset_norms_and_scales, unique_tables

STD = 0.02  # nanoGPT model.py _init_weights (GPT-2's initializer_range)
RESIDUAL_WRITERS = ("out", "fc2")  # nanoGPT's c_proj of attention and MLP


class GPT2(InitScheme):
    name = "gpt2"
    changes = (*BRANCH_WEIGHTS, "embedding.*")  # N(0, 0.02) everywhere, the residual writers smaller
    tasks = ("translation", "lm")

    @torch.no_grad()
    def apply(self, model, cfg, batch=None) -> dict:
        branches = Counter(ref.side for ref in model.sublayers())  # residual branches per stack
        residual_std = {side: STD / math.sqrt(n) for side, n in branches.items()}
        for ref in model.sublayers():
            for role, linear in branch_linears(ref).items():
                std = residual_std[ref.side] if role in RESIDUAL_WRITERS else STD
                nn.init.normal_(linear.weight, 0.0, std)
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)
        for _, weight in unique_tables(model):
            nn.init.normal_(weight, 0.0, STD)
            if model.pad_index is not None:
                weight[model.pad_index].zero_()
        reset_norms_and_scales(model)
        return {"rule": "GPT-2 / nanoGPT: N(0, 0.02), residual writers N(0, 0.02/sqrt(N))",
                "residual_std": residual_std}
