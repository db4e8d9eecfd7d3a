"""Attention kernels: softmax(q k^T * scale + mask) v, computed the way that is fastest where
it runs.

Every kernel takes q (B, H, Tq, Dh), k and v (B, H, Tk, Dh), a bool mask broadcastable to
(B, H, Tq, Tk) with True = attend (or None), and the logit scale, and returns (B, H, Tq, Dh).
They compute the same attention; they differ in speed and memory only (and, within floating
point rounding, in their results: each keeps its own order of operations, which is part of
what a fixed-seed run reproduces bit for bit).

Full-sequence kernels (training, validation) also take `is_causal` (query i attends keys 0..i,
top-left aligned as in torch's sdpa) and `dropout_p` (dropout on the attention probabilities; the
caller passes 0 outside training). Decoding kernels (one incremental step against cached keys)
are never causal and never drop out: they take neither.

Masks are additive with the dtype's most negative finite value, not -inf: a query whose keys
are all masked (a source sentence that is all padding) then gets a uniform, finite attention
instead of NaN (0/0), and on every other row the masked keys' weights are exactly 0 as before
(exp underflows to 0), so their results are bit for bit those of -inf masks. In bf16/fp16 the
softmax runs in float32 (CPU autocast leaves it in the low precision).

Choice: the device's kernels are chosen once, when the model is placed on its device
(`Seq2Seq.select_kernels(device_type)` stores an `AttentionKernels` in every attention module;
a model is built for CPU). What remains per call is the shape test within one device's set (the
number of keys, the number of decoding queries), a few integer comparisons; under torch.compile
it becomes a shape guard, as any shape-dependent branch does. Every kernel is plain torch and
runs on any device, so a model moved without `select_kernels` still computes the same attention,
only by the other device's faster path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.nn import functional as F

from runner.model.dropout import dropout as cpu_dropout

# Up to this many key positions, CPU training attention runs as matmul-softmax-matmul: at head
# dim 32 it is 1.6-2.2x faster than sdpa's CPU flash kernel (forward + backward) at 26-50
# positions, 1.1-1.3x at 100, and slower at 200. Beyond it sdpa also saves memory: the
# probabilities the matmul kernel keeps for backward grow as T^2.
CPU_MATMUL_ATTENTION_MAX_KEYS = 128

Kernel = Callable[..., torch.Tensor]


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: Optional[torch.Tensor], scale: float, is_causal: bool = False,
                   dropout_p: float = 0.0) -> torch.Tensor:
    """torch's scaled_dot_product_attention (flash / memory-efficient kernels on CUDA, a flash
    kernel on CPU). Used on CUDA for everything, and on CPU for training with more than
    CPU_MATMUL_ATTENTION_MAX_KEYS keys, where it is faster than `matmul_attention` and does
    not keep the (Tq, Tk) probabilities for backward. Also the CUDA decoding kernel (is_causal
    False, dropout_p 0: sdpa's own defaults)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale)


def matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: Optional[torch.Tensor], scale: float, is_causal: bool = False,
                     dropout_p: float = 0.0) -> torch.Tensor:
    """CPU training with up to CPU_MATMUL_ATTENTION_MAX_KEYS keys: matmul, additive masks (see
    the module docstring), softmax, the project's cheaper CPU dropout (runner.model.dropout),
    matmul. 1.6-2.2x faster than sdpa's CPU kernel (forward + backward) at 26-50 keys, 1.1-1.3x
    at 100 (head dim 32). dropout_p is 0 outside training, which makes the dropout the identity."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    blocked = None if mask is None else ~mask
    if is_causal:  # sdpa's is_causal: query i attends keys 0..i (top-left aligned)
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu_(1)
        blocked = causal if blocked is None else blocked | causal  # one add: never 2 x min
    if blocked is not None:
        scores.add_(_blocked(blocked, scores.dtype))
    return torch.matmul(cpu_dropout(_softmax(scores), dropout_p, True), v)


def single_query_decoding_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """CPU decoding step with one query position (greedy search, self-attention of a beam
    step): the scores as K q, which reads the cached keys row by row (faster on CPU than
    q K^T), then masked softmax and the values. Matmul-softmax-matmul is about twice as fast as
    sdpa's CPU kernels at decoding shapes."""
    scores = torch.matmul(k, q.transpose(-1, -2) * scale).transpose(-1, -2)
    return _masked_softmax_values(scores, mask, v)


def matmul_decoding_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """CPU decoding step with several query positions (the beams of a sentence attending its
    encoder keys as a group, or several new positions at once): (q * scale) K^T, masked
    softmax, values. About twice as fast as sdpa's CPU kernels at decoding shapes."""
    scores = torch.matmul(q * scale, k.transpose(-1, -2))
    return _masked_softmax_values(scores, mask, v)


def select_attention(device_type: str, queries: int, keys: int, decoding: bool,
                     max_matmul_keys: int = CPU_MATMUL_ATTENTION_MAX_KEYS) -> Kernel:
    """The kernel for this call. decoding=False: a full-sequence kernel, called as
    kernel(q, k, v, mask, scale, is_causal, dropout_p); decoding=True: a decoding kernel, called
    as kernel(q, k, v, mask, scale).

        CUDA (any non-CPU device)                -> sdpa_attention
        CPU, full sequence, keys > max_matmul_keys  -> sdpa_attention
        CPU, full sequence, otherwise             -> matmul_attention
        CPU, decoding, one query                  -> single_query_decoding_attention
        CPU, decoding, several queries            -> matmul_decoding_attention
    """
    if device_type != "cpu":
        return sdpa_attention
    if decoding:
        return single_query_decoding_attention if queries == 1 else matmul_decoding_attention
    return sdpa_attention if keys > max_matmul_keys else matmul_attention


def _masked_softmax_values(scores: torch.Tensor, mask: Optional[torch.Tensor],
                           v: torch.Tensor) -> torch.Tensor:
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.matmul(_softmax(scores), v)


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the keys; in float32 for bf16/fp16 scores, returned in their dtype."""
    if scores.dtype in (torch.float16, torch.bfloat16):
        return scores.float().softmax(-1).to(scores.dtype)
    return scores.softmax(-1)


def _blocked(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask: the dtype's most negative finite value where `blocked` is True,
    0 elsewhere (finite, so a fully masked row stays finite; see the module docstring)."""
    return torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill_(
        blocked, torch.finfo(dtype).min)


@dataclass(frozen=True)
class AttentionKernels:
    """The kernels of one device type, chosen once when the model is placed on it."""

    device_type: str
    max_matmul_keys: int = CPU_MATMUL_ATTENTION_MAX_KEYS

    def full(self, keys: int) -> Kernel:
        """A full-sequence kernel for this many keys."""
        return select_attention(self.device_type, 0, keys, False, self.max_matmul_keys)

    def decoding(self, queries: int) -> Kernel:
        """A decoding kernel for this many queries per row (one, or a sentence's beams)."""
        return select_attention(self.device_type, queries, 0, True, self.max_matmul_keys)
