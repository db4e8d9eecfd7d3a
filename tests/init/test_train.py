"""The schemes through the real trainer (model=ci, a few updates): Admin's omegas reach init.json
and train, the alpha ramp advances once per update and continues after a resume."""
from __future__ import annotations

import json

import pytest
import torch

from runner.run.folder import LAST
from runner.run.train import train
from tests.conftest import TINY, compose

FAST = [*TINY, "trainer.final_bleu=false", "trainer.save_interval=5", "trainer.log_interval=5",
        "trainer.valid_interval=0"]


def model_state(run_dir):
    return torch.load(run_dir / LAST, map_location="cpu", weights_only=True)["model"]


def test_admin_in_one_run_writes_omegas_and_trains_them(tmp_path):
    cfg = compose([*FAST, "init=admin", "trainer.max_updates=5", "warmup.updates=0",
                   "optim.lr=1e-2"])
    result = train(cfg, tmp_path)
    assert result["status"] == "ok"
    report = json.loads((tmp_path / "init.json").read_text())
    omegas = report["omega"]
    assert len(omegas) == 2 * 2 + 3 * 2 and omegas["encoder.0.self_attn"] == 1.0
    state = model_state(tmp_path)
    omega = state["encoder.layers.1.ffn.omega"]
    start = omegas["encoder.1.ffn"]
    # a trainable d-vector: after 5 updates its entries have moved away from the profiled value
    assert omega.shape == (32,) and not torch.allclose(omega, torch.full_like(omega, start))


def test_ramp_advances_per_update_and_resumes(tmp_path):
    step = 0.05
    base = [*FAST, "init=rezero_ramp", "norm=none", f"init.alpha_ramp_step={step}"]
    train(compose([*base, "trainer.max_updates=5", "warmup.updates=0"]), tmp_path)
    alphas = [v for k, v in model_state(tmp_path).items() if k.endswith("alpha")]
    assert all(float(a) == pytest.approx(5 * step) for a in alphas)
    # As if the run had been killed after its checkpoint at update 5 (no result.json yet) and
    # restarted with 10 updates: it resumes, apply() is not called again.
    (tmp_path / "result.json").unlink()
    result = train(compose([*base, "trainer.max_updates=10", "warmup.updates=0"]), tmp_path)
    assert result["resumed"] and result["updates"] == 10
    alphas = [v for k, v in model_state(tmp_path).items() if k.endswith("alpha")]
    assert all(float(a) == pytest.approx(10 * step, rel=1e-5) for a in alphas)
