"""B2T connection, ResiDual, Dynamic Tanh, ScaleNorm and FixNorm (runner/model/norms.py and the
placements in runner/model/sublayer.py): each forward quantity recomputed from the paper's
equation with hand-built tensors (torch's functional ops, not the model's code paths), the init
values, and `analyze grad-norms` on the new norms. Which init schemes accept B2T and ResiDual:
tests/init/test_requirements.py; a training run per method: tests/run/test_train.py."""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from runner.config import ConfigError
from runner.model.norms import DynamicTanh, ScaleNorm
from runner.model.sublayer import PLACEMENTS
from runner.run.build import check_config
from tests.conftest import compose
from tests.method_helpers import SMALL, assert_grad_norms_finite, ln, model_for, one_thread, randomize_norms  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


# ----- B2T connection -----

@torch.no_grad()
def test_b2t_encoder_and_decoder_layers_follow_the_equation():
    """Encoder: h = LN1(x + SA(x)), y = LN2(x + h + FFN(h)). Decoder: h1 = LN1(x + SA(x)),
    h = LN2(h1 + CA(h1, m)), y = LN3(x + h + FFN(h)); x is the layer input."""
    _, model, _ = model_for(["norm=b2t"])
    gen = torch.Generator().manual_seed(1)
    randomize_norms(model, gen)
    d = model.cfg.dim
    x = torch.randn(2, 5, d, generator=gen)
    enc = model.encoder.layers[0]
    h = ln(enc.self_attn.post_norm, x + enc.self_attn.branch(x))
    want = ln(enc.ffn.post_norm, x + h + enc.ffn.branch(h))
    torch.testing.assert_close(enc(x, None), want)
    # without the bottom-to-top term it would be Post-LN: the test sees the difference
    assert not torch.allclose(enc(x, None), ln(enc.ffn.post_norm, h + enc.ffn.branch(h)), atol=1e-3)

    dec = model.decoder.layers[1]
    memory = torch.randn(2, 7, d, generator=gen)
    h1 = ln(dec.self_attn.post_norm, x + dec.self_attn.branch(x, is_causal=True))
    h = ln(dec.cross_attn.post_norm, h1 + dec.cross_attn.branch(h1, memory=memory))
    want = ln(dec.ffn.post_norm, x + h + dec.ffn.branch(h))
    torch.testing.assert_close(dec(x, memory, None), want)
    assert isinstance(model.encoder.final_norm, torch.nn.Identity)  # Post-LN: no final norm


def test_b2t_rescales_branch_weights_by_depth_after_the_scheme():
    """takase/b2t_connection@c8e2ad4 rescaling_init: every branch weight (q/k/v/out, fc1/fc2) of
    a stack times layers^-1/2; biases, norms, embeddings untouched. Off: Post-LN's weights."""
    depth = ["model.encoder_layers=3", "model.decoder_layers=2"]
    _, post, _ = model_for(["norm=post", *depth])
    _, b2t, _ = model_for(["norm=b2t", *depth])
    _, plain, _ = model_for(["norm=b2t", "norm.b2t_rescale_init=false", *depth])
    factor = {"encoder": 3 ** -0.5, "decoder": 2 ** -0.5}
    assert post.state_dict().keys() == b2t.state_dict().keys()  # the same slots as Post-LN
    a, b, c = post.state_dict(), b2t.state_dict(), plain.state_dict()
    scaled = 0
    for key in a:
        branch_weight = ".layers." in key and key.endswith("_proj.weight") or key.endswith(
            ("fc1.weight", "fc2.weight"))
        if branch_weight and "norm" not in key:
            torch.testing.assert_close(b[key], a[key] * factor[key.split(".")[0]])
            scaled += 1
        else:
            assert torch.equal(b[key], a[key]), key
        assert torch.equal(c[key], a[key]), key
    assert scaled == 3 * 6 + 2 * 10  # q/k/v/out + fc1/fc2 per encoder layer, 2 attentions + FFN per decoder layer


@torch.no_grad()
def test_b2t_per_stack_and_incremental_decoding():
    """norm.encoder_placement=b2t with a Post-LN decoder: only the encoder has the shortcut;
    cached step-by-step decoding equals the full decoder pass."""
    _, model, batch = model_for(["norm=post", "norm.encoder_placement=b2t"])
    assert all(layer.bottom_to_top for layer in model.encoder.layers)
    assert not any(layer.bottom_to_top for layer in model.decoder.layers)
    _, full_b2t, batch = model_for(["norm=b2t"])
    check_incremental(full_b2t, batch)
    _, mixed, batch = model_for(["norm=post", "norm.encoder_placement=resi_dual",
                                 "norm.decoder_placement=b2t"])
    assert mixed.encoder.dual is not None and mixed.decoder.dual is None
    check_incremental(mixed, batch)


