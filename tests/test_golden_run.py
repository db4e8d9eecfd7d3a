"""Fixed-seed CPU training compared bit for bit with golden metrics.

The golden files in tests/golden/ were written by `deepinit train` with the overrides below at
commit c60a99a (before the package was reorganised into layers). Every metrics.jsonl field is
compared exactly except the two that measure time (tokens_per_s, wall_s). A refactor that changes
a single floating-point operation in the model, init, loss, optimizer, schedule, data order or
RNG consumption fails here.

To regenerate after an intended numerical change, run each cell with
`hydra.run.dir=<dir>` and copy <dir>/metrics.jsonl over the golden file, and say why in the commit.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

GOLDEN = Path(__file__).resolve().parent / "golden"
COMMON = ["model=ci", "model.dropout=0.1", "warmup.updates=5", "trainer.max_updates=30",
          "trainer.log_interval=5", "trainer.valid_interval=10", "trainer.save_interval=10",
          "trainer.tensorboard=false", "trainer.threads=1", "trainer.progress=false",
          "data.toy.train_size=600", "data.toy.valid_size=50", "data.toy.test_size=50"]
CELLS = {
    "norm-post_init-admin": ["norm=post", "init=admin"],
    "norm-pre_init-xavier": ["norm=pre", "init=xavier"],
    "norm-none_init-tfixup": ["norm=none", "init=tfixup"],
    # two micro-batches per update: the order in which their losses are summed is kept
    "norm-post_init-xavier_update-freq-2": ["norm=post", "init=xavier", "trainer.update_freq=2"],
}
TIMING = ("tokens_per_s", "wall_s")


def _records(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_training_matches_golden_metrics(cell, tmp_path):
    run_dir = tmp_path / cell
    proc = run_cli(["train", *COMMON, *CELLS[cell], f"hydra.run.dir={run_dir}"], cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    got, want = _records(run_dir / "metrics.jsonl"), _records(GOLDEN / f"{cell}.metrics.jsonl")
    assert len(got) == len(want) == 9
    for mine, golden in zip(got, want):
        assert mine == golden  # exact float equality, field by field
