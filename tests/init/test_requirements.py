"""Incompatible choices fail at config time, through runner.run.build.check_config, with one line that
names the fix; the compatible choice of each scheme validates."""
from __future__ import annotations

import pytest

from runner.config import ConfigError
from runner.run.build import check_config
from tests.conftest import compose

# scheme -> (overrides that must fail, fragment of the fix, overrides that must pass)
CASES = {
    "tfixup": (["norm=post"], "use norm=none", ["norm=none"]),
    "admin": (["norm=pre"], "use norm=post", ["norm=post"]),
    "admin_torch": (["norm=none"], "use norm=post", ["norm=post", "init.output_change_scale='O(1)'"]),
    "deepnorm": (["norm=pre"], "use norm=post", ["norm=post", "init.deepnorm_variant=torchscale"]),
    "rezero": (["norm=post"], "use norm=none", ["norm=none"]),
    "rezero_postln": (["norm=none"], "use norm=post", ["norm=post"]),
    "skipinit": (["norm=pre"], "use norm=none", ["norm=none"]),
    "rezero_ramp": (["norm=post"], "use norm=none", ["norm=none"]),
    "lipschitz": (["norm=post"], "use norm.embedding_norm=true", ["norm=pre"]),
    "ds_init": (None, None, ["norm=post", "init.ds_init_form=code"]),
    "layerscale": (["norm=post"], "use norm=pre or norm=sandwich", ["norm=sandwich"]),
    "depth_mup": (["norm=none"], "use norm=pre", ["norm=pre", "init.depth_mup_exponent=1.0"]),
}
BASE = ["trainer.max_updates=100000"]


@pytest.mark.parametrize("scheme", sorted(CASES))
def test_requirement_is_one_line_naming_the_fix(scheme):
    bad, fix, good = CASES[scheme]
    if bad is not None:
        with pytest.raises(ConfigError) as err:
            check_config(compose([f"init={scheme}", *bad, *BASE]))
        message = str(err.value)
        assert "\n" not in message and fix in message, message
    check_config(compose([f"init={scheme}", *good, *BASE]))


def test_lipschitz_v1_is_post_with_embedding_norm():
    check_config(compose(["init=lipschitz", "norm=post", "norm.embedding_norm=true", *BASE]))
    with pytest.raises(ConfigError, match="use norm=post norm.embedding_norm=true"):
        check_config(compose(["init=lipschitz", "norm=none", *BASE]))


def test_ramp_needs_a_positive_step():
    with pytest.raises(ConfigError, match="use init.alpha_ramp_step="):
        check_config(compose(["init=rezero_ramp", "norm=none", "init.alpha_ramp_step=0", *BASE]))


def test_admin_as_a_user_types_it_composes_and_validates():
    cfg = compose(["init=admin", "model.layers=18"])
    check_config(cfg)
    assert (cfg.init.name, cfg.init.omega, cfg.norm.placement) == ("admin", "vector", "post")


@pytest.mark.parametrize("placement", ["mix", "peri", "b2t", "resi_dual"])
def test_init_schemes_declare_the_newer_placements(placement):
    """Mix-LN and Peri-LN (runner/model/sublayer.py), B2T and ResiDual (runner/model/norms.py): the
    Post-LN-only schemes and the no-norm ones name the placement they need; the Pre-LN-only ones
    (layerscale, depth_mup) and Lipschitz (its v1/v2 orders) reject it in one line; xavier and
    ds_init (placements: any) accept it."""
    for name in ("admin", "admin_torch", "deepnorm", "rezero_postln"):
        with pytest.raises(ConfigError) as err:
            check_config(compose([f"norm={placement}", f"init={name}"]))
        message = str(err.value)
        assert "\n" not in message and f"norm={placement}" in message and "norm=post" in message
    for name in ("tfixup", "rezero", "skipinit"):
        with pytest.raises(ConfigError, match="norm=none"):
            check_config(compose([f"norm={placement}", f"init={name}"]))
    for name in ("layerscale", "depth_mup", "lipschitz"):
        with pytest.raises(ConfigError) as err:
            check_config(compose([f"norm={placement}", f"init={name}"]))
        message = str(err.value)
        assert "\n" not in message and f"norm={placement}" in message
        assert name != "lipschitz" or "Lipschitz" in message
    for name in ("xavier", "ds_init"):
        check_config(compose([f"norm={placement}", f"init={name}"]))


@pytest.mark.parametrize("overrides, fix", [
    (["model.qk_norm=l2", "model.attention=t5"], "use model.attention=standard"),
    (["model.qk_norm=l2", "model.qk_norm_temperature=0"], "model.qk_norm_temperature=0"),
    (["model.qk_norm=cosine"], "model.qk_norm='cosine'"),
    (["model.sigma_reparam=true", "model.parameterization=ntk"], "use model.parameterization=standard"),
    (["model.sigma_reparam=true", "model.activation_checkpointing=true"],
     "set model.activation_checkpointing=false"),
    (["init=layerscale", "norm=post"], "use norm=pre or norm=sandwich"),
    (["init=depth_mup", "norm=post"], "use norm=pre"),
    (["init=depth_mup", "norm=pre", "norm.decoder_placement=sandwich"], "use norm=pre"),
    (["init=depth_mup", "norm=pre", "init.depth_mup_exponent=0.3"], "expected a value in [0.5, 1]"),
    (["init=depth_mup", "norm=pre", "init.depth_mup_base_layers=0"], "init.depth_mup_base_layers=0"),
])
def test_undefined_combinations_are_one_line_naming_the_fix(overrides, fix):
    """QK-norm, sigma-reparam, LayerScale and Depth-muP options that do not combine."""
    with pytest.raises(ConfigError) as err:
        check_config(compose(["trainer.max_updates=100000", *overrides]))
    assert "\n" not in str(err.value) and fix in str(err.value), str(err.value)
