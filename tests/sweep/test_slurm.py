"""Sweeps through `hydra/launcher=slurm` on a real single-node SLURM: job arrays, requeue and
resume, GPU assignment, submit-and-leave with `deepinit sweep status`, failed and cancelled cells.

Bring one up with `WITH_ACCOUNTING=1 WITH_FAKE_GPUS=2 bash ci/slurm-single-node.sh up` (.ci/run
does); without `sinfo` or an idle node these tests skip. Accounting matters: submitit reads job
states from sacct, and a requeued job would otherwise look lost (see WITH_ACCOUNTING in
ci/slurm-single-node.sh).
"""
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.cli.report import main as main_report
from runner.sweep.report import load_sweep
from tests.process_control import all_processes, holding_files_under, send, wait_pending

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "tests" / "sweep_probe_app.py"
DEEPINIT = Path(sys.executable).with_name("deepinit")
# A tiny, fast training run: the point is dispatch, not learning.
TINY_NAMED = ["model=ci", "data.toy.train_size=300", "data.toy.valid_size=30"]
TINY = [*TINY_NAMED, "trainer.tensorboard=false", "trainer.progress=false"]  # the last two: not in folder names


def _slurm_ready() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        # a healthy controller answers at once; a stopped one makes sinfo retry for long
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                             timeout=4).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(s.strip().rstrip("*") in {"idle", "mixed"} for s in out.split())


pytestmark = [
    pytest.mark.slurm,
    pytest.mark.xdist_group("slurm"),  # one queue and one node: one pytest-xdist worker at a time
    pytest.mark.skipif(not _slurm_ready(), reason="no SLURM with an idle node (sinfo)"),
]


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPINIT_SLURM_", "SLURM_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return env


def _deepinit(sweep_dir: Path, *overrides: str, background: bool = False, **env: str):
    cmd = [str(DEEPINIT), "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep_dir}",
           "hydra.launcher.timeout_min=10", *TINY, *overrides]
    kw = dict(cwd=sweep_dir.parent, env=_env(**env), stdout=subprocess.PIPE,
              stderr=subprocess.STDOUT, text=True)
    if background:
        return subprocess.Popen(cmd, **kw)
    return subprocess.run(cmd, timeout=600, **kw)


def _cancel_all_jobs_in(sweep_dir: Path) -> None:
    """Leave no job behind after a failed test (ids from the cells' env.json)."""
    for env_json in sweep_dir.glob("*/env.json"):
        job = json.loads(env_json.read_text()).get("slurm_job_id")
        if job:
            subprocess.run(["scancel", str(job)], check=False)


def _array_task_id(raw_job_id: str) -> str:
    """`<array>_<task>` for a task's own SLURM_JOB_ID: the first task's raw id is also the array's
    id, and requeueing that would requeue every cell."""
    out = subprocess.run(["squeue", "-h", "-o", "%A %i"], capture_output=True, text=True,
                         timeout=10).stdout
    for line in out.splitlines():
        raw, task = line.split()
        if raw == str(raw_job_id):
            return task
    raise AssertionError(f"job {raw_job_id} is not in squeue:\n{out}")


needs_cli = pytest.mark.skipif(not DEEPINIT.exists(), reason="deepinit is not installed in this venv")


@needs_cli
def test_beta2_lr_grid_runs_as_one_job_array_and_reports_its_cells(tmp_path):
    """The beta2_lr preset with its lr axis narrowed on the command line to 2 of its 5 values (a
    command-line value replaces a preset's axis): 3 beta2 x 2 lr = 6 cells, one job array."""
    sweep_dir = tmp_path / "beta2_lr"
    proc = _deepinit(sweep_dir, "+sweep=beta2_lr", "optim.lr=1e-4,5e-4", "trainer.max_updates=6")
    assert proc.returncode == 0, proc.stdout[-4000:]
    # one sbatch script with a 6-task array, not 6 submissions
    scripts = list((sweep_dir / ".submitit").rglob("*_submission.sh"))
    assert any(re.search(r"^#SBATCH --array=0-5(%\d+)?$", s.read_text(), re.M) for s in scripts)
    sweep = load_sweep(sweep_dir)
    n = sweep.counts()
    assert (n["total"], n["done"], n["running"], n["pending"], n["failed"]) == (6, 6, 0, 0, 0)
    jobs = {json.loads((c.path / "env.json").read_text())["slurm_job_id"] for c in sweep.cells}
    assert len(jobs) == 6 and None not in jobs  # each cell ran in its own SLURM job
    assert main_report([str(sweep_dir), "--no-plots"]) == 0
    rows = list(csv.DictReader(open(sweep_dir / "report.csv")))
    assert len(rows) == 6
    assert {r["optim.beta2"] for r in rows} == {"0.99", "0.995", "0.999"}
    assert {r["optim.lr"] for r in rows} == {"0.0001", "0.0005"}
    assert all(r["updates"] == "6" for r in rows if r["status"] == "ok")