def check_incremental(model, batch):
    memory, mask = model.encode(batch.src_tokens, batch.src_has_pad)
    prev = batch.prev_tokens[:, :6]
    full = model.decode(prev, memory, mask)
    caches = [{} for _ in model.decoder.layers]
    steps = [model.decode(prev[:, t:t + 1], memory, mask, caches, start=t) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


# ----- ResiDual -----

@torch.no_grad()
def test_resi_dual_follows_the_equation():
    """x_{k+1} = LN_k(x_k + F_k(x_k)), d_0 = s x_0, d_{k+1} = d_k + s F_k(x_k), encoder output
    alpha x_N + LN(d_N) (LN eps 1e-7), recomputed sublayer by sublayer from the branches."""
    s, alpha = 0.3, 0.7
    _, model, batch = model_for(["norm=resi_dual", f"norm.resi_dual_scale={s}",
                                 f"norm.resi_dual_alpha={alpha}"])
    gen = torch.Generator().manual_seed(2)
    randomize_norms(model, gen)
    assert model.encoder.final_norm.eps == 1e-7  # microsoft/ResiDual resi_dual.py
    src = batch.src_tokens
    mask = (src != model.pad_index)[:, None, None, :]
    x = model.encoder.embedder(src)
    d = s * x
    for layer in model.encoder.layers:
        for sub, kwargs in ((layer.self_attn, {"attn_mask": mask}), (layer.ffn, {})):
            f = sub.branch(x, **kwargs)
            x = ln(sub.post_norm, x + f)
            d = d + s * f
    want = alpha * x + ln(model.encoder.final_norm, d)
    memory, _ = model.encode(src)
    keep = src != model.pad_index
    torch.testing.assert_close(memory[keep], want[keep])
    # the same through the unpadded training path
    logits = model(src, batch.prev_tokens, unpad=True)
    torch.testing.assert_close(logits, model(src, batch.prev_tokens)[batch.target != model.pad_index],
                               atol=1e-5, rtol=1e-5)
    check_incremental(model, batch)


@torch.no_grad()
def test_resi_dual_with_s_zero_is_post_ln_plus_the_final_bias():
    """s = 0: d_0 = 0 and d_N = 0, so LN(d_N) = (0 - 0) / sqrt(0 + eps) * g + b = b, and with
    alpha = 1 each stack outputs x_N + b: Post-LN's output plus the final norm's bias (x_N
    exactly at init, b = 0). State_dict: Post-LN's keys plus Pre-LN's final-norm keys."""
    _, post, batch = model_for(["norm=post"])
    _, dual, _ = model_for(["norm=resi_dual", "norm.resi_dual_scale=0"])
    _, pre, _ = model_for(["norm=pre"])
    extra = set(dual.state_dict()) - set(post.state_dict())
    assert set(post.state_dict()) <= set(dual.state_dict())
    assert extra == {f"{s}.final_norm.{p}" for s in ("encoder", "decoder") for p in ("weight", "bias")}
    assert extra <= set(pre.state_dict())
    src, prev = batch.src_tokens, batch.prev_tokens
    # at init (b = 0): exactly Post-LN's logits
    torch.testing.assert_close(dual(src, prev), post(src, prev))
    gen = torch.Generator().manual_seed(3)
    bias = {side: torch.randn(post.cfg.dim, generator=gen) for side in ("encoder", "decoder")}
    for side in bias:
        getattr(dual, side).final_norm.bias.copy_(bias[side])
    memory, mask = dual.encode(src)
    post_memory, _ = post.encode(src)
    torch.testing.assert_close(memory, post_memory + bias["encoder"])
    y = post.decoder.embedder(prev)
    for layer in post.decoder.layers:
        y = layer(y, memory, mask)
    want = F.linear(y + bias["decoder"], post.output_projection_weight)
    torch.testing.assert_close(dual.decode(prev, memory, mask), want)


def test_resi_dual_needs_its_final_norm():
    with pytest.raises(ConfigError, match="norm.final_norm"):
        check_config(compose(["norm=resi_dual", "norm.final_norm=false"]))
    with pytest.raises(ConfigError, match="resi_dual_scale"):
        check_config(compose(["norm=resi_dual", "norm.resi_dual_scale=-1"]))


# ----- Dynamic Tanh -----

@torch.no_grad()
def test_dyt_equals_gamma_tanh_alpha_x_plus_beta_and_is_bounded():
    gen = torch.Generator().manual_seed(4)
    dyt = DynamicTanh(8, alpha_init=0.5)
    assert float(dyt.alpha) == 0.5 and torch.equal(dyt.weight, torch.ones(8))
    assert torch.equal(dyt.bias, torch.zeros(8))
    gamma, beta = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    dyt.weight.copy_(gamma)
    dyt.bias.copy_(beta)
    dyt.alpha.fill_(1.7)
    x = 100 * torch.randn(4, 3, 8, generator=gen)  # far into saturation
    y = dyt(x)
    torch.testing.assert_close(y, gamma * torch.tanh(1.7 * x) + beta)
    assert (y.abs() <= gamma.abs() + beta.abs() + 1e-6).all()
    dyt.reset_parameters()
    assert float(dyt.alpha) == 0.5


def test_dyt_replaces_every_norm_with_alpha_from_the_config():
    """Every placement with norm.kind=dyt: all norms (sublayer slots and final norms) are DyT
    with alpha = norm.dyt_alpha after the init scheme, and the forward/backward is finite."""
    for placement in PLACEMENTS:
        _, model, batch = model_for([f"norm={placement}", "norm.kind=dyt", "norm.dyt_alpha=0.3"])
        norms = [m for _, m in model.norms()]
        assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
        assert all(isinstance(m, DynamicTanh) for m in norms)
        assert all(m.alpha.item() == pytest.approx(0.3) for m in norms)
        if placement != "none":
            assert norms
        model.train()
        loss = model(batch.src_tokens, batch.prev_tokens).float().logsumexp(-1).mean()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with pytest.raises(ConfigError, match="norm.dyt_alpha"):
        check_config(compose(["norm.kind=dyt", "norm.dyt_alpha=0"]))


# ----- ScaleNorm and FixNorm -----

@torch.no_grad()
def test_scalenorm_is_g_x_over_norm_with_g_sqrt_d():
    _, model, _ = model_for(["norm=pre", "norm.kind=scalenorm"])
    d = model.cfg.dim
    norms = [m for _, m in model.norms()]
    assert norms and all(isinstance(m, ScaleNorm) for m in norms)
    assert all(m.weight.shape == (1,) and float(m.weight) == pytest.approx(math.sqrt(d)) for m in norms)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, d, generator=gen)
    norm = norms[0]
    want = math.sqrt(d) * x / torch.sqrt((x * x).sum(-1, keepdim=True))
    torch.testing.assert_close(norm(x), want)
    torch.testing.assert_close(norm(x).pow(2).sum(-1).sqrt(), torch.full((3, 4), math.sqrt(d)))
    assert torch.equal(norm(torch.zeros(2, d)), torch.zeros(2, d))  # clamped at eps, no NaN


