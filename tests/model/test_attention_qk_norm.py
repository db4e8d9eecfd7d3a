"""QK-norm (model.qk_norm, runner/model/attention.py): each head's queries and keys normalized
before the dot product, checked against the attention written out by hand from the module's
weights, in full, cached and beam decoding, and the temperature g0 from the config."""
from __future__ import annotations

import math

import pytest
import torch

from runner import init as init_schemes
from runner.model import kernels
from runner.model.attention import QK_NORM_EPS, L2Norm, MultiheadAttention
from runner.run.build import model_for as build_model
from tests.conftest import TINY, compose
from tests.method_helpers import PAD, VOCAB, initialized, make_batch, make_cfg

DIM, HEADS = 16, 2


# ----------------------------------------------------------------------------- QK-norm
class RecordingKernels:
    """Stands in for AttentionKernels: records q, k and the scale each kernel call receives."""

    def __init__(self):
        self.calls = []

    def full(self, keys):
        def kernel(q, k, v, mask, scale, is_causal=False, dropout_p=0.0):
            self.calls.append((q.detach(), k.detach(), scale))
            return kernels.matmul_attention(q, k, v, mask, scale, is_causal, dropout_p)
        return kernel

    def decoding(self, queries):
        def kernel(q, k, v, mask, scale):
            self.calls.append((q.detach(), k.detach(), scale))
            return kernels.matmul_decoding_attention(q, k, v, mask, scale)
        return kernel


def qk_module(kind: str, self_attention: bool = True, dtype=torch.float64, perturb: bool = True):
    torch.manual_seed(0)
    m = MultiheadAttention(DIM, HEADS, 0.0, qk_norm=kind, qk_temperature=3.7,
                           self_attention=self_attention).to(dtype)
    if perturb:  # nonzero biases and norm gains away from 1, so each must enter the computation
        with torch.no_grad():
            for name, p in m.named_parameters():
                if p.dim() == 1 and name != "qk_temperature":
                    p.normal_()
    return m


