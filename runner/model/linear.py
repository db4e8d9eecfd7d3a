"""Projection layers for both parameterizations (model.parameterization)."""
from __future__ import annotations

import math

import torch
from torch import nn


class NTKLinear(nn.Linear):
    """NTK parameterization (an option of this tool, after Su 2021, kexue.fm/archives/8620,
    "NTK Parameterization"): unit-variance weights, output scaled by 1/sqrt(fan_in), so the forward
    scale no longer lives in the init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.output_scale = 1.0 / math.sqrt(in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight * self.output_scale, self.bias)


def plain_affine(parameterization: str) -> bool:
    """True when make_linear builds plain affine maps x W^T + b (nn.Linear), so that projections
    of one input can run as one F.linear of their concatenated weights and biases. False for
    NTK, whose forward multiplies the weight by output_scale first."""
    return parameterization != "ntk"


def make_linear(in_features: int, out_features: int, parameterization: str, bias: bool = True) -> nn.Linear:
    cls = nn.Linear if plain_affine(parameterization) else NTKLinear
    return cls(in_features, out_features, bias=bias)
