"""DDP on CPU: 2 gloo processes give the loss curve of one process with the same global batch."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY, compose

from runner.run.train import train


def losses(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["split"] == "train"]


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tmp_path):
    common = [*TINY, "model.dropout=0", "trainer.max_updates=12", "trainer.log_interval=3",
              "trainer.save_interval=6", "trainer.valid_interval=6", "trainer.threads=1"]
    single = train(compose([*common, "trainer.update_freq=2"]), tmp_path / "single")
    double = train(compose([*common, "trainer.devices=2"]), tmp_path / "ddp")
    assert single["status"] == double["status"] == "ok"
    assert double["world_size"] == 2
    a, b = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert [s for s, _ in a] == [s for s, _ in b]
    for (_, la), (_, lb) in zip(a, b):
        assert la == pytest.approx(lb, rel=1e-4)
    assert single["valid_loss"] == pytest.approx(double["valid_loss"], rel=1e-4)
    assert single["train_tokens"] == double["train_tokens"]