@torch.no_grad()
def test_fixnorm_uses_unit_length_rows_in_and_out():
    """Embedding rows enter at unit length (times sqrt(d) when model.embed_scale, as the
    reference) and the logits use the unit-length rows; the parameter itself stays free."""
    for share in ("all", "none"):
        cfg, model, batch = model_for(["model.fixnorm=true", "model.embed_scale=false",
                                       f"model.share_embeddings={share}"])
        table = model.encoder.embedder.tokens.weight
        table.mul_(torch.rand(table.shape[0], 1) * 5 + 0.1)  # rows of any length
        tokens = batch.src_tokens
        emb = model.encoder.embedder(tokens) - model.encoder.embedder.positions[:tokens.shape[1]]
        lengths = emb.norm(dim=-1)
        real = tokens != model.pad_index
        torch.testing.assert_close(lengths[real], torch.ones(int(real.sum())))
        assert torch.equal(lengths[~real], torch.zeros(int((~real).sum())))
        memory, mask = model.encode(tokens)
        hidden = {}
        handle = model.decoder.layers[-1].register_forward_hook(
            lambda m, a, out: hidden.__setitem__("h", out))
        logits = model.decode(batch.prev_tokens, memory, mask)
        handle.remove()
        weight = model.output_projection_weight
        unit = weight / weight.norm(dim=-1, keepdim=True).clamp(min=1e-12)  # the pad row is 0
        torch.testing.assert_close(logits, hidden["h"] @ unit.T)
    _, scaled, batch = model_for(["model.fixnorm=true"])  # embed_scale on: length sqrt(d)
    tokens = batch.src_tokens[:, :1]
    emb = scaled.encoder.embedder(tokens) - scaled.encoder.embedder.positions[:1]
    torch.testing.assert_close(emb.norm(dim=-1), torch.full(tokens.shape, math.sqrt(scaled.cfg.dim)))


# ----- the grad-norms diagnostic -----

def test_grad_norms_accepts_the_new_norms():
    configs = ["norm=b2t", "norm=resi_dual", "norm=pre norm.kind=dyt",
               "norm=post norm.kind=scalenorm model.fixnorm=true"]
    assert_grad_norms_finite(configs, depth=2)
