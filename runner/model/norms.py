"""Normalization layers chosen by norm.kind: LayerNorm (torch), RMSNorm, Dynamic Tanh and
ScaleNorm (the last two carry their own init values and `reset_parameters()`)."""
from __future__ import annotations

import math

import torch
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) * weight (Zhang & Sennrich 2019); no mean subtraction, no bias."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class DynamicTanh(nn.Module):
    """DyT(x) = weight * tanh(alpha * x) + bias (Zhu et al., CVPR 2025, Transformers
    without Normalization; jiachenzhu/DyT dynamic_tanh.py): alpha one learnable scalar, weight
    (gamma) and bias (beta) d-vectors initialised to 1 and 0 as the reference does. No statistics
    of x are computed, so there is no eps."""

    def __init__(self, dim: int, alpha_init: float = 0.5):
        super().__init__()
        self.alpha_init = alpha_init
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.alpha.fill_(self.alpha_init)
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias


class ScaleNorm(nn.Module):
    """ScaleNorm(x) = g * x / max(||x||_2, eps) with one learnable scalar g initialised to
    sqrt(d) (Nguyen & Salazar 2019, Transformers without Tears, "ScaleNorm"; the clamp as in
    tnq177/transformers_without_tears layers.py ScaleNorm, eps 1e-5 there, norm.eps here)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        # g = sqrt(d) at init (Nguyen & Salazar 2019; layers.py ScaleNorm(args.embed_dim ** 0.5))
        self.scale_init = math.sqrt(dim)
        self.weight = nn.Parameter(torch.full((1,), self.scale_init))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.weight.fill_(self.scale_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.weight / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps))


# Every norm module a model can hold (Seq2Seq.norms() yields these).
NORM_TYPES = (nn.LayerNorm, RMSNorm, DynamicTanh, ScaleNorm)


def make_norm(kind: str, dim: int, eps: float, dyt_alpha: float = 0.5) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    if kind == "dyt":
        return DynamicTanh(dim, dyt_alpha)
    if kind == "scalenorm":
        return ScaleNorm(dim, eps=eps)
    raise ValueError(f"unknown norm kind {kind!r}")
