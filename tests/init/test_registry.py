"""Adding an init scheme is its file, its registry line and its YAML: a throwaway scheme with
typed options (a Literal choice and a float) written to a temp folder, registered in
runner.init.SCHEMES, with conf/init/constant_fc.yaml in a copy of conf/, composes with
`init=constant_fc init.fc1_value=...`, rejects a wrong key and a wrong choice in one line, trains
through `deepinit train`'s own function, reloads from its checkpoint, gets the shared requirement
check and passes the structure test's checks (what it changes is what it declares)."""
from __future__ import annotations

import importlib
import json
import shutil
import sys
import textwrap

import pytest
import torch

import runner.cli.compose as cli_compose
from runner import init
from runner.config import ConfigError, config_from_dict
from runner.config.paths import config_dir
from runner.model.sublayer import norm_options_class
from runner.run.build import check_config
from runner.run.folder import load_checkpoint
from runner.run.train import train
from tests.conftest import TINY, compose
from tests.init.test_structure import (
    test_every_parameter_is_set_and_the_changes_are_the_declared_ones as check_structure,
)

SCHEME_FILE = '''
"""init=constant_fc: every fc1 weight starts at one value (a throwaway scheme for a test)."""
from dataclasses import dataclass
from typing import Literal

import torch

from runner.config import InitConfig
from runner.config.options import options
from runner.init.base import InitScheme
from runner.init.common import fairseq_xavier


@options
@dataclass
class ConstantFCOptions(InitConfig):
    fc1_value: float = 0.0123
    fc1_sign: Literal["plus", "minus"] = "plus"


class ConstantFC(InitScheme):
    name = "constant_fc"
    options = ConstantFCOptions
    changes = ("*.fc1",)
    placements = ("pre",)
    placement_hint = "a test scheme"

    @torch.no_grad()
    def apply(self, model, cfg, batch=None) -> dict:
        fairseq_xavier(model, cfg)
        value = cfg.init.fc1_value * (1 if cfg.init.fc1_sign == "plus" else -1)
        for ref in model.sublayers():
            if ref.kind == "ffn":
                ref.module.branch.fc1.weight.fill_(value)
        return {"rule": "constant fc1 weights", "value": value}
'''

SCHEME_YAML = """\
# a throwaway scheme for a test
defaults:
  - /init_options/constant_fc@_here_
  - _self_
name: constant_fc
fc1_value: 0.0123
"""


@pytest.fixture
def constant_fc(tmp_path, monkeypatch):
    (tmp_path / "constant_fc.py").write_text(textwrap.dedent(SCHEME_FILE))  # the one file
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("constant_fc")
    monkeypatch.setitem(init.SCHEMES, "constant_fc", module.ConstantFC())  # the one registry line
    conf = tmp_path / "conf"
    shutil.copytree(config_dir(), conf)
    (conf / "init" / "constant_fc.yaml").write_text(SCHEME_YAML)  # the one YAML
    monkeypatch.setattr(cli_compose, "config_dir", lambda: conf)
    yield module
    sys.modules.pop("constant_fc", None)


def test_a_new_scheme_composes_trains_and_is_reported(constant_fc, tmp_path):
    cfg = compose(TINY + ["init=constant_fc", "init.fc1_value=0.0321", "norm=pre",
                          "trainer.max_updates=2", "trainer.log_interval=1",
                          "trainer.save_interval=1", "warmup.updates=1", "optim.lr=1e-12"])
    assert cfg.init == constant_fc.ConstantFCOptions(name="constant_fc", fc1_value=0.0321)
    result = train(cfg, tmp_path / "run")
    assert result["status"] == "ok"
    report = json.loads((tmp_path / "run" / "init.json").read_text())
    assert report == {"scheme": "constant_fc", "rule": "constant fc1 weights", "value": 0.0321}
    # after 2 updates at lr 1e-12 the weights are still the scheme's constant
    state = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    fc1 = state["model"]["encoder.layers.0.ffn.branch.fc1.weight"]
    assert torch.allclose(fc1, torch.full_like(fc1, 0.0321), atol=1e-9)
    # the stored config comes back with the scheme's options class (the registry gives it)
    assert config_from_dict(state["config"], init.options_class, norm_options_class).init == cfg.init


def test_a_new_schemes_options_are_checked(constant_fc):
    with pytest.raises(ConfigError, match=r"unknown key init\.fc1_valu \(did you mean init\.fc1_value\?\); "
                                          r"init has: name, fc1_value, fc1_sign"):
        compose(TINY + ["init=constant_fc", "init.fc1_valu=1"])
    with pytest.raises(ConfigError) as err:
        check_config(compose(TINY + ["init=constant_fc", "norm=pre", "init.fc1_sign=up"]))
    assert str(err.value) == "init.fc1_sign='up': expected one of plus, minus"
    with pytest.raises(ConfigError, match=r"unknown key init\.fc1_value \(an option of init=constant_fc"):
        compose(TINY + ["init.fc1_value=1"])


def test_a_new_scheme_passes_the_structure_checks(constant_fc):
    check_structure("constant_fc")


def test_a_new_scheme_gets_the_placement_check_on_both_stacks(constant_fc):
    with pytest.raises(ConfigError) as err:
        check_config(compose(TINY + ["init=constant_fc", "norm=post"]))
    assert str(err.value) == ("init=constant_fc is defined for norm=pre only (a test scheme), not "
                              "norm=post: use norm=pre")
    with pytest.raises(ConfigError, match="not norm.decoder_placement=post: use norm=pre and unset "
                                          "norm.decoder_placement"):
        check_config(compose(TINY + ["init=constant_fc", "norm=pre", "norm.decoder_placement=post"]))


def test_unknown_scheme_is_one_line_listing_the_registry():
    with pytest.raises(ConfigError, match=r"init=nope: unknown init scheme; expected one of admin, "):
        check_config(compose(TINY + ["init.name=nope"]))


@pytest.mark.parametrize("overrides", [
    # the Lipschitz v1 order on the encoder only: the decoder has no norm at all
    ["norm=post", "norm.embedding_norm=true", "norm.decoder_placement=none"],
    ["norm=pre", "norm.encoder_placement=post"],
])
def test_lipschitz_checks_both_stacks(overrides):
    with pytest.raises(ConfigError, match="on both stacks only: use norm=post norm.embedding_norm=true"):
        check_config(compose(TINY + ["init=lipschitz", *overrides]))


@pytest.mark.parametrize("scheme", ["rezero_ramp", "rezero", "skipinit", "tfixup"])
def test_no_norm_schemes_check_both_stacks(scheme):
    with pytest.raises(ConfigError, match="not norm.encoder_placement=pre: use norm=none"):
        check_config(compose(TINY + [f"init={scheme}", "norm=none", "norm.encoder_placement=pre"]))
