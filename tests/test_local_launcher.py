"""`hydra/launcher=local` for real: cells run as subprocesses, each with its own fake GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "tests" / "sweep_probe_app.py"


def test_each_running_cell_gets_its_own_gpu(tmp_path):
    sweep_dir = tmp_path / "sweep"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PROBE_MODE="probe",
               PROBE_SLEEP="1.0")
    proc = subprocess.run(
        [sys.executable, str(APP), "-m", "hydra/launcher=local", "hydra.launcher.gpus=[0,1]",
         "hydra.launcher.poll_s=0.2", f"hydra.sweep.dir={sweep_dir}", "trainer.seed=1,2,3"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probes = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/probe.json"))]
    assert len(probes) == 3
    # the third cell reuses whichever GPU was freed first
    assert {p["cvd"] for p in probes} == {"0", "1"}
    overlaps = 0
    for a in probes:
        overlapping = [b for b in probes if b is not a and b["start"] < a["end"]
                       and a["start"] < b["end"]]
        # never more cells at once than GPUs, and never two on one GPU
        assert len(overlapping) <= 1
        assert all(b["cvd"] != a["cvd"] for b in overlapping)
        overlaps += len(overlapping)
    assert overlaps > 0  # cells did run in parallel
