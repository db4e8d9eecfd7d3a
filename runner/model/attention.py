"""Multi-head attention with separate q/k/v/out projections so init schemes can address each
by name. Attention itself: torch's scaled_dot_product_attention (flash/efficient kernels) on
CUDA and for long keys; plain matmuls on CPU where they are faster (short keys in training,
every decoding step)."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from runner.model.dropout import dropout as cpu_dropout
from runner.model.linear import make_linear
from runner.model.packing import Packing

# Up to this many key positions, CPU training attention runs as matmul-softmax-matmul: at
# head dim 32 it is 1.6-2.2x faster than sdpa's CPU flash kernel (forward + backward) at 26-50
# positions, 1.1-1.3x at 100, slower at 200 (docs/performance.md, session 5). Beyond it sdpa
# also saves memory: the probabilities this path keeps for backward grow as T^2.
CPU_MATMUL_ATTENTION_MAX_KEYS = 128


class MultiheadAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float, parameterization: str = "standard",
                 logit_scale: str = "standard", self_attention: bool = True):
        super().__init__()
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.dropout = dropout
        self.self_attention = self_attention
        self.q_proj = make_linear(dim, dim, parameterization)
        self.k_proj = make_linear(dim, dim, parameterization)
        self.v_proj = make_linear(dim, dim, parameterization)
        self.out_proj = make_linear(dim, dim, parameterization)
        # t5: no 1/sqrt(head_dim) in the logits; the init divides the q/k variance instead
        # (seed 004, "attention scale"). sdpa takes the scale explicitly.
        self.scale = 1.0 if logit_scale == "t5" else 1.0 / math.sqrt(self.head_dim)
        # One matmul for q, k and v of self-attention is faster than three; the weights stay
        # separate parameters so schemes can set them one by one.
        self.fuse_qkv = self_attention and type(self.q_proj) is nn.Linear

    def _qkv_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]),
                torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, D) -> (B, H, T, Dh)
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    def project_kv(self, memory: torch.Tensor, contiguous: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """contiguous=True for keys/values cached over decoding steps: the (B, H, S, Dh) view of
        a (B, S, D) projection cannot be batched by matmul without a copy, so copy it once."""
        k, v = self._split(self.k_proj(memory)), self._split(self.v_proj(memory))
        return (k.contiguous(), v.contiguous()) if contiguous else (k, v)

    @staticmethod
    def _append(cache: dict, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys/values into preallocated buffers (capacity doubling) and return
        views of the filled part: torch.cat per step would copy the whole prefix every step.
        cache["k"]/["v"] are (B, H, capacity, Dh); cache["len"] counts the filled positions.
        Capacity stays within twice the length, so a beam reorder that copies whole rows copies
        at most twice the filled part."""
        n, t = cache.get("len", 0), k.shape[2]
        if "k" not in cache or cache["k"].shape[2] < n + t:
            capacity = max(2 * (n + t), 16)
            for key, new in (("k", k), ("v", v)):
                buf = new.new_empty(new.shape[0], new.shape[1], capacity, new.shape[3])
                if n:
                    buf[:, :, :n] = cache[key][:, :, :n]
                cache[key] = buf
        cache["k"][:, :, n:n + t] = k
        cache["v"][:, :, n:n + t] = v
        cache["len"] = n + t
        return cache["k"][:, :, :n + t], cache["v"][:, :, :n + t]

    @staticmethod
    def repeat_cache(cache: dict, times: int) -> None:
        """Self-attention cache rows repeated `times` times each (beam search after its first
        step, which runs one row per sentence): only the filled positions are copied."""
        n = cache.get("len", 0)
        for key in ("k", "v"):
            if key in cache:
                buf = cache[key]
                grown = buf.new_empty(buf.shape[0] * times, *buf.shape[1:])
                grown[:, :, :n] = buf[:, :, :n].repeat_interleave(times, 0)
                cache[key] = grown

    def forward(self, x: torch.Tensor, memory: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                cache: Optional[dict] = None, packing: Optional[Packing] = None,
                memory_packing: Optional[Packing] = None) -> torch.Tensor:
        """x: (B, Tq, D). memory: (B, Tk, D) for cross-attention, None for self-attention.
        attn_mask: bool (B, 1, 1 or Tq, Tk), True = attend. cache: incremental decoding state
        (self-attention appends this step's k/v; cross-attention computes k/v once; with
        cache["group"] = g > 1, x has g rows per row of memory's k/v and of attn_mask).
        packing: x (and memory, with memory_packing) hold only the real tokens, (N, D)."""
        if packing is not None:
            return self._packed(x, memory, attn_mask, is_causal, packing, memory_packing)
        if self.fuse_qkv and memory is None:
            if cache is None:
                weight, bias = self._qkv_weight()
            else:  # weights are fixed while decoding: concatenate once per decoding call
                if "qkv" not in cache:  # a tuple, so cache reorders (tensors only) skip it
                    cache["qkv"] = self._qkv_weight()
                weight, bias = cache["qkv"]
            q, k, v = (self._split(t) for t in F.linear(x, weight, bias).chunk(3, dim=-1))
            if cache is not None:
                k, v = self._append(cache, k, v)
        else:
            q = self._split(self.q_proj(x))
            if cache is None:
                k, v = self.project_kv(x if memory is None else memory)
            elif memory is None:  # incremental self-attention: append this step
                k, v = self._append(cache, *self.project_kv(x))
            else:  # cross-attention: encoder keys/values once per sentence
                if "k" not in cache:
                    cache["k"], cache["v"] = self.project_kv(memory, contiguous=True)
                k, v = cache["k"], cache["v"]
                group = cache.get("group", 1)
                if group > 1:
                    return self._grouped_cross(q, k, v, attn_mask, group)
        if cache is not None:  # incremental decoding: never causal, no dropout
            out = self._decoding_attention(q, k, v, attn_mask)
        else:
            out = self._attention(q, k, v, attn_mask, is_causal)
        b, h, t, dh = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, h * dh))

    def _packed(self, x: torch.Tensor, memory: Optional[torch.Tensor],
                attn_mask: Optional[torch.Tensor], is_causal: bool, packing: Packing,
                memory_packing: Optional[Packing]) -> torch.Tensor:
        """Projections on the real tokens only; attention itself on the padded layout."""
        if memory is None and self.fuse_qkv:
            qkv = packing.unpack(F.linear(x, *self._qkv_weight()))
            q, k, v = (self._split(t) for t in qkv.chunk(3, dim=-1))
        elif memory is not None and type(self.k_proj) is nn.Linear:  # one k/v matmul and unpack
            weight = torch.cat([self.k_proj.weight, self.v_proj.weight])
            bias = torch.cat([self.k_proj.bias, self.v_proj.bias])
            q = self._split(packing.unpack(self.q_proj(x)))
            kv = memory_packing.unpack(F.linear(memory, weight, bias))
            k, v = (self._split(t) for t in kv.chunk(2, dim=-1))
        else:
            source, layout = (x, packing) if memory is None else (memory, memory_packing)
            q = self._split(packing.unpack(self.q_proj(x)))
            k = self._split(layout.unpack(self.k_proj(source)))
            v = self._split(layout.unpack(self.v_proj(source)))
        return self.out_proj(packing.pack_heads(self._attention(q, k, v, attn_mask, is_causal)))

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   attn_mask: Optional[torch.Tensor], is_causal: bool) -> torch.Tensor:
        """Full-sequence attention (training, validation): sdpa, or on CPU for short keys the
        same attention as plain matmuls with an additive mask (faster there, see above)."""
        dropout_p = self.dropout if self.training else 0.0
        if q.device.type != "cpu" or k.shape[-2] > CPU_MATMUL_ATTENTION_MAX_KEYS:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=self.scale)
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(self.scale)
        if is_causal:  # sdpa's is_causal: query i attends keys 0..i (top-left aligned)
            scores.add_(_blocked(torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device)
                                 .triu_(1), scores.dtype))
        if attn_mask is not None:
            scores.add_(_blocked(~attn_mask, scores.dtype))
        return torch.matmul(cpu_dropout(scores.softmax(-1), dropout_p, self.training), v)

    def _decoding_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            attn_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """Incremental decoding: 1 to beam query rows per sentence against the cached keys.
        On CPU plain matmul-softmax-matmul is about twice as fast as sdpa's kernels at these
        shapes (docs/performance.md); CUDA keeps sdpa."""
        if q.device.type != "cpu":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
        if q.shape[-2] == 1:  # one query: K q reads the cached keys row by row (faster on CPU)
            scores = torch.matmul(k, q.transpose(-1, -2) * self.scale).transpose(-1, -2)
        else:
            scores = torch.matmul(q * self.scale, k.transpose(-1, -2))
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        return torch.matmul(scores.softmax(-1), v)

    def _grouped_cross(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       attn_mask: Optional[torch.Tensor], group: int) -> torch.Tensor:
        """Beam search: q holds `group` consecutive rows (the beams) per sentence, one position
        each, and k/v/attn_mask one row per sentence. The beams become the query positions of
        their sentence, so the encoder keys/values are read once per sentence instead of once
        per beam (fairseq repeats them per beam). Same attention, computed per sentence."""
        rows, h, _, dh = q.shape  # (sentences * group, H, 1, Dh)
        q = q.view(rows // group, group, h, dh).transpose(1, 2)  # (sentences, H, group, Dh)
        out = self._decoding_attention(q, k, v, attn_mask)
        return self.out_proj(out.transpose(1, 2).reshape(rows, 1, h * dh))


def _blocked(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask: -inf where `blocked` is True, 0 elsewhere."""
    return torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill_(
        blocked, float("-inf"))
