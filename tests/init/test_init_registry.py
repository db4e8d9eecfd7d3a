"""Adding an init scheme is one file and one registry line: a throwaway scheme written to a temp
folder, registered in runner.init.SCHEMES, trains through `deepinit train`'s own function and
gets the shared requirement check."""
from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest
import torch
from conftest import TINY, compose

from runner import init
from runner.config import ConfigError
from runner.run.build import check_config
from runner.run.folder import load_checkpoint
from runner.run.train import train

SCHEME_FILE = '''
"""init=constant_fc: every FFN weight starts at one constant (a throwaway scheme for a test)."""
import torch

from runner.init.base import InitScheme
from runner.init.common import fairseq_xavier

VALUE = 0.0123


class ConstantFC(InitScheme):
    name = "constant_fc"
    placements = ("pre",)
    placement_hint = "a test scheme"

    @torch.no_grad()
    def apply(self, model, cfg, batch=None) -> dict:
        fairseq_xavier(model, cfg)
        for ref in model.sublayers():
            if ref.kind == "ffn":
                ref.module.branch.fc1.weight.fill_(VALUE)
        return {"rule": "constant fc1 weights", "value": VALUE}
'''


@pytest.fixture
def constant_fc(tmp_path, monkeypatch):
    (tmp_path / "constant_fc.py").write_text(textwrap.dedent(SCHEME_FILE))  # the one file
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("constant_fc")
    monkeypatch.setitem(init.SCHEMES, "constant_fc", module.ConstantFC())  # the one registry line
    yield module
    sys.modules.pop("constant_fc", None)


def test_a_new_scheme_trains_and_is_reported(constant_fc, tmp_path):
    cfg = compose(TINY + ["init.name=constant_fc", "norm=pre", "trainer.max_updates=2",
                          "trainer.log_interval=1", "trainer.save_interval=1", "warmup.updates=1",
                          "optim.lr=1e-12"])
    result = train(cfg, tmp_path / "run")
    assert result["status"] == "ok"
    report = json.loads((tmp_path / "run" / "init.json").read_text())
    assert report == {"scheme": "constant_fc", "rule": "constant fc1 weights", "value": 0.0123}
    # after 2 updates at lr 1e-12 the weights are still the scheme's constant
    state = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["model"]
    fc1 = state["encoder.layers.0.ffn.branch.fc1.weight"]
    assert torch.allclose(fc1, torch.full_like(fc1, 0.0123), atol=1e-9)


def test_a_new_scheme_gets_the_placement_check_on_both_stacks(constant_fc):
    with pytest.raises(ConfigError) as err:
        check_config(compose(TINY + ["init.name=constant_fc", "norm=post"]))
    assert str(err.value) == ("init=constant_fc is defined for norm=pre only (a test scheme), not "
                              "norm=post: use norm=pre")
    with pytest.raises(ConfigError, match="not norm.decoder_placement=post: use norm=pre and unset "
                                          "norm.decoder_placement"):
        check_config(compose(TINY + ["init.name=constant_fc", "norm=pre", "norm.decoder_placement=post"]))


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
        check_config(compose(TINY + [f"init={scheme}", "norm=none", "norm.encoder_placement=pre",
                                     "init.alpha_ramp_step=0.1"]))
