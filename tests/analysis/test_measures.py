"""The analysis measurements on small fixed-seed models: the robust facts of the Admin and
T-Fixup papers, and the hooks' exactness."""
from __future__ import annotations

import math

import pytest
import torch

from runner.analysis import common, dependency, early_training, grad_norms, output_change
from runner.analysis.hooks import EncoderEmbeddingGrad, SublayerRecorder
from tests.conftest import compose
from tests.method_helpers import one_thread  # noqa: F401 (a fixture)

SMALL = ["model=ci", "model.dim=32", "model.ffn_dim=64"]


pytestmark = pytest.mark.usefixtures("one_thread")  # every test on one torch thread


def settings(*configs):
    return common.settings_from(list(configs), SMALL, [], compose)


def test_hooks_do_not_change_the_computation():
    cfg = compose(SMALL + ["norm=post", "model.dropout=0.0"])
    batch = common.input_batch(cfg, 8)
    model = common.fresh_model(cfg, 1)
    model.eval()
    with torch.no_grad():
        plain = model(batch.src_tokens, batch.prev_tokens)
    with SublayerRecorder(model) as rec, EncoderEmbeddingGrad(model):
        hooked = model(batch.src_tokens, batch.prev_tokens)
    assert torch.equal(plain, hooked)
    assert len(rec.records) == 2 * 2 + 2 * 3
    # removed on exit: nothing is recorded any more
    rec.records["encoder.0.ffn"].out = None
    with torch.no_grad():
        model(batch.src_tokens, batch.prev_tokens)
    assert rec.records["encoder.0.ffn"].out is None


def test_output_change_post_ln_exceeds_pre_ln_and_admin_and_grows_faster():
    result = output_change.run(settings("norm=post", "norm=pre", "norm=post init=admin"),
                               depths=[2, 8], seeds=[1, 2], eps=0.01, sentences=16)
    by = {e["label"]: {row["N"]: row for row in e["per_depth"]} for e in result["settings"]}
    post, pre, admin = by["norm=post"], by["norm=pre"], by["norm=post init=admin"]
    change = lambda rows, n, kind="random": rows[n][f"{kind}_encoder"]["mean"]  # noqa: E731
    for other in (pre, admin):
        assert change(post, 8) > 1.3 * change(other, 8)
        assert change(post, 8) - change(post, 2) > 1.3 * (change(other, 8) - change(other, 2))
        assert change(post, 8, "adam") > change(other, 8, "adam")
    for rows in (post, pre, admin):
        assert change(rows, 8) > change(rows, 2) > 0
    # fits are present and well-formed for every curve
    for entry in result["settings"]:
        fit = entry["fits"]["random_encoder"]
        assert set(fit) == {"N", "logN", "power"} and 0 <= fit["N"]["r2"] <= 1


