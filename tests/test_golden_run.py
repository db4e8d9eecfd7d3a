"""Fixed-seed CPU training compared bit for bit with golden metrics.

The golden files in tests/golden/<machine>/ were written by `deepinit train` with the overrides
below at commit c60a99a (before the package was reorganised into layers), one set per kind of CPU
(machine.json: the CPU model name and torch's CPU capability), because torch's and oneDNN's CPU
kernels sum in a different order on different instruction sets. On a machine with its own set,
every metrics.jsonl field is compared exactly except the two that measure time (tokens_per_s,
wall_s): a refactor that changes a single floating-point operation in the model, init, loss,
optimizer, schedule, data order or RNG consumption fails here. On another kind of CPU the values
are compared with the first set within CROSS_CPU_RTOL.

To regenerate after an intended numerical change, run each cell with `hydra.run.dir=<dir>` and copy
<dir>/metrics.jsonl over the golden file, and say why in the commit; to add a CPU kind, run the
cells at c60a99a on it and add a folder with its machine.json.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from runner.run.folder import cpu_name
from tests.conftest import REPO, run_cli_here

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
# Measured: the c60a99a cells on AMD EPYC (AVX512) against the Intel Xeon set differ by at most
# 7.1e-7 relative over 30 updates; the tolerance is 14x that.
CROSS_CPU_RTOL = 1e-5


def golden_set() -> tuple[Path, bool]:
    """(folder of golden files, exact?): the set written on this kind of CPU, else the first set
    compared within CROSS_CPU_RTOL."""
    here = {"cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    folders = sorted(p for p in GOLDEN.iterdir() if (p / "machine.json").is_file())
    for folder in folders:
        made_on = json.loads((folder / "machine.json").read_text())
        if made_on["cpu"] == here["cpu"] and made_on.get("cpu_capability") in (None, here["cpu_capability"]):
            return folder, True
    return folders[0], False


def _close(mine, golden) -> bool:
    if isinstance(golden, float) and isinstance(mine, float):
        return math.isclose(mine, golden, rel_tol=CROSS_CPU_RTOL, abs_tol=1e-12)
    return mine == golden


def _records(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_training_matches_golden_metrics(cell, tmp_path):
    run_dir = tmp_path / cell
    proc = run_cli_here(["train", *COMMON, *CELLS[cell], f"hydra.run.dir={run_dir}"], cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    folder, exact = golden_set()
    got, want = _records(run_dir / "metrics.jsonl"), _records(folder / f"{cell}.metrics.jsonl")
    assert len(got) == len(want) == 9
    for mine, golden in zip(got, want):
        if exact:
            assert mine == golden  # exact float equality, field by field
        else:
            assert mine.keys() == golden.keys()
            bad = {k: (mine[k], golden[k]) for k in golden if not _close(mine[k], golden[k])}
            assert not bad, f"beyond {CROSS_CPU_RTOL} of the {folder.name} set: {bad}"


def test_golden_sets_agree_across_cpus():
    """The per-CPU sets are the same training within CROSS_CPU_RTOL (so a set written on a new
    CPU kind is checked against the others, and the fallback tolerance is a measured one)."""
    folders = sorted(p for p in GOLDEN.iterdir() if (p / "machine.json").is_file())
    assert len(folders) >= 2
    for cell in CELLS:
        first = _records(folders[0] / f"{cell}.metrics.jsonl")
        for other in folders[1:]:
            for a, b in zip(first, _records(other / f"{cell}.metrics.jsonl"), strict=True):
                assert all(_close(b[k], a[k]) for k in a), (cell, other.name)