@needs_cli
def test_requeued_cell_resumes_from_its_checkpoint_with_identical_results(tmp_path):
    """Two identical cells (keep_checkpoints changes nothing but disk use) run side by side;
    one is preempted once it has a checkpoint. Preemption is simulated as Slurm delivers it,
    with USR2: submitit's handler then runs `scontrol requeue` for the job and exits at once,
    and Slurm starts it again in the same folder, where the trainer resumes from
    checkpoint_last.pt. (A bare `scontrol requeue` from outside only SIGTERMs the job, which
    submitit ignores for KillWait seconds, so a run this short would finish first.) With
    timeout_min <= 10 submitit counts every signal as a timeout, so this also checks that the
    preset's max_num_timeout allows requeueing (the plugin default 0 does not)."""
    sweep_dir = tmp_path / "requeue"
    driver = _deepinit(sweep_dir, "trainer.keep_checkpoints=1,2", "trainer.max_updates=80",
                       "trainer.save_interval=10", "trainer.valid_interval=40", "warmup=none",
                       background=True)
    frozen: set[int] = set()
    try:
        # The victim's processes are frozen (SIGSTOP) as soon as it has a checkpoint, and thawed
        # once Slurm's USR2 is pending on them: however fast the machine, the cell cannot
        # finish its 80 updates before the preemption reaches it.
        deadline = time.time() + 120
        victim = None
        while time.time() < deadline and driver.poll() is None:
            victim = next(iter(sweep_dir.glob("*keep_checkpoints=2*")), None)
            if victim and (victim / "checkpoint_last.pt").exists() and (victim / "env.json").exists():
                frozen = holding_files_under(all_processes(), victim)
                send(frozen, signal.SIGSTOP)
                if frozen:
                    break
            time.sleep(0.05)
        assert victim is not None and frozen and driver.poll() is None, "cell never checkpointed"
        job = _array_task_id(json.loads((victim / "env.json").read_text())["slurm_job_id"])
        assert not (victim / "result.json").exists(), "cell finished before the preemption"
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
        delivered = wait_pending(frozen, signal.SIGUSR2)
        send(frozen, signal.SIGCONT)
        assert delivered, "Slurm's USR2 never reached the training process"
        out, _ = driver.communicate(timeout=180)
    finally:
        send(frozen, signal.SIGCONT)
        if driver.poll() is None:
            driver.kill()
            _cancel_all_jobs_in(sweep_dir)
    assert driver.returncode == 0, out[-4000:]
    other = next(sweep_dir.glob("*keep_checkpoints=1*"))
    requeued, straight = (json.loads((d / "result.json").read_text()) for d in (victim, other))
    assert requeued["resumed"] is True and straight["resumed"] is False
    resumed_at = [int(m) for m in re.findall(r"resumed from .* at update (\d+)",
                                                (victim / "train.log").read_text())]
    assert len(resumed_at) == 1 and 0 < resumed_at[0] < 80, resumed_at
    for key in ("status", "updates", "train_loss", "valid_loss", "best_valid_loss"):
        assert requeued[key] == straight[key], key
    assert requeued["updates"] == 80

    def curve(d):
        lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        return [(r["split"], r["step"], r["loss"]) for r in lines]
    assert curve(victim) == curve(other)


