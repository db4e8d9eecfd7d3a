"""runner/run/build.py: how a run is put together from its config (the compile wrapper here; the
rest is exercised by every training test)."""
from __future__ import annotations

import pytest
import torch

from runner.run import build
from tests.conftest import compose


@pytest.mark.parametrize("task,dynamic", [("translation", True), ("lm", None)])
def test_compile_is_dynamic_for_translation_batches_and_static_for_lm_blocks(task, dynamic, monkeypatch):
    """trainer.compile=true: translation batches change shape every update, so their graphs are
    compiled dynamic from the first call (no graph specialized to the first batch and thrown
    away); the LM's blocks have one shape and stay specialized."""
    seen = {}

    def fake_compile(module, **kwargs):  # what build asks torch.compile for, without compiling
        seen.update(kwargs)
        return module

    monkeypatch.setattr(torch, "compile", fake_compile)
    cfg = compose(["trainer.compile=true", *((["task=lm", "data=shakespeare_char"]) if task == "lm" else [])])
    model = torch.nn.Linear(2, 2)
    model.select_kernels = lambda device_type: None
    build.on_device(model, cfg, torch.device("cpu"), world=1)
    assert seen == {"dynamic": dynamic}
