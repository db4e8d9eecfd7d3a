"""LayerScale (init=layerscale) and Depth-muP/CompleteP (init=depth_mup), runner/init/layerscale.py
and runner/init/depth_mup.py: the papers' constants, the per-channel scale and the branch
multipliers, the per-group learning rates, the baseline at m = 1, and a coordinate check."""
from __future__ import annotations

import pytest
import torch

from runner import init as init_schemes
from runner.init.layerscale import layerscale_epsilon
from runner.model.loss import label_smoothed_nll
from runner.run.build import build_run
from runner.train.loop import Trainer
from runner.train.optim import build_optimizer, set_lr
from runner.train.schedule import lr_at
from tests.conftest import TINY, compose
from tests.method_helpers import PAD, initialized, make_batch, make_cfg, one_update


# ----------------------------------------------------------------------------- LayerScale
def test_layerscale_epsilon_by_depth_and_alpha_shape():
    # Touvron et al. 2021, Sec. 3: 0.1 up to 18 layers, 1e-5 up to 24, 1e-6 beyond
    assert [layerscale_epsilon(d) for d in (12, 18, 19, 20, 24, 25, 30)] == \
        [0.1, 0.1, 1e-5, 1e-5, 1e-5, 1e-6, 1e-6]
    for enc, dec in ((12, 20), (30, 12)):
        cfg = make_cfg("layerscale", encoder_layers=enc, decoder_layers=dec)
        model = initialized(cfg)
        expected = {"encoder": {12: 0.1, 20: 1e-5, 30: 1e-6}[enc], "decoder": {12: 0.1, 20: 1e-5}[dec]}
        alphas = [ref.alpha for ref in model.sublayers()]
        assert len({id(a) for a in alphas}) == len(alphas)  # one per residual branch
        for ref in model.sublayers():
            assert ref.alpha.shape == (32,) and ref.alpha.requires_grad
            assert torch.equal(ref.alpha.detach(), torch.full((32,), expected[ref.side]))
    # the state_dict differs from the baseline's only in alpha's shape
    base = initialized(make_cfg("xavier")).state_dict()
    scaled = initialized(make_cfg("layerscale")).state_dict()
    assert set(base) == set(scaled)
    assert {k for k in base if base[k].shape != scaled[k].shape} == {k for k in base if k.endswith(".alpha")}


@pytest.mark.parametrize("reading, expected", [
    ("per_stack", {"encoder": 0.1, "decoder": 0.1}),  # each stack has 12 layers: "depth up to 18"
    ("total", {"encoder": 1e-5, "decoder": 1e-5}),  # 12 + 12 = 24 layers: "10^-5 for depth 24"
])
def test_layerscale_depth_reading_at_12_plus_12(reading, expected):
    """init.layerscale_depth: which depth picks CaiT's epsilon in an encoder-decoder."""
    cfg = make_cfg("layerscale", encoder_layers=12, decoder_layers=12, dim=8,
                   init={"layerscale_depth": reading})
    model = initialized(cfg)
    for ref in model.sublayers():
        assert torch.equal(ref.alpha.detach(), torch.full((8,), expected[ref.side])), ref.name


def test_layerscale_depth_option_composes_with_per_stack_the_default():
    assert compose(["init=layerscale"]).init.layerscale_depth == "per_stack"
    assert compose(["init=layerscale", "init.layerscale_depth=total"]).init.layerscale_depth == "total"


def test_layerscale_trains_each_channel_and_multiplies_the_branch():
    """out = x + diag(lambda) F(LN(x)): with the branch output fixed, the sublayer output is
    x + lambda * F channel by channel; one update moves the channels of lambda apart."""
    cfg = make_cfg("layerscale")
    model = initialized(cfg)
    sub = model.encoder.layers[0].ffn
    with torch.no_grad():
        sub.alpha.copy_(torch.linspace(-1, 1, 32))
        x = torch.randn(2, 3, 32)
        branch = sub.branch(sub.pre_norm(x))
        torch.testing.assert_close(sub(x), x + sub.alpha * branch)
        sub.alpha.fill_(0.1)
    one_update(model, cfg, make_batch())
    assert sub.alpha.detach().std() > 0


# ----------------------------------------------------------------------------- Depth-muP
@pytest.mark.parametrize("a", [0.5, 1.0])
@pytest.mark.parametrize("optim", ["adam", "radam", "sgd"])
def test_depth_mup_multipliers(a, optim):
    """m = 24 / 6 = 4 (encoder), 12 / 6 = 2 (decoder): alpha = m^-a frozen; the branch
    parameters' lr = lr * m^(a-1) (SGD m^(2a-1)) and eps = eps * m^-a; everything else plain."""
    cfg = make_cfg("depth_mup", encoder_layers=24, decoder_layers=12, ffn_dim=32,
                   init={"depth_mup_exponent": a, "depth_mup_base_layers": 6}, optim={"name": optim})
    model = initialized(cfg)
    m = {"encoder": 4.0, "decoder": 2.0}
    for ref in model.sublayers():
        assert float(ref.alpha) == pytest.approx(m[ref.side] ** -a, rel=1e-7) and not ref.alpha.requires_grad
    optimizer = build_optimizer(model.parameters(), cfg, "cpu", init_schemes.param_groups(model, cfg))
    set_lr(optimizer, 1e-3)
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert set(groups) == {"encoder_branches", "decoder_branches", "other"}
    lr_exp = 2 * a - 1 if optim == "sgd" else a - 1
    for side in ("encoder", "decoder"):
        g = groups[f"{side}_branches"]
        assert g["lr"] == pytest.approx(1e-3 * m[side] ** lr_exp, rel=1e-12)
        if optim != "sgd":
            assert g["eps"] == pytest.approx(cfg.optim.eps * m[side] ** -a, rel=1e-12)
    assert groups["other"]["lr"] == 1e-3 and groups["other"].get("eps", cfg.optim.eps) == cfg.optim.eps
    # which parameters: the branches' matrices, biases and pre-norms; not embeddings or final norms
    enc = {id(p) for p in groups["encoder_branches"]["params"]}
    layer = model.encoder.layers[3]
    for p in (layer.self_attn.branch.q_proj.weight, layer.self_attn.branch.out_proj.bias,
              layer.ffn.branch.fc2.weight, layer.ffn.pre_norm.weight):
        assert id(p) in enc
    other = {id(p) for p in groups["other"]["params"]}
    for p in (model.encoder.embedder.tokens.weight, model.encoder.final_norm.weight,
              model.decoder.final_norm.bias):
        assert id(p) in other
    n_trainable = sum(1 for p in model.parameters() if p.requires_grad)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == n_trainable