def test_random_perturbation_is_relative_to_each_weight_std():
    cfg = compose(SMALL + ["norm=post"])
    model = common.fresh_model(cfg, 1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    count = output_change.perturb_branches(model, 0.01, torch.Generator().manual_seed(0))
    assert count > 0
    for name, p in model.named_parameters():
        delta = p.detach() - before[name]
        if ".branch." not in name or before[name].std() == 0:
            assert torch.equal(delta, torch.zeros_like(delta)), name
        else:
            ratio = float(delta.std() / before[name].std())
            assert 0.005 < ratio < 0.02, (name, ratio)


def test_gradient_drop_only_in_post_ln_decoder():
    result = grad_norms.run(settings("norm=post", "norm=pre"), depth=6, seeds=[1], sentences=16)
    post, pre = result["settings"]
    # Post-LN: the decoder gradient shrinks towards the bottom, and the step down happens through
    # encoder attention (self-attn output's gradient below the encoder-attn output's).
    assert post["decoder_drop"]["bottom_over_top"] < 0.5
    assert post["decoder_drop"]["geomean_self_over_cross"] < 0.95
    assert all(r < 1 for r in post["decoder_drop"]["self_over_cross"])
    # ... but its encoder does not vanish (Theorem 1); neither does Pre-LN anywhere.
    assert post["encoder_bottom_over_top"] >= 1.0
    assert pre["decoder_drop"]["bottom_over_top"] >= 1.0
    assert pre["encoder_bottom_over_top"] >= 1.0
    assert pre["decoder_drop"]["geomean_self_over_cross"] == pytest.approx(1.0, abs=0.02)
    for entry in (post, pre):
        assert max(r["relative"] for r in entry["decoder"]) == pytest.approx(1.0)


def test_dependency_is_exact_and_matches_the_pre_ln_closed_form():
    cfg = compose(SMALL + ["norm=pre", "model.layers=3"])
    batch = common.input_batch(cfg, 8)
    model = common.fresh_model(cfg, 1)
    result = dependency.measure(model, batch)
    # The paper's Pre-LN form: beta_ij = std(a_j) / std(x_i), x_i = x_0 + sum_{k<=i} a_k.
    model.eval()
    with SublayerRecorder(model) as rec, torch.no_grad():
        model(batch.src_tokens, batch.prev_tokens)
    keep = batch.src_tokens != model.pad_index
    recs = rec.side("encoder")
    for i, r in enumerate(recs):
        for j in range(i + 1):
            expected = float(recs[j].branch[keep].std(unbiased=False) / r.out[keep].std(unbiased=False))
            assert result["encoder"]["beta"][i][j] == pytest.approx(expected, rel=1e-5)
    for side in ("encoder", "decoder"):
        assert result[side]["reconstruction_error"] < 1e-5


def test_dependency_post_ln_relies_more_on_its_own_branch():
    result = dependency.run(settings("norm=post", "norm=pre", "norm=post init=admin",
                                     "norm=post norm.kind=rmsnorm", "norm=none init=rezero"),
                            depth=4, seed=1, sentences=16)
    diag = {e["label"]: e["stages"][0]["encoder"]["mean_diagonal"] for e in result["settings"]}
    assert diag["norm=post"] > 1.3 * diag["norm=pre"]
    assert diag["norm=post"] > 1.3 * diag["norm=post init=admin"]
    assert diag["norm=none init=rezero"] == 0.0  # alpha = 0: no branch reaches the stream
    for entry in result["settings"]:
        for side in ("encoder", "decoder"):
            assert entry["stages"][0][side]["reconstruction_error"] < 1e-5


def test_encoder_embedding_gradient_equals_the_untied_table_gradient():
    cfg = compose(SMALL + ["model.share_embeddings=none"])
    batch = common.input_batch(cfg, 8)
    model = common.fresh_model(cfg, 1)
    with EncoderEmbeddingGrad(model) as emb:
        common.loss_of(model, cfg, batch).backward()
    table = model.embedding_tables()["encoder"]
    rows = torch.unique(batch.src_tokens)
    rows = rows[rows != model.pad_index]
    assert torch.allclose(emb.grad_rows, table.grad[rows], atol=1e-7)


def test_early_training_first_updates():
    result = early_training.run(settings("norm=post"), updates=3, warmup_updates=4000)
    arms = result["settings"][0]["arms"]
    warm, cold = arms["warmup"]["steps"], arms["no_warmup"]["steps"]
    assert len(warm) == len(cold) == 3
    # lr(0) = warmup.init_lr = 0: the first warmup update moves nothing.
    assert warm[0]["adam_update"]["zeros"] == warm[0]["adam_update"]["count"]
    # Without warmup the first Adam step is lr * m/sqrt(v) = lr * sign(g) per entry.
    lr = arms["no_warmup"]["peak_lr"]
    assert cold[0]["adam_update"]["median"] == pytest.approx(lr, rel=1e-3)
    # Same init and batch: identical first gradients and LN-input norms in both arms.
    assert warm[0]["embedding_grad"] == cold[0]["embedding_grad"]
    assert warm[0]["ln_input_norms"] == cold[0]["ln_input_norms"]
    assert len(cold[0]["ln_input_norms"]) == 2  # one per decoder layer
    assert sum(cold[0]["embedding_grad_hist"]) + cold[0]["embedding_grad"]["zeros"] == \
        cold[0]["embedding_grad"]["count"]
    assert all(math.isfinite(s["loss"]) for s in warm + cold)


def test_early_training_of_a_config_with_gradient_accumulation():
    """A configuration trained with update_freq > 1 (e.g. a WMT preset's run folder) is probed
    one micro-batch per update, in fp32 and eagerly."""
    result = early_training.run(settings("norm=post trainer.update_freq=2 trainer.compile=true"),
                                updates=2, warmup_updates=10)
    steps = result["settings"][0]["arms"]["no_warmup"]["steps"]
    assert len(steps) == 2 and all(math.isfinite(s["loss"]) for s in steps)
    base = compose(SMALL + ["norm=post", "trainer.update_freq=2", "trainer.compile=true", "trainer.precision=bf16"])
    arm = early_training.arm_config(base, 10, 2)
    assert (arm.trainer.update_freq, arm.trainer.precision, arm.trainer.compile) == (1, "fp32", False)
    assert (base.trainer.update_freq, base.trainer.precision, base.trainer.compile) == (2, "bf16", True)


@pytest.mark.parametrize("scheme", [["norm=post", "init=admin"], ["norm=none", "init=tfixup"]])
def test_fresh_model_is_the_model_training_starts_from(tmp_path, scheme):
    from runner.run.build import build_run
    from tests.conftest import TINY

    cfg = compose(TINY + scheme + ["trainer.seed=3"])
    theirs = build_run(cfg).model.state_dict()  # what `deepinit train` trains
    ours = common.fresh_model(cfg).state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


def test_run_config_with_a_new_depth(tmp_path):
    cfg = compose(SMALL + ["norm=pre"])
    setting = common.Setting("run", [], common._from_run(tmp_path, cfg), run_dir=tmp_path)
    deeper = common.for_depth(setting, ["model.layers=5"])
    assert deeper.model.num_encoder_layers == 5 and deeper.norm.placement == "pre"
    assert cfg.model.layers == 2  # the run's own config is untouched
    with pytest.raises(common.ConfigError):
        common.for_depth(setting, ["model.layers=0"])


def test_adam_step_takes_the_trainers_update():
    """output-change's Adam arm takes its update through the train loop's own function
    (runner/train/loop.py optimizer_update), the init scheme's per-update hook included: the
    alpha ramp moves alpha from 0 to one ramp step after update 1, as in training."""
    from runner.analysis.output_change import adam_step
    from runner.run.build import check_config

    cfg = compose(SMALL + ["norm=none", "init=rezero_ramp", "init.alpha_ramp_step=0.25"])
    check_config(cfg)
    model = common.fresh_model(cfg, 1)
    alphas = [p for name, p in model.named_parameters(remove_duplicate=False) if name.endswith("alpha")] or \
        [b for name, b in model.named_buffers() if name.endswith("alpha")]
    assert alphas and all(float(a.abs().max()) == 0.0 for a in alphas)
    loss = adam_step(model, cfg, common.input_batch(cfg, 4), cfg.optim.lr)
    assert math.isfinite(loss)
    assert all(torch.all(a == 0.25) for a in alphas)
