"""Per-layer norm placement (runner/model/sublayer.py): Mix-LN (norm=mix), Peri-LN (norm=peri) and
LayerNorm Scaling (norm.layernorm_scaling=true). Each layer's output recomputed from the paper's
equation with LayerNorm written from its definition, the expected slot counts worked out by hand,
the config rules, and `analyze grad-norms` on them. Which init schemes accept these placements:
tests/init/test_requirements.py; a training run per method: tests/run/test_train.py."""
from __future__ import annotations

import math

import pytest
import torch

from runner.config import ConfigError
from runner.model.sublayer import PLACEMENTS, SCHEDULES, mix_post_layers
from runner.run.build import check_config
from tests.conftest import compose
from tests.method_helpers import SMALL, assert_grad_norms_finite, ln, model_for, one_thread, randomize_norms  # noqa: F401

LayerNorm, Identity = torch.nn.LayerNorm, torch.nn.Identity


pytestmark = pytest.mark.usefixtures("one_thread")


def is_post(sub) -> bool:
    return (isinstance(sub.post_norm, LayerNorm) and isinstance(sub.pre_norm, Identity)
            and isinstance(sub.branch_norm, Identity))


def is_pre(sub) -> bool:
    return (isinstance(sub.pre_norm, LayerNorm) and isinstance(sub.post_norm, Identity)
            and isinstance(sub.branch_norm, Identity))


def layer_kinds(stack) -> list[str]:
    """'post' / 'pre' per layer, checked on every sublayer of the layer."""
    kinds = []
    for layer in stack.layers:
        subs = [m for m in (getattr(layer, n, None) for n in ("self_attn", "cross_attn", "ffn"))
                if m is not None]
        if all(is_post(s) for s in subs):
            kinds.append("post")
        elif all(is_pre(s) for s in subs):
            kinds.append("pre")
        else:
            kinds.append("other")
    return kinds


# ----- Mix-LN -----

def test_mix_first_half_post_ln_then_pre_ln_with_a_final_norm():
    _, model, _ = model_for(["norm=mix", "norm.mix_ratio=0.5", "model.layers=4"])
    for stack in (model.encoder, model.decoder):
        assert layer_kinds(stack) == ["post", "post", "pre", "pre"]
        assert isinstance(stack.final_norm, LayerNorm)  # the last layers are Pre-LN
        assert isinstance(stack.embedding_norm, Identity)
        assert [s.post_norm for s in stack.layer_slots] == [True, True, False, False]
    assert "mix" in SCHEDULES and "mix" in PLACEMENTS


@torch.no_grad()
def test_mix_layers_follow_the_post_ln_and_pre_ln_formulas():
    """Post-LN layer: h = LN1(x + SA(x)), y = LN2(h + FFN(h)). Pre-LN layer: h = x + SA(LN1(x)),
    y = h + FFN(LN2(h)). Decoder Pre-LN layer with cross-attention in between."""
    _, model, _ = model_for(["norm=mix", "norm.mix_ratio=0.5", "model.layers=4"])
    gen = torch.Generator().manual_seed(3)
    randomize_norms(model, gen)
    x = torch.randn(2, 5, model.cfg.dim, generator=gen)
    post, pre = model.encoder.layers[1], model.encoder.layers[2]
    h = ln(post.self_attn.post_norm, x + post.self_attn.branch(x))
    torch.testing.assert_close(post(x, None), ln(post.ffn.post_norm, h + post.ffn.branch(h)))
    h = x + pre.self_attn.branch(ln(pre.self_attn.pre_norm, x))
    torch.testing.assert_close(pre(x, None), h + pre.ffn.branch(ln(pre.ffn.pre_norm, h)))
    memory = torch.randn(2, 6, model.cfg.dim, generator=gen)
    dec = model.decoder.layers[3]
    h1 = x + dec.self_attn.branch(ln(dec.self_attn.pre_norm, x), is_causal=True)
    h2 = h1 + dec.cross_attn.branch(ln(dec.cross_attn.pre_norm, h1), memory=memory)
    want = h2 + dec.ffn.branch(ln(dec.ffn.pre_norm, h2))
    torch.testing.assert_close(dec(x, memory, None), want)