def test_depth_mup_trainer_multiplies_the_schedule_lr_per_group(tmp_path):
    cfg = compose([*TINY, "init=depth_mup", "norm=pre", "init.depth_mup_base_layers=8",
                   "warmup.updates=4", "optim.lr=1e-3"])  # model=ci: 2 layers, m = 1/4
    trainer = Trainer(build_run(cfg))
    for _ in range(3):
        out = trainer.step()
    lr = lr_at(2, cfg)
    assert out.lr == lr
    groups = {g["name"]: g["lr"] for g in trainer.optimizer.param_groups}
    assert groups["encoder_branches"] == pytest.approx(lr * 0.25 ** -0.5, rel=1e-12)
    assert groups["other"] == lr


@pytest.mark.parametrize("optim", [{"name": "adam"}, {"name": "sgd", "momentum": 0.9},
                                   {"name": "radam", "radam_mode": "sgd_fallback"}])
def test_depth_mup_at_m_1_is_the_baseline(optim):
    """L = L_base: the same init and the same weights after two updates as init=xavier norm=pre,
    bit for bit (the groups' multipliers are exactly 1)."""
    base_cfg = make_cfg("xavier", optim=optim)
    cfg = make_cfg("depth_mup", init={"depth_mup_base_layers": 2, "depth_mup_exponent": 1.0}, optim=optim)
    base, model = initialized(base_cfg), initialized(cfg)
    assert all(torch.equal(a, b) for a, b in zip(base.state_dict().values(), model.state_dict().values()))
    for seed in (0, 1):
        one_update(base, base_cfg, make_batch(seed))
        one_update(model, cfg, make_batch(seed))
    for (name, a), b in zip(base.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(base.state_dict()["encoder.layers.0.ffn.branch.fc1.weight"],
                           initialized(base_cfg).state_dict()["encoder.layers.0.ffn.branch.fc1.weight"])


def residual_streams(model, src, prev) -> dict[str, list[torch.Tensor]]:
    out = {"encoder": [], "decoder": []}
    handles = [layer.register_forward_hook(lambda mod, args, o, side=side: out[side].append(o.detach()))
               for side, stack in (("encoder", model.encoder), ("decoder", model.decoder))
               for layer in stack.layers]
    with torch.no_grad():
        model.eval()(src, prev)
    for h in handles:
        h.remove()
    return out


def activation_rms_after_updates(scheme: str, layers: int, updates: int = 5, lr: float = 1e-2):
    """RMS of the residual stream after layers L/6, 2L/6, ..., L of each stack, after `updates`
    Adam updates at a constant lr on random-token batches (width 32, no dropout)."""
    options = {"depth_mup_exponent": 0.5, "depth_mup_base_layers": 6} if scheme == "depth_mup" else {}
    cfg = make_cfg(scheme, layers=layers, init=options)
    model = initialized(cfg)
    optimizer = build_optimizer(model.parameters(), cfg, "cpu", init_schemes.param_groups(model, cfg))
    set_lr(optimizer, lr)
    model.train()
    for step in range(updates):
        src, prev, tgt = make_batch(step + 1, rows=8, src_len=10, tgt_len=9)
        loss, _ = label_smoothed_nll(model(src, prev), tgt, 0.0, PAD)
        (loss / int((tgt != PAD).sum())).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    src, prev, _ = make_batch(0, rows=8, src_len=10, tgt_len=9)
    streams = residual_streams(model, src, prev)
    return {side: [float(h[i].pow(2).mean().sqrt()) for i in [layers * k // 6 - 1 for k in range(1, 7)]]
            for side, h in streams.items()}


def test_depth_mup_coordinate_check_6_vs_48_layers():
    """Depth-muP (a = 1/2, lr * m^-1/2 on the branches): the residual-stream RMS at matching
    relative depths after 5 updates at one lr stays within a factor 2 between 6 and 48 layers.
    The same check fails for the unscaled Pre-LN baseline (init=xavier), so it measures
    something. Measured when written (lr 1e-2): depth_mup ratios 1.00-1.24, xavier 4.4-7.2."""
    shallow, deep = activation_rms_after_updates("depth_mup", 6), activation_rms_after_updates("depth_mup", 48)
    for side in ("encoder", "decoder"):
        for a, b in zip(shallow[side], deep[side]):
            assert max(a, b) / min(a, b) < 2.0, (side, shallow[side], deep[side])
    base_shallow, base_deep = activation_rms_after_updates("xavier", 6), activation_rms_after_updates("xavier", 48)
    assert max(b / a for a, b in zip(base_shallow["decoder"], base_deep["decoder"])) > 2.0
