"""Incompatible choices fail at config time, through runner.run.build.check_config, with one line that
names the fix; the compatible choice of each scheme validates."""
from __future__ import annotations

import pytest
from conftest import compose

from runner.config import ConfigError
from runner.run.build import check_config

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