def test_mix_floors_the_post_ln_count_per_stack():
    """floor(0.25 * 6) = 1 Post-LN layer; per stack: encoder 4 and decoder 2 layers at 0.5 give
    2 and 1; ratio 0 is all Pre-LN, ratio 1 all Post-LN (with the final norm)."""
    _, model, _ = model_for(["norm=mix", "norm.mix_ratio=0.25", "model.layers=6"])
    assert layer_kinds(model.encoder) == ["post"] + ["pre"] * 5
    assert layer_kinds(model.decoder) == ["post"] + ["pre"] * 5
    _, model, _ = model_for(["norm=mix", "norm.mix_ratio=0.5", "model.encoder_layers=4",
                             "model.decoder_layers=2"])
    assert layer_kinds(model.encoder) == ["post", "post", "pre", "pre"]
    assert layer_kinds(model.decoder) == ["post", "pre"]
    _, model, _ = model_for(["norm=mix", "norm.mix_ratio=0.0", "model.layers=3"])
    assert layer_kinds(model.encoder) == ["pre"] * 3
    _, model, _ = model_for(["norm=mix", "norm.mix_ratio=1.0", "model.layers=3"])
    assert layer_kinds(model.encoder) == ["post"] * 3
    assert isinstance(model.encoder.final_norm, LayerNorm)
    # 0.29 * 100 is 28.999999999999996 in binary; the ratio is meant as written: 29 layers
    assert mix_post_layers(0.29, 100) == 29 and mix_post_layers(0.25, 6) == 1


@torch.no_grad()
def test_mix_with_ratio_zero_is_pre_ln_bit_for_bit():
    """Same construction order, same state_dict keys and values, same logits as norm=pre."""
    _, mix, batch = model_for(["norm=mix", "norm.mix_ratio=0"])
    _, pre, _ = model_for(["norm=pre"])
    assert list(mix.state_dict()) == list(pre.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(mix.state_dict().values(), pre.state_dict().values()))
    assert torch.equal(mix(batch.src_tokens, batch.prev_tokens), pre(batch.src_tokens, batch.prev_tokens))


@pytest.mark.parametrize("ratio", ["1.5", "-0.1"])
def test_mix_ratio_outside_zero_one_is_rejected_in_one_line(ratio):
    with pytest.raises(ConfigError) as err:
        check_config(compose(["norm=mix", f"norm.mix_ratio={ratio}"]))
    assert "\n" not in str(err.value) and "norm.mix_ratio" in str(err.value)


# ----- Peri-LN -----

@torch.no_grad()
def test_peri_has_the_embedding_norm_and_sandwich_slots_and_follows_the_formula():
    """x_{l+1} = x_l + LN_out(F(LN_in(x_l))) per sublayer; the stack input is LN_emb(embedding)
    and its output LN_final(x_L)."""
    _, model, batch = model_for(["norm=peri"])
    for stack in (model.encoder, model.decoder):
        assert isinstance(stack.embedding_norm, LayerNorm)
        assert isinstance(stack.final_norm, LayerNorm)
    for ref in model.sublayers():
        sub = ref.module
        assert isinstance(sub.pre_norm, LayerNorm) and isinstance(sub.branch_norm, LayerNorm)
        assert isinstance(sub.post_norm, Identity)
    n_sublayers = 2 * 2 + 2 * 3
    assert len(list(model.norms())) == 2 * n_sublayers + 2 + 2
    gen = torch.Generator().manual_seed(4)
    randomize_norms(model, gen)
    x = torch.randn(2, 5, model.cfg.dim, generator=gen)
    enc = model.encoder.layers[0]
    sa, ffn = enc.self_attn, enc.ffn
    h = x + ln(sa.branch_norm, sa.branch(ln(sa.pre_norm, x)))
    want = h + ln(ffn.branch_norm, ffn.branch(ln(ffn.pre_norm, h)))
    torch.testing.assert_close(enc(x, None), want)
    src = batch.src_tokens[:3]
    y = ln(model.encoder.embedding_norm, model.encoder.embedder(src))
    mask = (src != model.pad_index)[:, None, None, :]
    for layer in model.encoder.layers:
        y = layer(y, mask)
    memory, _ = model.encode(src)
    torch.testing.assert_close(memory, ln(model.encoder.final_norm, y))