def test_each_job_sees_its_own_fake_gpu(tmp_path):
    """Fake GPUs advertised as gres: two concurrent cells with --gpus-per-node=1 get distinct
    CUDA_VISIBLE_DEVICES from Slurm (the stand-in task records its environment)."""
    sweep_dir = tmp_path / "gpus"
    cmd = [sys.executable, str(APP), "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep_dir}",
           "hydra.launcher.timeout_min=5", "trainer.seed=1,2"]
    # the two jobs wait for each other (PROBE_BARRIER), so they overlap however late Slurm
    # starts the second
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(PROBE_MODE="probe", PROBE_SLEEP="2",
                                                      PROBE_BARRIER="2",
                                                      PROBE_BARRIER_DIR=str(tmp_path / "barrier"),
                                                      DEEPINIT_SLURM_GPUS_PER_NODE="1"),
                          capture_output=True, text=True, timeout=180)
    if "Invalid generic resource" in proc.stdout + proc.stderr:
        pytest.skip("this SLURM has no gres GPUs (start it with WITH_FAKE_GPUS=2)")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    probes = [json.loads(p.read_text()) for p in sweep_dir.glob("*/probe.json")]
    assert len(probes) == 2 and all(p["slurm_job"] for p in probes)
    a, b = probes
    assert a["start"] < b["end"] and b["start"] < a["end"], "cells did not overlap"
    assert {a["cvd"], b["cvd"]} == {"0", "1"}


@needs_cli
def test_two_task_cell_trains_with_ddp_like_one_process(tmp_path):
    """A cell with trainer.devices=2 gets tasks_per_node=2; each SLURM task is one gloo rank and
    the loss curve equals one process with the same global batch (update_freq=2)."""
    from runner.run.train import train
    from tests.conftest import compose  # the same composition as the CLI

    common = ["model.dropout=0", "trainer.max_updates=10", "warmup.updates=2",
              "trainer.log_interval=5", "trainer.save_interval=5", "trainer.valid_interval=5"]
    sweep_dir = tmp_path / "ddp"
    proc = _deepinit(sweep_dir, "trainer.devices=2", *common)
    assert proc.returncode == 0, proc.stdout
    [cell] = [p.parent for p in sweep_dir.glob("*/result.json")]
    ddp = json.loads((cell / "result.json").read_text())
    assert ddp["status"] == "ok" and ddp["world_size"] == 2
    single = train(compose([*TINY, *common, "trainer.update_freq=2"]), tmp_path / "single")

    def losses(run_dir):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"]) for r in rows if r["split"] == "train"]

    a, b = losses(cell), losses(tmp_path / "single")
    assert [s for s, _ in a] == [s for s, _ in b]
    assert [la for _, la in a] == pytest.approx([lb for _, lb in b], rel=1e-4)
    assert ddp["valid_loss"] == pytest.approx(single["valid_loss"], rel=1e-4)


def _wait_for(sweep_dir: Path, done, timeout: float = 240):
    from runner.sweep.status import sweep_states

    deadline = time.time() + timeout
    while time.time() < deadline:
        states = sweep_states(sweep_dir)
        if done(states):
            return states
        time.sleep(1)
    raise AssertionError(f"timed out: {[(s.overrides, s.status) for s in states]}")


def _job_lines(sweep_dir: Path) -> list:
    return [json.loads(x) for x in (sweep_dir / ".submitit" / "jobs.jsonl").read_text().splitlines()]


