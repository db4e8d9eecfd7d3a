"""DDP on CPU: 2 gloo processes give the loss curve of one process with the same global batch."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runner.run.train import train
from tests.conftest import TINY, compose


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
    # update 1's loss over the whole global batch (both ranks' halves), not the main rank's half
    assert single["initial_loss"] == pytest.approx(double["initial_loss"], rel=1e-4)
    assert single["first_logged_loss"] == pytest.approx(double["first_logged_loss"], rel=1e-4)


@pytest.mark.slow
def test_ddp_resume_with_dropout_is_exact(tmp_path):
    """10 updates of 2 gloo processes in one go vs the same run's update-5 checkpoint resumed in
    new processes for 5 more: the same weights and losses. Each rank draws its own dropout masks
    from its own RNG stream, so the checkpoint must carry every rank's RNG state, not only the
    main rank's."""
    import shutil

    from runner.run.folder import LAST

    args = [*TINY, "model.dropout=0.1", "trainer.devices=2", "trainer.threads=1",
            "trainer.save_interval=5", "trainer.keep_checkpoints=2", "trainer.log_interval=5",
            "trainer.valid_interval=0", "warmup.updates=0", "trainer.max_updates=10"]
    whole, parted = tmp_path / "whole", tmp_path / "parted"
    # 10 updates are too few to beat the unigram model: the status is "stalled", which is fine here
    reference = train(compose(args), whole)
    parted.mkdir()
    shutil.copy(whole / "checkpoint_5.pt", parted / LAST)  # as if killed after update 5
    result = train(compose(args), parted)
    assert result["resumed"] and result["updates"] == 10 and result["world_size"] == 2
    assert result["train_loss"] == reference["train_loss"]
    a = torch.load(whole / LAST, map_location="cpu", weights_only=True)
    b = torch.load(parted / LAST, map_location="cpu", weights_only=True)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert losses(whole)[-1] == losses(parted)[-1]
    assert len(a["rng_ranks"]) == 2 and not torch.equal(a["rng_ranks"][0]["torch"], a["rng_ranks"][1]["torch"])