# ----- LayerNorm Scaling -----

@torch.no_grad()
def test_layernorm_scaling_divides_the_pre_norm_output_by_sqrt_l():
    """Layer l (1-based) feeds its branches LN(x) / sqrt(l): checked on layer 3 by the branch's
    input, and the sublayer output x + SA(LN(x) / sqrt(3))."""
    _, model, _ = model_for(["norm=pre", "norm.layernorm_scaling=true", "model.layers=4"])
    gen = torch.Generator().manual_seed(5)
    randomize_norms(model, gen)
    for stack in (model.encoder, model.decoder):
        assert [s.pre_norm_scale for s in stack.layer_slots] == [
            1.0, 1 / math.sqrt(2), 1 / math.sqrt(3), 1 / math.sqrt(4)]
    sub = model.encoder.layers[2].self_attn
    x = torch.randn(2, 5, model.cfg.dim, generator=gen)
    seen = []
    handle = sub.branch.register_forward_pre_hook(lambda _m, args, _kw: seen.append(args[0]),
                                                  with_kwargs=True)
    got = sub(x)
    handle.remove()
    want_input = ln(sub.pre_norm, x) / math.sqrt(3)
    torch.testing.assert_close(seen[0], want_input)
    torch.testing.assert_close(got, x + sub.branch(want_input))
    assert len(model.state_dict()) == len(model_for(["norm=pre", "model.layers=4"])[1].state_dict())


def test_layernorm_scaling_with_mix_scales_the_pre_ln_layers_by_their_stack_index():
    _, model, _ = model_for(["norm=mix", "norm.mix_ratio=0.5", "model.layers=4",
                             "norm.layernorm_scaling=true"])
    scales = [s.pre_norm_scale for s in model.encoder.layer_slots]
    assert scales == [1.0, 1.0, 1 / math.sqrt(3), 1 / math.sqrt(4)]  # Post-LN layers: no pre-norm
    assert model.decoder.layers[3].ffn.pre_norm_scale == 1 / math.sqrt(4)


@pytest.mark.parametrize("placement", ["post", "sandwich", "peri", "none"])
def test_layernorm_scaling_needs_pre_ln_layers(placement):
    with pytest.raises(ConfigError) as err:
        check_config(compose([f"norm={placement}", "norm.layernorm_scaling=true"]))
    assert "\n" not in str(err.value) and "norm.layernorm_scaling" in str(err.value)
    with pytest.raises(ConfigError, match="norm.layernorm_scaling"):
        check_config(compose(["norm=pre", f"norm.decoder_placement={placement}",
                              "norm.layernorm_scaling=true"]))


# ----- the grad-norms diagnostic -----

def test_grad_norms_accepts_the_new_placements():
    configs = ["norm=mix norm.mix_ratio=0.5", "norm=peri", "norm=pre norm.layernorm_scaling=true",
               "norm=mix norm.layernorm_scaling=true"]
    assert_grad_norms_finite(configs, depth=4)


def test_a_mix_ratio_that_leaves_a_stack_no_post_ln_layer_is_said(caplog):
    """floor(0.3 x 3) = 0: Mix-LN's 3-layer decoder trains as Pre-LN, which the run logs as a
    warning naming the stack; the 4-layer encoder keeps its one Post-LN layer and no line."""
    import logging

    with caplog.at_level(logging.WARNING):
        check_config(compose(["norm=mix", "norm.mix_ratio=0.3", "model.encoder_layers=4",
                              "model.decoder_layers=3"]))
    lines = [r.getMessage() for r in caplog.records if "mix_ratio" in r.getMessage()]
    assert lines == ["norm.mix_ratio=0.3 gives the 3-layer decoder no Post-LN layer (floor(0.3 x 3) = 0): "
                     "that stack trains as Pre-LN"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        check_config(compose(["norm=mix", "norm.mix_ratio=0.25", "model.layers=6"]))
    assert not [r for r in caplog.records if "mix_ratio" in r.getMessage()]