@needs_cli
def test_submit_and_leave_then_follow_with_sweep_status_and_resubmit_only_what_is_missing(tmp_path):
    """`hydra.launcher.wait=false` returns once the array is queued; `deepinit sweep status`
    shows the cells queued/running, then ok; `deepinit report` reads what has finished; a
    resubmission while jobs are live submits nothing, and once they are done it submits only
    the cell whose result is gone, in a new job folder, keeping the old ones."""
    sweep_dir = tmp_path / "leave"
    cells = ["trainer.max_updates=6", "warmup=none", "trainer.seed=1,2,3"]
    try:
        proc = _deepinit(sweep_dir, "hydra.launcher.wait=false", *cells)
        assert proc.returncode == 0, proc.stdout[-4000:]
        first = _job_lines(sweep_dir)
        assert len(first) == 3 and all(j["launcher"] == "slurm" for j in first)
        array = first[0]["job_id"].split("_")[0]
        assert all(j["job_id"].startswith(array + "_") for j in first)  # one array
        assert "deepinit sweep status" in proc.stdout
        # the driver is back while the cells are still queued or running
        live = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", array], capture_output=True,
                              text=True, timeout=30).stdout
        status = subprocess.run([str(DEEPINIT), "sweep", "status", str(sweep_dir)], capture_output=True,
                                text=True, timeout=60, env=_env(COLUMNS="200"))
        assert status.returncode == 0, status.stdout + status.stderr
        if live.strip():  # (a fast node may have run them all already)
            assert re.search(r"\b(queued|running)\b", proc.stdout + status.stdout)

        # submitted again while live: every cell has a job, nothing is submitted twice
        again = _deepinit(sweep_dir, "hydra.launcher.wait=false", *cells)
        assert again.returncode == 0, again.stdout[-4000:]
        assert len(_job_lines(sweep_dir)) == 3

        states = _wait_for(sweep_dir, lambda st: all(s.status in ("ok", "stalled") for s in st))
        assert len(states) == 3 and {s.job_id for s in states} == {j["job_id"] for j in first}
        status = subprocess.run([str(DEEPINIT), "sweep", "status", str(sweep_dir), "--json"],
                                capture_output=True, text=True, timeout=60, env=_env())
        rows = [json.loads(x) for x in status.stdout.splitlines()]
        assert [r["status"] for r in rows] == ["ok"] * 3 or {r["status"] for r in rows} <= {"ok", "stalled"}
        assert main_report([str(sweep_dir), "--no-plots"]) == 0

        # a finished sweep resubmits nothing; a cell whose result is gone is the only one resubmitted
        old_folders = sorted(p.name for p in (sweep_dir / ".submitit").iterdir() if p.is_dir())
        proc = _deepinit(sweep_dir, "hydra.launcher.wait=false", *cells)
        assert proc.returncode == 0 and "nothing to submit" in proc.stdout, proc.stdout[-4000:]
        redo = states[1].path
        (redo / "result.json").unlink()
        proc = _deepinit(sweep_dir, *cells)  # and this time wait for it
        assert proc.returncode == 0, proc.stdout[-4000:]
        lines = _job_lines(sweep_dir)
        assert len(lines) == 4 and set(lines[-1]["overrides"]) == set(states[1].overrides)
        assert proc.stdout.count("[finished, skipped]") == 2
        assert json.loads((redo / "result.json").read_text())["status"] in ("ok", "stalled")
        kept = sorted(p.name for p in (sweep_dir / ".submitit").iterdir() if p.is_dir())
        assert set(old_folders) < set(kept)  # the first array's job folders are still there
    finally:
        _cancel_all_jobs_in(sweep_dir)
        for j in (_job_lines(sweep_dir) if (sweep_dir / ".submitit" / "jobs.jsonl").exists() else []):
            subprocess.run(["scancel", j["job_id"]], check=False)


@needs_cli
def test_a_cancelled_job_reads_interrupted_and_a_crashed_cell_failed(tmp_path):
    """`scancel` on a running cell: `sweep status` says interrupted (from sacct), a crashing cell
    (corrupt checkpoint) says failed with its error.txt, and a waiting driver exits 1."""
    sweep_dir = tmp_path / "bad"
    common = ["trainer.max_updates=4000", "trainer.save_interval=10", "trainer.log_interval=10",
              "trainer.valid_interval=0", "warmup=none"]
    crash = sweep_dir / ",".join(sorted([*TINY_NAMED, *common, "trainer.seed=2"]))
    crash.mkdir(parents=True)
    (crash / "checkpoint_last.pt").write_bytes(b"not a checkpoint")
    driver = _deepinit(sweep_dir, *common, "trainer.seed=1,2", background=True)
    try:
        victim = None
        deadline = time.time() + 120
        while time.time() < deadline and victim is None:
            victim = next((d for d in sweep_dir.glob("*trainer.seed=1*") if (d / "env.json").exists()), None)
            time.sleep(0.5)
        assert victim is not None, "cell 1 never started"
        job = json.loads((victim / "env.json").read_text())["slurm_job_id"]
        subprocess.run(["scancel", _array_task_id(job)], check=True, timeout=30)
        out, _ = driver.communicate(timeout=180)
    finally:
        if driver.poll() is None:
            driver.kill()
        _cancel_all_jobs_in(sweep_dir)
    assert driver.returncode == 1, out[-4000:]
    from runner.sweep.status import sweep_states

    states = {s.path.name if s.path else None: s for s in sweep_states(sweep_dir)}
    assert states[victim.name].status == "interrupted", states[victim.name]
    assert states[crash.name].status == "failed"
    assert "Traceback" in (crash / "error.txt").read_text()
    assert "interrupted" in out and "failed" in out
