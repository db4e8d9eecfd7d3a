"""Admin's profiling (Liu et al. 2020, Sec. 4.3, in LiyuanLucasLiu/Transformer-Clinic's
adaptive-profiling form) re-measured by hooks written here, and the alpha ramp."""
from __future__ import annotations

import math

import pytest
import torch

from runner.init import SCHEMES
from runner.init import apply as init_apply
from runner.init import update_hook as on_update_hook
from tests.init.init_helpers import initialized, make_batch, make_cfg, make_model


def test_admin_omegas_are_sqrt_of_cumulative_variances():
    """Replay the profiling forward (same init, same dropout masks) with the final omegas and
    measure, at a different point than the scheme does (the input of the post-LN), the shortcut
    and branch variances; omega_k must be sqrt(Var[omega_{k-1} x_{k-1}] + Var[F_{k-1}]) per stack,
    starting at 1."""
    batch = make_batch(seed=3, rows=6, src_len=9, tgt_len=8)
    cfg = make_cfg("admin", layers=3, dropout=0.2)
    admin, report = initialized(cfg, seed=11, batch=batch)
    omegas = report["omega"]

    base_cfg = make_cfg("xavier", layers=3, dropout=0.2)
    replay = make_model(base_cfg, seed=11)
    init_apply(replay, base_cfg, batch)  # consumes the RNG exactly as admin's baseline fill
    # The profiling did not update anything: all weights equal the baseline's.
    for (name, a), (_, b) in zip(admin.state_dict().items(), replay.state_dict().items()):
        if not name.endswith("omega"):
            assert torch.equal(a, b), name
    assert all(p.grad is None for p in admin.parameters())  # gradients dropped

    measured = []
    handles = []
    for ref in replay.sublayers():
        with torch.no_grad():
            ref.module.omega.fill_(omegas[ref.name])

        def pre(module, args, ref=ref):
            measured.append({"ref": ref, "x": args[0].detach()})

        def post_norm_input(module, args, ref=ref):
            measured[-1]["sum"] = args[0].detach()

        handles.append(ref.module.register_forward_pre_hook(pre))
        handles.append(ref.module.post_norm.register_forward_pre_hook(post_norm_input))
    replay.train()
    replay(batch.src_tokens, batch.prev_tokens, batch.src_has_pad)
    for h in handles:
        h.remove()

    acc = {"encoder": 1.0, "decoder": 1.0}
    names = []
    for m in measured:
        ref = m["ref"]
        names.append(ref.name)
        assert math.isclose(omegas[ref.name], acc[ref.side], rel_tol=1e-5), ref.name
        shortcut = m["x"] * omegas[ref.name]
        branch = m["sum"] - shortcut
        var = lambda t: float(t.double().flatten().var(unbiased=False))  # noqa: E731
        acc[ref.side] = math.sqrt(var(shortcut) + var(branch))
    assert names == list(omegas)  # every sublayer, in forward order
    assert omegas["encoder.0.self_attn"] == omegas["decoder.0.self_attn"] == 1.0
    assert all(v > 1.0 for k, v in omegas.items() if not k.endswith("0.self_attn"))
    # and the model holds them
    for ref in admin.sublayers():
        assert torch.allclose(ref.module.omega.detach(),
                              torch.full((32,), omegas[ref.name]), rtol=1e-6)


def test_admin_profiles_under_activation_checkpointing():
    batch = make_batch(seed=1)
    plain, r1 = initialized(make_cfg("admin", dropout=0.0), seed=2, batch=batch)
    cfg = make_cfg("admin", dropout=0.0)
    cfg.model.activation_checkpointing = True
    ckpt, r2 = initialized(cfg, seed=2, batch=batch)
    assert r1["omega"] == r2["omega"]  # the recomputation in backward does not re-profile


