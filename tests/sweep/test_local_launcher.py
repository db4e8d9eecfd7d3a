"""`hydra/launcher=local` for real: cells run as subprocesses, each with its own fake GPU; a crashing
cell fails alone; SIGTERM stops every worker and a rerun resumes the cells. The sweep's driver is
its own process where a signal reaches it; elsewhere it runs in the test's process (run_cli_here)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli_here
from tests.process_control import holding_files_under, send, wait_pending

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "tests" / "sweep_probe_app.py"


def test_each_running_cell_gets_its_own_gpu(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # the first two cells wait for each other (PROBE_BARRIER), so they overlap however slowly
    # each one starts
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PROBE_MODE="probe",
               PROBE_SLEEP="1.0", PROBE_BARRIER="2", PROBE_BARRIER_DIR=str(tmp_path / "barrier"))
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


# ----------------------------------------------------------------------------- real training cells
DEEPINIT = Path(sys.executable).with_name("deepinit")
# Tiny cells: the point is dispatch and bookkeeping, not learning.
QUICK = ["model=ci", "warmup=none", "trainer.log_interval=2", "trainer.save_interval=2",
         "trainer.valid_interval=0", "data.toy.train_size=100", "data.toy.valid_size=10",
         "data.toy.test_size=10"]
UNNAMED = ["trainer.tensorboard=false", "trainer.progress=false"]  # not in folder names


def _local_sweep(sweep_dir: Path, *overrides: str) -> list:
    return [str(DEEPINIT), "-m", "hydra/launcher=local", "hydra.launcher.gpus=[]",
            "hydra.launcher.cpu_parallelism=2", "hydra.launcher.poll_s=0.2",
            f"hydra.sweep.dir={sweep_dir}", *UNNAMED, *overrides]


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="250")


def _cell_dir(sweep_dir: Path, *overrides: str) -> Path:
    """Hydra's folder name for a cell: its overrides, sorted, joined by commas."""
    return sweep_dir / ",".join(sorted(overrides))


@pytest.mark.slow
def test_a_crashing_cell_fails_alone_with_its_own_error_file(tmp_path):
    """A cell that crashes (its checkpoint is corrupt) is recorded failed with its traceback in
    its error.txt; the other cells finish; the sweep prints a status table and exits 1. The next
    call skips the finished cells without starting them and reruns the failed one."""
    sweep = tmp_path / "sweep"
    args = [*QUICK, "trainer.max_updates=4"]
    bad = _cell_dir(sweep, *args, "trainer.seed=2")
    bad.mkdir(parents=True)
    (bad / "checkpoint_last.pt").write_bytes(b"not a checkpoint")
    cmd = _local_sweep(sweep, *args, "trainer.seed=1,2,3")[1:]  # the driver in this process
    proc = run_cli_here(cmd, cwd=tmp_path, columns=250)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    good = [_cell_dir(sweep, *args, f"trainer.seed={s}") for s in (1, 3)]
    for d in good:
        assert json.loads((d / "result.json").read_text())["status"] in ("ok", "stalled")
    result = json.loads((bad / "result.json").read_text())
    assert result["status"] == "failed" and result["error_file"] == "error.txt"
    error = (bad / "error.txt").read_text()
    assert "Traceback" in error and "checkpoint" in error
    assert not (good[0] / "error.txt").exists()
    # the table at the end: one row per cell, the failed one pointing at its error file
    assert "3 cells: 2 " in proc.stdout and "1 failed" in proc.stdout
    assert "failed" in proc.stdout and str(bad.name) in proc.stdout.replace("\n", "")
    assert "did not finish" in proc.stderr

    (bad / "checkpoint_last.pt").unlink()
    stamps = {d: (d / "result.json").stat().st_mtime_ns for d in good}
    again = run_cli_here(cmd, cwd=tmp_path, columns=250)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert json.loads((bad / "result.json").read_text())["status"] in ("ok", "stalled")
    assert not (bad / "error.txt").exists()
    assert all((d / "result.json").stat().st_mtime_ns == stamps[d] for d in good)
    assert (again.stdout + again.stderr).count("[finished, skipped]") == 2
    jobs = [json.loads(x) for x in (sweep / ".submitit" / "jobs.jsonl").read_text().splitlines()]
    assert len(jobs) == 4 and all(j["launcher"] == "local" for j in jobs)  # 3 cells, then 1


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
def test_sigterm_stops_the_workers_and_a_rerun_resumes_the_cells(tmp_path):
    """SIGTERM to `deepinit -m ... hydra/launcher=local` while two cells train: every worker
    process ends, the started cells are marked interrupted (the third one never started), the
    driver exits 143 with the table; the same command then resumes the two from their
    checkpoints and runs the third."""
    from hydra_plugins.deepinit_launcher.launcher import _CONTROLLER
    from hydra_plugins.deepinit_launcher.processes import alive, cmdline, descendants

    sweep = tmp_path / "sweep"
    args = [*QUICK, "trainer.max_updates=20"]  # frozen at their first checkpoint (update 2)
    cmd = _local_sweep(sweep, *args, "trainer.seed=1,2,3")
    driver = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    cells = [_cell_dir(sweep, *args, f"trainer.seed={s}") for s in (1, 2, 3)]
    try:
        # Freeze each cell's processes once it has a checkpoint, so that neither can finish
        # before the other has one (seed 1 once trained its 100 updates while seed 2 was still
        # starting) nor between here and the launcher's SIGINT; they are thawed once that SIGINT
        # is pending, and handle it before training further.
        frozen: set[int] = set()
        deadline = time.time() + 180
        while time.time() < deadline and driver.poll() is None:
            for d in cells[:2]:
                if (d / "checkpoint_last.pt").exists():
                    pids = holding_files_under(descendants(driver.pid), d)
                    send(pids, signal.SIGSTOP)
                    frozen |= pids
            if all(holding_files_under(frozen, d) for d in cells[:2]):
                break
            time.sleep(0.05)
        assert driver.poll() is None, "the sweep ended before it could be stopped"
        workers = descendants(driver.pid)
        assert len(workers) >= 4  # per cell: submitit's controller and its task (and sh)
        send(workers, signal.SIGSTOP)
        assert not any((d / "result.json").exists() for d in cells[:2]), "a cell finished first"
        driver.send_signal(signal.SIGTERM)
        trainers = [p for p in workers if _CONTROLLER not in cmdline(p)]
        sent = wait_pending(trainers, signal.SIGINT)
        send(workers, signal.SIGCONT)
        assert sent, "the launcher did not send SIGINT to every training process"
        out, _ = driver.communicate(timeout=90)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 143, out[-4000:]
    assert not [p for p in workers if alive(p)], "worker processes outlived the launcher"
    for d in cells[:2]:
        marker = json.loads((d / "interrupted.json").read_text())
        assert marker["status"] == "interrupted" and "SIGTERM" in marker["reason"]
        assert not (d / "result.json").exists()
    assert not cells[2].exists()  # never started: pending
    assert "2 interrupted" in out and "1 pending" in out
    from runner.sweep.report import read_cell
    assert read_cell(cells[0]).status == "interrupted"

    again = run_cli_here(cmd[1:], cwd=tmp_path, columns=250)  # the rerun's driver in this process
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    results = [json.loads((d / "result.json").read_text()) for d in cells]
    assert [r["resumed"] for r in results] == [True, True, False]
    assert all(r["updates"] == 20 for r in results)
    assert not any((d / "interrupted.json").exists() for d in cells)


