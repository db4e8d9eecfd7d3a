"""MultiheadAttention against a direct implementation of its maths, on every kernel path.

reference() below is softmax(q k^T * scale + mask) v with the module's own weights, written out
with no fusion, no cache and no kernel choice; each test runs one of the module's paths (CPU
matmul kernel for short keys, sdpa beyond CPU_MATMUL_ATTENTION_MAX_KEYS, packed rows, decoding
with self- and cross-attention caches, beams attending as a group) and compares outputs and
gradients with it. Dropout is 0 throughout.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from runner.model import kernels
from runner.model.attention import MultiheadAttention
from runner.model.packing import Packing

DIM, HEADS = 16, 2
TOL = {torch.float64: 1e-6, torch.float32: 1e-5}


def reference(m: MultiheadAttention, x, memory=None, mask=None, causal=False, ntk=False):
    """The attention maths for module m's weights. ntk: each projection's weight is scaled by
    1/sqrt(fan_in) in the forward pass (the NTK parameterization)."""
    w_scale = 1.0 / math.sqrt(DIM) if ntk else 1.0

    def proj(layer, t):
        return t @ (layer.weight * w_scale).T + layer.bias

    def heads(t):
        b, n, _ = t.shape
        return t.view(b, n, HEADS, DIM // HEADS).transpose(1, 2)

    source = x if memory is None else memory
    q, k, v = heads(proj(m.q_proj, x)), heads(proj(m.k_proj, source)), heads(proj(m.v_proj, source))
    logits = q @ k.transpose(-1, -2) * m.scale
    if causal:
        logits = logits.masked_fill(
            torch.ones(logits.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    out = logits.softmax(-1) @ v
    b, _, t, _ = out.shape
    return proj(m.out_proj, out.transpose(1, 2).reshape(b, t, DIM))


def module(dtype=torch.float64, parameterization="standard", logit_scale="standard",
           self_attention=True) -> MultiheadAttention:
    torch.manual_seed(0)
    m = MultiheadAttention(DIM, HEADS, dropout=0.0, parameterization=parameterization,
                           logit_scale=logit_scale, self_attention=self_attention).to(dtype)
    with torch.no_grad():  # nonzero biases, so a wrong bias concatenation would show
        for p in m.parameters():
            if p.dim() == 1:
                p.normal_()
    return m


def key_mask(lengths, keys):
    return (torch.arange(keys) < torch.tensor(lengths)[:, None])[:, None, None, :]


def assert_same_outputs_and_grads(m, run, expect, inputs, dtype):
    tol = TOL[dtype]
    out, want = run(), expect()
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)
    weights = torch.randn_like(out)
    params = list(m.parameters())
    got = torch.autograd.grad((out * weights).sum(), inputs + params)
    ref = torch.autograd.grad((want * weights).sum(), inputs + params)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("keys", [9, kernels.CPU_MATMUL_ATTENTION_MAX_KEYS + 22])  # matmul, sdpa
@pytest.mark.parametrize("case", ["self", "self_pad_mask", "causal", "cross", "cross_pad_mask"])
@pytest.mark.parametrize("parameterization,logit_scale", [("standard", "standard"), ("ntk", "t5")])
def test_cpu_training_equals_reference(dtype, keys, case, parameterization, logit_scale):
    cross = case.startswith("cross")
    m = module(dtype, parameterization, logit_scale, self_attention=not cross).train()
    torch.manual_seed(1)
    x = torch.randn(3, 7 if cross else keys, DIM, dtype=dtype, requires_grad=True)
    memory = torch.randn(3, keys, DIM, dtype=dtype, requires_grad=True) if cross else None
    mask = key_mask([keys, 4, 1], keys) if case.endswith("pad_mask") else None
    causal = case == "causal"
    inputs = [x] + ([memory] if cross else [])
    assert_same_outputs_and_grads(
        m, lambda: m(x, memory, attn_mask=mask, is_causal=causal),
        lambda: reference(m, x, memory, mask, causal, ntk=parameterization == "ntk"),
        inputs, dtype)


@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
@pytest.mark.parametrize("cross", [False, True])
def test_packed_training_equals_reference(parameterization, cross):
    """Unpadded rows (packing): the real positions of the output equal the padded reference."""
    dtype = torch.float64
    m = module(dtype, parameterization, self_attention=not cross).train()
    torch.manual_seed(2)
    q_len, k_len = [6, 2, 4], [5, 3, 1]
    keep = torch.arange(6) < torch.tensor(q_len)[:, None]
    x = torch.randn(3, 6, DIM, dtype=dtype, requires_grad=True)
    memory = torch.randn(3, 5, DIM, dtype=dtype, requires_grad=True) if cross else None
    packing = Packing(keep)
    memory_packing = Packing(torch.arange(5) < torch.tensor(k_len)[:, None]) if cross else None
    mask = key_mask(k_len if cross else q_len, 5 if cross else 6)
    inputs = [x] + ([memory] if cross else [])
    assert_same_outputs_and_grads(
        m, lambda: m(packing.pack(x), None if memory is None else memory_packing.pack(memory),
                     attn_mask=mask, packing=packing, memory_packing=memory_packing),
        lambda: reference(m, x, memory, mask, ntk=parameterization == "ntk")[keep],
        inputs, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
def test_decoding_with_caches_equals_reference(dtype, parameterization):
    """Self-attention appending to its cache one position per step (past the first buffer
    capacity of 16) and cross-attention with its keys/values cached: each step equals the
    reference over the whole prefix."""
    ntk = parameterization == "ntk"
    self_attn = module(dtype, parameterization).eval()
    cross_attn = module(dtype, parameterization, self_attention=False).eval()
    torch.manual_seed(3)
    steps, src = 20, 9
    x = torch.randn(3, steps, DIM, dtype=dtype)
    memory = torch.randn(3, src, DIM, dtype=dtype)
    mask = key_mask([src, 5, 2], src)
    self_cache, cross_cache = {}, {}
    tol = TOL[dtype]
    with torch.no_grad():
        want_self = reference(self_attn, x, causal=True, ntk=ntk)
        want_cross = reference(cross_attn, want_self, memory, mask, ntk=ntk)
        for t in range(steps):
            y = self_attn(x[:, t:t + 1], cache=self_cache)
            torch.testing.assert_close(y, want_self[:, t:t + 1], rtol=tol, atol=tol)
            z = cross_attn(want_self[:, t:t + 1], memory, attn_mask=mask, cache=cross_cache)
            torch.testing.assert_close(z, want_cross[:, t:t + 1], rtol=tol, atol=tol)
    assert self_cache["len"] == steps


@pytest.mark.parametrize("keys", [9, kernels.CPU_MATMUL_ATTENTION_MAX_KEYS + 22])
def test_grouped_cross_attention_equals_reference(keys):
    """Beam search: cache["group"] = beams rows of x per sentence of memory and mask."""
    beams, dtype = 4, torch.float64
    m = module(dtype, self_attention=False).eval()
    torch.manual_seed(4)
    memory = torch.randn(2, keys, DIM, dtype=dtype)
    mask = key_mask([keys, 3], keys)
    cache = {"group": beams}
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2 * beams, 1, DIM, dtype=dtype)
            want = reference(m, x, memory.repeat_interleave(beams, 0),
                             mask.repeat_interleave(beams, 0))
            torch.testing.assert_close(m(x, memory, attn_mask=mask, cache=cache), want,
                                       rtol=1e-6, atol=1e-6)


def _linear_weight_shapes(monkeypatch) -> list[tuple[int, ...]]:
    shapes = []
    real_linear = F.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, w, b=None: shapes.append(tuple(w.shape)) or real_linear(x, w, b))
    return shapes


def test_qkv_fused_only_for_standard_self_attention(monkeypatch):
    """Fusion is fixed at construction from the parameterization: plain affine projections
    (standard) run q/k/v of self-attention as one matmul; NTK scales its weights in forward,
    so its projections never fuse."""
    assert MultiheadAttention(DIM, HEADS, 0.0, "standard").fuse_qkv
    assert not MultiheadAttention(DIM, HEADS, 0.0, "ntk").fuse_qkv
    assert not MultiheadAttention(DIM, HEADS, 0.0, "standard", self_attention=False).fuse_qkv
    assert not MultiheadAttention(DIM, HEADS, 0.0, "ntk", self_attention=False).fuse_kv
    x = torch.randn(2, 5, DIM)
    shapes = _linear_weight_shapes(monkeypatch)
    MultiheadAttention(DIM, HEADS, 0.0, "standard")(x)
    assert shapes == [(3 * DIM, DIM), (DIM, DIM)]  # fused q/k/v, then out_proj
    shapes.clear()
    MultiheadAttention(DIM, HEADS, 0.0, "ntk")(x)
    assert shapes == [(DIM, DIM)] * 4  # q, k, v, out separately
    shapes.clear()
    MultiheadAttention(DIM, HEADS, 0.0, "ntk")(x, cache={})
    assert shapes == [(DIM, DIM)] * 4


def test_kernel_selection():
    select, limit = kernels.select_attention, kernels.CPU_MATMUL_ATTENTION_MAX_KEYS
    assert select("cpu", 7, limit, decoding=False) is kernels.matmul_attention
    assert select("cpu", 7, limit + 1, decoding=False) is kernels.sdpa_attention
    assert select("cpu", 1, 500, decoding=True) is kernels.single_query_decoding_attention
    assert select("cpu", 5, 500, decoding=True) is kernels.matmul_decoding_attention
    for decoding in (False, True):
        assert select("cuda", 1, 7, decoding=decoding) is kernels.sdpa_attention


def test_kernels_are_chosen_when_the_model_is_placed():
    from runner.model.seq2seq import Seq2Seq
    from runner.model.sublayer import ResidualSpec
    from tests.conftest import compose

    cfg = compose(["model=ci"])
    model = Seq2Seq(cfg.model, cfg.norm, 20, 20, 1, ResidualSpec())
    attentions = [m for m in model.modules() if isinstance(m, MultiheadAttention)]
    assert attentions and all(m.kernels.device_type == "cpu" for m in attentions)
    assert attentions[0].kernels.full(7) is kernels.matmul_attention
    model.select_kernels("cuda")  # what build_run does after model.to(device)
    assert all(m.kernels.device_type == "cuda" for m in attentions)
    assert attentions[0].kernels.full(7) is kernels.sdpa_attention
    assert attentions[0].kernels.decoding(1) is kernels.sdpa_attention