def test_alpha_ramp_rises_by_a_fixed_step_until_one_and_survives_resume():
    cfg = make_cfg("rezero_ramp", norm="none", alpha_ramp_step=0.3)
    model, report = initialized(cfg)
    hook = on_update_hook(cfg)
    seen = []
    for step in range(1, 6):
        hook(model, step)
        seen.append(round(float(model.decoder.layers[1].ffn.alpha), 6))
    assert seen == [0.3, 0.6, 0.9, 1.0, 1.0]
    # A resumed run: a fresh model holding the checkpointed alpha (after update 2), no apply().
    resumed = make_model(cfg, seed=5)
    resumed.load_state_dict({**model.state_dict(),
                             **{k: torch.full((1,), 0.6) for k in model.state_dict() if k.endswith("alpha")}})
    hook(resumed, 3)
    assert float(resumed.encoder.layers[0].self_attn.alpha) == pytest.approx(0.9, rel=1e-6)


def test_rezero_hook_leaves_a_trained_alpha_alone():
    cfg = make_cfg("rezero", norm="none")
    model, _ = initialized(cfg)
    with torch.no_grad():
        model.encoder.layers[0].self_attn.alpha.fill_(0.123)
    assert on_update_hook(cfg) is None  # a trained alpha: the train loop calls no hook
    SCHEMES["rezero"].on_update(model, 10, cfg)  # and the hook itself leaves it alone
    assert float(model.encoder.layers[0].ffn.alpha.detach()) == torch.tensor(0.123).item()


def test_admin_profiles_a_decoder_only_lm_as_one_stack():
    """task=lm: the same walk over the one stack's 2L sublayers in forward order, measured here
    from a replay of the profiling forward with the final omegas (dropout 0.1, same seed)."""
    from runner import init as init_schemes
    from runner.init.common import fairseq_xavier
    from runner.model.lm import DecoderOnlyLM
    from tests.model.test_lm import VOCAB, lm_config

    cfg = lm_config("post", layers=3, init="admin")
    cfg.model.dropout = 0.1
    tokens = torch.randint(0, VOCAB, (4, 13), generator=torch.Generator().manual_seed(5))
    batch = (tokens[:, :-1], tokens[:, 1:])

    def build(config):
        torch.manual_seed(7)
        return DecoderOnlyLM(config.model, config.norm, VOCAB, init_schemes.residual_spec(config))

    admin = build(cfg)
    torch.manual_seed(3)
    omegas = init_apply(admin, cfg, batch)["omega"]
    assert list(omegas) == [ref.name for ref in admin.sublayers()] and len(omegas) == 6
    assert all(ref.side == "decoder" for ref in admin.sublayers())

    base = lm_config("post", layers=3, init="xavier")
    base.model.dropout = 0.1
    base.init = init_schemes.options_for("admin")  # the same residual (omega vectors), Xavier fill
    replay = build(base)
    torch.manual_seed(3)
    fairseq_xavier(replay, base)  # admin's fill, drawing what it drew
    replay.after_init()
    for (name, a), (_, b) in zip(admin.state_dict().items(), replay.state_dict().items()):
        if not name.endswith("omega"):
            assert torch.equal(a, b), name
    measured, handles = [], []
    for ref in replay.sublayers():
        with torch.no_grad():
            ref.module.omega.fill_(omegas[ref.name])
        handles.append(ref.module.register_forward_pre_hook(
            lambda module, args, ref=ref: measured.append({"ref": ref, "x": args[0].detach()})))
        handles.append(ref.module.post_norm.register_forward_pre_hook(
            lambda module, args: measured[-1].__setitem__("sum", args[0].detach())))
    replay.train()
    replay(batch[0])  # the RNG where admin's profiling forward found it: the same dropout masks
    for h in handles:
        h.remove()
    acc = 1.0
    var = lambda t: float(t.double().flatten().var(unbiased=False))  # noqa: E731
    for m in measured:
        name = m["ref"].name
        assert math.isclose(omegas[name], acc, rel_tol=1e-5), name
        shortcut = m["x"] * omegas[name]
        acc = math.sqrt(var(shortcut) + var(m["sum"] - shortcut))
    assert omegas[measured[0]["ref"].name] == 1.0 and all(v > 1.0 for v in list(omegas.values())[1:])