def test_the_slurm_launcher_reads_a_cancelled_job_without_waiting_for_its_result(tmp_path, monkeypatch):
    """A job SLURM cancelled (or killed for time, memory or a node) never writes its result:
    collecting it must not wait submitit's 15-s grace for a result file, one cell after another;
    it waits only until SLURM no longer lists the job as live. (The real cancellation runs in
    tests/sweep/test_slurm.py; this checks which path it takes, so the job here is no SLURM job
    and the wait for it to leave the queue is recorded, not run: squeue asked about a made-up
    id would take its 30-s timeout per state where no SLURM answers.)"""
    from types import SimpleNamespace

    from hydra_plugins.deepinit_launcher import launcher as launcher_module
    from hydra_plugins.deepinit_launcher.launcher import SlurmSweepLauncher

    waited_for: list[str] = []
    monkeypatch.setattr(launcher_module, "_wait_until_gone", waited_for.append)

    class EndedJob:
        job_id = "7_0"
        paths = SimpleNamespace(result_pickle=tmp_path / "7_0_result.pkl", stdout="o", stderr="e")

        def __init__(self, state):
            self.state = state

        def wait(self):
            pass

        def results(self):
            raise AssertionError("waited for the result of a job that ended without one")

    launcher = SlurmSweepLauncher.__new__(SlurmSweepLauncher)
    launcher._cell_dir = lambda overrides, idx: None
    for state in ("CANCELLED by 0", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"):
        ret = launcher._collect(EndedJob(state), ["trainer.seed=1"], 0)
        assert "before returning" in str(ret.return_value) and state.split()[0] in str(ret.return_value)
    assert waited_for == ["7_0"] * 4

    from hydra.core.utils import JobReturn, JobStatus
    returned = JobReturn(overrides=["trainer.seed=1"], status=JobStatus.COMPLETED)

    class FinishedJob(EndedJob):  # a job that ended normally keeps submitit's wait for its file
        def results(self):
            return [returned]

    assert launcher._collect(FinishedJob("COMPLETED"), ["trainer.seed=1"], 0) is returned
    assert waited_for == ["7_0"] * 4  # a job with its result is not waited for
