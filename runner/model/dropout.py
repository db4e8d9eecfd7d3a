"""Dropout whose CPU mask costs a third of torch's.

On CPU, torch's dropout draws one Mersenne-Twister number per element, and that draw is most of
the cost of dropout (bernoulli_ was 13% of a CPU training step of a 2+2-layer d=128 model in
torch.profiler). Here one 64-bit draw gives three 16-bit uniforms, so an element is dropped with
probability round(p * 65536) / 65536 (within 7.7e-6 of p) and kept ones are scaled by the exact
inverse of that keep rate, so the expectation is unchanged. Masks still come from torch's seeded
CPU generator (reproducible, checkpointed).
CUDA uses torch's own fused dropout (Philox), which is already cheap, and so does a model under
torch.compile, whose generated code fuses its own.
"""
from __future__ import annotations

import sys

import torch
from torch import nn
from torch.nn import functional as F

_LEVELS = 1 << 16
# random_() on int64 fills bits 0..62; on a little-endian machine the three low int16 fields of
# each int64 are those uniform bits (the fourth holds the always-zero bit 63).
_FIELDS = slice(0, 3) if sys.byteorder == "little" else slice(1, 4)


def keep_mask(shape: torch.Size, p: float) -> tuple[torch.Tensor, float]:
    """A bool mask (True = keep) with P(drop) = round(p * 2^16) / 2^16, and the scale 1/P(keep)."""
    n = shape.numel()
    drop_levels = round(p * _LEVELS)
    words = torch.empty((n + 2) // 3, 4, dtype=torch.int16)
    words.view(torch.int64).random_()
    keep = (words[:, _FIELDS] >= drop_levels - _LEVELS // 2).view(-1)[:n].view(shape)
    return keep, _LEVELS / (_LEVELS - drop_levels)


class _MaskedScale(torch.autograd.Function):
    """fp32: x * mask with mask = keep * scale stored as fp32, one multiply forward and one
    backward (a bool mask costs a cast and two multiplies each way; 3 bytes per element more).
    Other dtypes keep the bool mask, so the scale is not rounded to bf16/fp16."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep, scale = keep_mask(x.shape, p)
        ctx.scale = scale
        if x.dtype == torch.float32:
            mask = keep * scale
            ctx.save_for_backward(mask)
            return x * mask
        ctx.save_for_backward(keep)
        return torch.ops.aten.native_dropout_backward(x, keep, scale)  # x * keep * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        if mask.dtype == torch.bool:
            return torch.ops.aten.native_dropout_backward(grad, mask, ctx.scale), None
        return grad * mask, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    # torch.compile: the in-place draw on a reinterpreted view breaks the graph; Inductor
    # generates its own fused dropout, which is what a compiled model wants anyway
    if (x.device.type != "cpu" or p >= 1.0 or round(p * _LEVELS) == 0
            or torch.compiler.is_compiling()):
        return F.dropout(x, p, True)
    return _MaskedScale.apply(x, p)


class Dropout(nn.Dropout):
    """nn.Dropout with the cheaper CPU mask (same `p`, same train/eval behaviour)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
