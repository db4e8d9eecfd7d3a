"""Training without the padding: position-wise layers (projections, feed-forward, norms,
residuals, the output projection) run on the real tokens of a right-padded batch only, as
(N, D) rows; attention unpacks them into (B, T, D) with zeros at the pads, which its masks
already ignore. On the benchmark stream 10-17% of batch cells are padding, work that
fairseq computes and discards."""
from __future__ import annotations

import torch


class _Unpack(torch.autograd.Function):
    """Rows of x into a zero (B * T, D) tensor at `index`. Saves only the index: autograd's
    index_copy keeps its (N, D) source alive until backward (saved activations of a `small`
    batch 1,753 -> 2,145 MB, docs/performance.md)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor, cells: int) -> torch.Tensor:
        ctx.save_for_backward(index)
        return x.new_zeros(cells, x.shape[-1]).index_copy_(0, index, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index), None, None


class Packing:
    """The real positions of a (B, T) batch: `keep` is True where a token is not padding."""

    def __init__(self, keep: torch.Tensor):
        self.batch, self.length = keep.shape
        self.index = keep.reshape(-1).nonzero().squeeze(1)  # row-major: keep's own order

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (N, D)."""
        return x.reshape(-1, x.shape[-1]).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (B, T, D), zeros at the padding (finite values for masked keys/values)."""
        out = _Unpack.apply(x, self.index, self.batch * self.length)
        return out.view(self.batch, self.length, x.shape[-1])

    def pack_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T, Dh) attention output -> (N, H * Dh). (A copy to (B * T, D) and a row
        gather are faster on CPU than one advanced-index gather, whose backward accumulates.)"""
        b, h, t, dh = x.shape
        return x.transpose(1, 2).reshape(b * t, h * dh).index_select(0, self.index)