def by_hand(m: MultiheadAttention, kind: str, x, memory=None, mask=None, causal=False):
    """The attention of Henry et al. / Dehghani et al. written out from m's weights."""
    dh = DIM // HEADS

    def heads(t):
        return t.view(t.shape[0], t.shape[1], HEADS, dh).transpose(1, 2)

    def proj(layer, t):
        return t @ layer.weight.T + layer.bias

    def norm(t, module):
        if kind == "layernorm":
            mean, var = t.mean(-1, keepdim=True), t.var(-1, unbiased=False, keepdim=True)
            return (t - mean) / torch.sqrt(var + QK_NORM_EPS) * module.weight + module.bias
        if kind == "rmsnorm":
            return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + QK_NORM_EPS) * module.weight
        return t / t.norm(dim=-1, keepdim=True)

    source = x if memory is None else memory
    q = norm(heads(proj(m.q_proj, x)), m.q_norm)
    k = norm(heads(proj(m.k_proj, source)), m.k_norm)
    v = heads(proj(m.v_proj, source))
    scale = m.qk_temperature if kind == "l2" else 1 / math.sqrt(dh)
    logits = q @ k.transpose(-1, -2) * scale
    if causal:
        logits = logits.masked_fill(torch.ones(logits.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    out = logits.softmax(-1) @ v
    return proj(m.out_proj, out.transpose(1, 2).reshape(x.shape[0], x.shape[1], DIM))


def key_mask(lengths, keys):
    return (torch.arange(keys) < torch.tensor(lengths)[:, None])[:, None, None, :]


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "l2"])
@pytest.mark.parametrize("cross", [False, True])
def test_qk_norm_normalizes_every_head_before_the_dot_product(kind, cross):
    """What reaches the kernel: l2 keys of unit length and queries of length g (the temperature
    folded in, scale 1); layernorm zero mean and unit variance per head; rmsnorm unit mean
    square per head (gains 1, biases 0 as at init); scale 1/sqrt(Dh) for both."""
    m = qk_module(kind, self_attention=not cross, dtype=torch.float32, perturb=False)
    recorder = m.kernels = RecordingKernels()
    torch.manual_seed(1)
    x = torch.randn(3, 5, DIM) * 4 + 1
    memory = torch.randn(3, 6, DIM) * 3 - 2 if cross else None
    m(x, memory)
    (q, k, scale), = recorder.calls
    assert q.shape == (3, HEADS, 5, DIM // HEADS) and k.shape[-2] == (6 if cross else 5)
    for t, expected_norm in ((q, 3.7 if kind == "l2" else None), (k, 1.0 if kind == "l2" else None)):
        if kind == "l2":
            torch.testing.assert_close(t.norm(dim=-1), torch.full(t.shape[:-1], expected_norm))
        elif kind == "layernorm":
            torch.testing.assert_close(t.mean(-1), torch.zeros(t.shape[:-1]), atol=1e-5, rtol=0)
            torch.testing.assert_close(t.var(-1, unbiased=False), torch.ones(t.shape[:-1]), atol=1e-3, rtol=0)
        else:
            torch.testing.assert_close(t.pow(2).mean(-1), torch.ones(t.shape[:-1]), atol=1e-3, rtol=0)
    assert scale == (1.0 if kind == "l2" else 1 / math.sqrt(DIM // HEADS))


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "l2"])
@pytest.mark.parametrize("case", ["causal", "cross_pad_mask", "long_keys"])
def test_qk_norm_attention_equals_the_formula_by_hand(kind, case):
    """Outputs and gradients (weights, norm gains, g included) against by_hand(); long_keys takes
    the CPU sdpa kernel (more than CPU_MATMUL_ATTENTION_MAX_KEYS keys)."""
    cross = case.startswith("cross")
    m = qk_module(kind, self_attention=not cross).train()
    torch.manual_seed(2)
    t = kernels.CPU_MATMUL_ATTENTION_MAX_KEYS + 5 if case == "long_keys" else 6
    x = torch.randn(3, t, DIM, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(3, 8, DIM, dtype=torch.float64, requires_grad=True) if cross else None
    mask = key_mask([8, 5, 2], 8) if cross else None
    causal = case == "causal"
    out = m(x, memory, attn_mask=mask, is_causal=causal)
    want = by_hand(m, kind, x, memory, mask, causal)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    weights = torch.randn_like(out)
    inputs = [x] + ([memory] if cross else [])
    params = list(m.parameters())
    got = torch.autograd.grad((out * weights).sum(), inputs + params)
    ref = torch.autograd.grad((want * weights).sum(), inputs + params)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    if kind == "l2":  # g is learned: it gets a gradient
        index = len(inputs) + next(i for i, p in enumerate(params) if p is m.qk_temperature)
        assert float(got[index].abs()) > 0


@pytest.mark.parametrize("kind", ["layernorm", "l2"])
def test_qk_norm_caches_hold_normalized_keys_and_decoding_equals_the_formula(kind):
    """Self-attention one position per step and cross-attention with cached keys (also the
    beams-as-a-group path of beam search): every step equals by_hand over the whole prefix, and
    the cached keys are the normalized ones."""
    self_attn = qk_module(kind).eval()
    cross_attn = qk_module(kind, self_attention=False).eval()
    torch.manual_seed(3)
    steps, src = 18, 9
    x = torch.randn(3, steps, DIM, dtype=torch.float64)
    memory = torch.randn(3, src, DIM, dtype=torch.float64)
    mask = key_mask([src, 5, 2], src)
    self_cache, cross_cache = {}, {}
    with torch.no_grad():
        want_self = by_hand(self_attn, kind, x, causal=True)
        want_cross = by_hand(cross_attn, kind, want_self, memory, mask)
        for t in range(steps):
            y = self_attn(x[:, t:t + 1], cache=self_cache)
            torch.testing.assert_close(y, want_self[:, t:t + 1], rtol=1e-6, atol=1e-6)
            z = cross_attn(want_self[:, t:t + 1], memory, attn_mask=mask, cache=cross_cache)
            torch.testing.assert_close(z, want_cross[:, t:t + 1], rtol=1e-6, atol=1e-6)
        k_raw = (memory @ cross_attn.k_proj.weight.T + cross_attn.k_proj.bias).view(3, src, HEADS, -1).transpose(1, 2)
        torch.testing.assert_close(cross_cache["k"], cross_attn.k_norm(k_raw))
        if kind == "l2":
            torch.testing.assert_close(self_cache["k"][:, :, :steps].norm(dim=-1),
                                       torch.ones(3, HEADS, steps, dtype=torch.float64))
        beams, group_cache = 4, {"group": 4}
        xb = torch.randn(3 * beams, 1, DIM, dtype=torch.float64)
        want = by_hand(cross_attn, kind, xb, memory.repeat_interleave(beams, 0),
                       mask.repeat_interleave(beams, 0))
        torch.testing.assert_close(cross_attn(xb, memory, attn_mask=mask, cache=group_cache), want,
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "l2"])
def test_qk_norm_model_incremental_decoding_and_unpadded_training_match(kind):
    cfg = make_cfg(model={"qk_norm": kind})
    model = initialized(cfg).eval()
    src, prev, tgt = make_batch()
    with torch.no_grad():
        memory, mask = model.encode(src)
        full = model.decode(prev, memory, mask)
        caches = [{} for _ in model.decoder.layers]
        steps = [model.decode(prev[:, t:t + 1], memory, mask, caches, start=t) for t in range(prev.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    model.train()
    keep = prev != PAD  # the packed logits are those of the real decoder inputs
    padded = model(src, prev)
    packed = model(src, prev, unpad=True)
    torch.testing.assert_close(packed, padded[keep], rtol=1e-5, atol=1e-5)
    n_norms = sum(1 for name, _ in model.norms() if name.endswith(("q_norm", "k_norm")))
    assert n_norms == (0 if kind == "l2" else 2 * (2 + 2 * 2))  # q and k per attention module



@pytest.mark.parametrize("overrides, g0", [
    # the default: Henry et al.'s own g0 = log2(L^2 - L) at L = 72 (QKN configurations.py)
    (["model.qk_norm=l2"], math.log2(72 ** 2 - 72)),
    # method=qk_norm with the temperature the schemes-scaling presets set for Multi30k (L = 27)
    (["method=qk_norm", "model.qk_norm_temperature=9.455"], 9.455),
])
def test_qk_norm_temperature_reaches_every_attention_from_the_config(overrides, g0):
    """The composed config's g0 is the initial temperature of every self- and cross-attention
    module after the init scheme has run (the scheme must not reset it)."""
    cfg = compose([*TINY, *overrides])
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB, VOCAB, PAD)
    init_schemes.apply(model, cfg, None)
    attentions = [m for m in model.modules() if isinstance(m, MultiheadAttention)]
    layers = cfg.model.encoder_layers or cfg.model.layers, cfg.model.decoder_layers or cfg.model.layers
    assert len(attentions) == layers[0] + 2 * layers[1]  # encoder self; decoder self and cross
    for m in attentions:
        assert isinstance(m.q_norm, L2Norm) and isinstance(m.k_norm, L2Norm)
        assert m.scale == 1.0  # l2: g replaces 1/sqrt(Dh)
        assert m.qk_temperature.item() == pytest.approx(g0, abs=5e-4)
    if "method=qk_norm" in overrides:  # the paper's setting: Pre-LN with FixNorm
        assert cfg.norm.placement == "pre" and cfg.model.fixnorm
