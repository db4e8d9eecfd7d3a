"""Multi-head attention with separate q/k/v/out projections so init schemes can address each
by name.

`MultiheadAttention.forward` is the maths: project q, k and v, split them into heads, attend,
merge the heads, project the output. How the attention itself is computed (torch's sdpa or plain
matmuls, by device and shape) is runner.model.kernels' choice, made on each call from the
tensors' device, since the model is built on CPU and moved afterwards (see that module). Two
variants of the same computation have their own methods: `_packed_forward` (training on the real
tokens only, runner.model.packing) and `_decoding_step` (incremental decoding with a key/value
cache).

What is fixed at construction is whether projections of one input run as one matmul of their
concatenated weights (faster than three; the weights stay separate parameters so schemes can set
them one by one). That is only the same computation when the projections are plain affine maps,
so it follows from the parameterization (runner.model.linear.plain_affine), never from the type
of a projection.

QK-norm (model.qk_norm) normalizes every head's queries and keys over the head dimension after
the projections and before the kernel, on every path (full, packed, decoding): layernorm or
rmsnorm with learnable (Dh,) gains shared by the heads, separate for q and k (Dehghani et al.
2023, Scaling Vision Transformers to 22 Billion Parameters, Sec. 2; Wortsman et al. 2023,
Small-scale proxies for large-scale Transformer training instabilities, Sec. 3.1; the per-head
q_norm/k_norm of timm's vision_transformer.py Attention), logits still scaled by 1/sqrt(Dh); or
l2 (Henry et al., Findings of EMNLP 2020, Query-Key Normalization for Transformers, Eq. 3;
CyndxAI/QKNorm QKNorm/layers.py): q_hat = q/||q||, k_hat = k/||k||, logits g * q_hat . k_hat with
one learnable scalar g per attention module in place of 1/sqrt(Dh). The kernels take the logit
scale as a float, so a learnable g is folded into the queries (g * q_hat) and the kernel gets
scale 1. Decoding caches hold normalized keys.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from runner.model.kernels import AttentionKernels
from runner.model.linear import linear_variant, make_linear, plain_affine
from runner.model.norms import make_norm
from runner.model.packing import Packing

# eps of the layernorm / rmsnorm QK-norms (torch's LayerNorm default, also norm.eps's default)
QK_NORM_EPS = 1e-5


class L2Norm(nn.Module):
    """x / max(||x||_2, 1e-12) over the last dimension (F.normalize, as CyndxAI/QKNorm layers.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, p=2.0, dim=-1)


def attention_options(cfg) -> dict:
    """MultiheadAttention's keyword arguments from the ModelConfig: QK-norm and sigma-reparam."""
    return {"qk_norm": cfg.qk_norm, "qk_temperature": cfg.qk_norm_temperature,
            "sigma_reparam": linear_variant(cfg)}


class MultiheadAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float, parameterization: str = "standard",
                 logit_scale: str = "standard", self_attention: bool = True,
                 qk_norm: str = "none", qk_temperature: float = 1.0,
                 sigma_reparam: Optional[str] = None):
        super().__init__()
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.dropout = dropout
        self.self_attention = self_attention
        self.q_proj = make_linear(dim, dim, parameterization, sigma_reparam=sigma_reparam)
        self.k_proj = make_linear(dim, dim, parameterization, sigma_reparam=sigma_reparam)
        self.v_proj = make_linear(dim, dim, parameterization, sigma_reparam=sigma_reparam)
        self.out_proj = make_linear(dim, dim, parameterization, sigma_reparam=sigma_reparam)
        # t5: no 1/sqrt(head_dim) in the logits; the init divides the q/k variance instead
        # (Su 2021, kexue.fm/archives/8620, "NTK Parameterization"). The kernels take the scale
        # explicitly.
        self.scale = 1.0 if logit_scale == "t5" else 1.0 / math.sqrt(self.head_dim)
        # QK-norm (see the module docstring): None when off, so the default path is unchanged.
        self.q_norm: Optional[nn.Module] = None
        self.k_norm: Optional[nn.Module] = None
        self.qk_temperature: Optional[nn.Parameter] = None
        if qk_norm in ("layernorm", "rmsnorm"):
            self.q_norm = make_norm(qk_norm, self.head_dim, QK_NORM_EPS)
            self.k_norm = make_norm(qk_norm, self.head_dim, QK_NORM_EPS)
        elif qk_norm == "l2":
            self.q_norm, self.k_norm = L2Norm(), L2Norm()
            # g replaces 1/sqrt(Dh); initial value model.qk_norm_temperature (Henry et al. 2020,
            # Sec. 3: g0 = log2(L^2 - L), L the 97.5th percentile training sequence length)
            self.qk_temperature = nn.Parameter(torch.full((1,), float(qk_temperature)))
            self.scale = 1.0
        elif qk_norm != "none":
            raise ValueError(f"qk_norm {qk_norm!r}: expected none, layernorm, rmsnorm or l2")
        # One F.linear of concatenated weights equals separate projections only for plain affine
        # maps x W^T + b (standard parameterization; NTK scales its weights in forward,
        # sigma-reparam divides each by its spectral norm).
        affine = plain_affine(parameterization, sigma_reparam)
        self.fuse_qkv = self_attention and affine  # q, k and v of x in one matmul
        self.fuse_kv = affine  # k and v of memory in one matmul (packed cross-attention)
        # the device's kernels, chosen when the model is placed (Seq2Seq.select_kernels)
        self.kernels = AttentionKernels("cpu")

    def forward(self, x: torch.Tensor, memory: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                cache: Optional[dict] = None, packing: Optional[Packing] = None,
                memory_packing: Optional[Packing] = None) -> torch.Tensor:
        """x: (B, Tq, D). memory: (B, Tk, D) for cross-attention, None for self-attention.
        attn_mask: bool (B, 1, 1 or Tq, Tk), True = attend. is_causal: query i attends keys
        0..i. cache: incremental decoding state (see `_decoding_step`). packing: x (and memory,
        with memory_packing) hold only the real tokens, (N, D) (see `_packed_forward`)."""
        if packing is not None:
            return self._packed_forward(x, memory, attn_mask, is_causal, packing, memory_packing)
        if cache is not None:
            return self._decoding_step(x, memory, attn_mask, cache)
        q, k, v = self._project(x, memory)  # (B, T, D)
        q, k, v = self._split(q), self._split(k), self._split(v)  # (B, H, T, Dh)
        q, k = self._norm_q(q), self._norm_k(k)  # QK-norm (identity when off)
        out = self._attention(q, k, v, attn_mask, is_causal)  # (B, H, Tq, Dh)
        return self.out_proj(self._merge(out))

    def _norm_q(self, q: torch.Tensor) -> torch.Tensor:
        """QK-norm of the queries (B, H, T, Dh), with l2's temperature g folded in."""
        if self.q_norm is None:
            return q
        q = self.q_norm(q)
        return q if self.qk_temperature is None else q * self.qk_temperature

    def _norm_k(self, k: torch.Tensor) -> torch.Tensor:
        """QK-norm of the keys (B, H, T, Dh); decoding caches hold its output."""
        return k if self.k_norm is None else self.k_norm(k)

    def _project(self, x: torch.Tensor,
                 memory: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q of x; k and v of memory (cross-attention) or of x (self-attention)."""
        if self.fuse_qkv and memory is None:
            qkv = F.linear(x, *self._concatenated(self.q_proj, self.k_proj, self.v_proj))
            return qkv.chunk(3, dim=-1)
        source = x if memory is None else memory
        return self.q_proj(x), self.k_proj(source), self.v_proj(source)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   attn_mask: Optional[torch.Tensor], is_causal: bool) -> torch.Tensor:
        """softmax(q k^T * scale + mask) v over whole sequences (training, validation), with
        attention dropout in training."""
        dropout_p = self.dropout if self.training else 0.0
        kernel = self.kernels.full(k.shape[-2])
        return kernel(q, k, v, attn_mask, self.scale, is_causal, dropout_p)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, D) -> (B, H, T, Dh)
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    @staticmethod
    def _merge(x: torch.Tensor) -> torch.Tensor:
        b, h, t, dh = x.shape  # (B, H, T, Dh) -> (B, T, D)
        return x.transpose(1, 2).reshape(b, t, h * dh)

    @staticmethod
    def _concatenated(*projections: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
        """Weight and bias of the projections stacked, for one F.linear (plain affine maps)."""
        return (torch.cat([p.weight for p in projections]),
                torch.cat([p.bias for p in projections]))

    def observed_logits(self, x: torch.Tensor, memory: Optional[torch.Tensor] = None,
                        attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                        packing: Optional[Packing] = None,
                        memory_packing: Optional[Packing] = None
                        ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """For observers only (runner/run/telemetry.py), never on the training path: the logits
        q k^T * scale that `forward` with these arguments hands its kernel, recomputed from the
        inputs, (B, H, Tq, Tk) in float32, and the bool mask of the keys each query may attend
        (True = attend; attn_mask and is_causal combined, None = all), broadcastable to them.
        q and k are projected separately (the fused matmul equals that up to rounding) and
        QK-normed as in forward; packed inputs are unpacked to the padded layout."""
        if packing is not None:
            source, layout = (x, packing) if memory is None else (memory, memory_packing)
            q, k = packing.unpack(self.q_proj(x)), layout.unpack(self.k_proj(source))
        else:
            q, k = self.q_proj(x), self.k_proj(x if memory is None else memory)
        q, k = self._norm_q(self._split(q)), self._norm_k(self._split(k))
        logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * self.scale
        allowed = attn_mask
        if is_causal:
            tq, tk = logits.shape[-2:]
            causal = torch.ones(tq, tk, dtype=torch.bool, device=logits.device).tril()
            allowed = causal if allowed is None else allowed & causal
        return logits, allowed

    # Training on the real tokens only.

    def _packed_forward(self, x: torch.Tensor, memory: Optional[torch.Tensor],
                        attn_mask: Optional[torch.Tensor], is_causal: bool, packing: Packing,
                        memory_packing: Optional[Packing]) -> torch.Tensor:
        """forward for unpadded rows: the projections run on the real tokens only and are
        unpacked to the padded layout (zeros at the pads, which the masks ignore) for attention;
        the heads are packed back before the output projection."""
        if memory is None and self.fuse_qkv:
            qkv = F.linear(x, *self._concatenated(self.q_proj, self.k_proj, self.v_proj))
            q, k, v = packing.unpack(qkv).chunk(3, dim=-1)
        elif memory is not None and self.fuse_kv:
            weight, bias = self._concatenated(self.k_proj, self.v_proj)
            q = packing.unpack(self.q_proj(x))
            k, v = memory_packing.unpack(F.linear(memory, weight, bias)).chunk(2, dim=-1)
        else:
            source, layout = (x, packing) if memory is None else (memory, memory_packing)
            q = packing.unpack(self.q_proj(x))
            k = layout.unpack(self.k_proj(source))
            v = layout.unpack(self.v_proj(source))
        q, k, v = self._split(q), self._split(k), self._split(v)
        q, k = self._norm_q(q), self._norm_k(k)
        out = self._attention(q, k, v, attn_mask, is_causal)
        return self.out_proj(packing.pack_heads(out))

    # Incremental decoding.

    def _decoding_step(self, x: torch.Tensor, memory: Optional[torch.Tensor],
                       attn_mask: Optional[torch.Tensor], cache: dict) -> torch.Tensor:
        """One decoding step: x holds the new positions only. Self-attention (memory None)
        appends their keys/values to the cache and attends over all of them; cross-attention
        projects the encoder keys/values once per sentence into the cache. With cache["group"]
        = g > 1 (cross-attention in beam search), x has g consecutive rows (the beams) per row
        of memory's keys/values and of attn_mask; the beams become the query positions of their
        sentence, so the encoder keys/values are read once per sentence instead of once per
        beam. Never causal, no dropout: callers feed one new position per step, and the cache
        holds only earlier ones (several new positions in one call would see each other)."""
        if memory is None:
            if self.fuse_qkv:  # weights are fixed while decoding: concatenate once per call
                if "qkv" not in cache:  # a tuple, so cache reorders (tensors only) skip it
                    cache["qkv"] = self._concatenated(self.q_proj, self.k_proj, self.v_proj)
                q, k, v = (self._split(t) for t in F.linear(x, *cache["qkv"]).chunk(3, dim=-1))
                k = self._norm_k(k)
            else:
                q = self._split(self.q_proj(x))
                k, v = self.project_kv(x)  # keys QK-normed there
            q = self._norm_q(q)
            k, v = self._append(cache, k, v)
            group = 1
        else:
            q = self._norm_q(self._split(self.q_proj(x)))
            if "k" not in cache:
                cache["k"], cache["v"] = self.project_kv(memory, contiguous=True)
            k, v = cache["k"], cache["v"]
            group = cache.get("group", 1)
        rows, h, _, dh = q.shape
        if group > 1:  # (sentences * group, H, 1, Dh) -> (sentences, H, group, Dh)
            q = q.view(rows // group, group, h, dh).transpose(1, 2)
        kernel = self.kernels.decoding(q.shape[-2])
        out = self._merge(kernel(q, k, v, attn_mask, self.scale))
        if group > 1:  # (sentences, group, D) -> (sentences * group, 1, D)
            out = out.reshape(rows, 1, h * dh)
        return self.out_proj(out)

    def project_kv(self, memory: torch.Tensor, contiguous: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (QK-normed when model.qk_norm is on) and values of `memory`, (B, H, S, Dh) each.
        contiguous=True for keys/values cached over decoding steps: the (B, H, S, Dh) view of
        a (B, S, D) projection cannot be batched by matmul without a copy, so copy it once."""
        k, v = self._norm_k(self._split(self.k_proj(memory))), self._split(self.v_proj(memory))
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
