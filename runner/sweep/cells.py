"""One sweep cell's state: the files that say how its last attempt ended, its launcher job, and
the status derived from both.

Besides the run folder's own files (runner/run/folder.py), a cell may hold:

    RUN_DIR/error.txt          why its last attempt failed: a crash's traceback, the reason its
                               config was rejected, or how its job died (status `failed`)
    RUN_DIR/interrupted.json   its last attempt was stopped before it finished: SIGINT/SIGTERM,
                               the local launcher stopped, a SLURM job out of requeues (status
                               `interrupted`; a rerun resumes it from checkpoint_last.pt, at
                               the update its "resume_update" says, or starts it over when null)

and the sweep folder holds the launchers' job log:

    SWEEP_DIR/.submitit/jobs.jsonl   one line per submitted cell: its overrides, launcher, job id

result.json stays what it was (written last, by a finished or failed attempt), so tools that read
result.json as "finished" are unaffected by interruptions. A new attempt clears error.txt,
interrupted.json and a failed result.json (`begin_attempt`), so a rerun cell reads as running.

Statuses (runner/run/status.py): ok, stalled, diverged (finished: a rerun skips them), failed,
interrupted (a rerun runs them again), queued, running (a launcher job is waiting or working on
them), pending (not started).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from runner.files import atomic_write_text
from runner.run import folder
from runner.run.status import (
    FAILED,
    FINISHED,
    INTERRUPTED,
    PENDING,
    QUEUED,
    RUNNING,
    ended_status,
    is_finished_result,
)

ERROR_FILE = "error.txt"
INTERRUPTED_FILE = "interrupted.json"
JOB_LOG = Path(".submitit") / "jobs.jsonl"

# SLURM job states (squeue/sacct) -> cell status, for a job that has not written result.json.
_SLURM_ACTIVE = {"PENDING": QUEUED, "CONFIGURING": QUEUED, "REQUEUED": QUEUED,
                 "REQUEUE_HOLD": QUEUED, "REQUEUE_FED": QUEUED, "RESV_DEL_HOLD": QUEUED,
                 "SUSPENDED": QUEUED, "STOPPED": QUEUED, "RUNNING": RUNNING,
                 "COMPLETING": RUNNING, "STAGE_OUT": RUNNING, "SIGNALING": RUNNING,
                 "RESIZING": RUNNING}
_SLURM_INTERRUPTED = {"CANCELLED", "PREEMPTED", "TIMEOUT", "DEADLINE"}


# ----------------------------------------------------------------------------- signals
class Interrupted(KeyboardInterrupt):
    """SIGTERM delivered as an exception (like SIGINT's KeyboardInterrupt), so that `finally` and
    `except KeyboardInterrupt` blocks run: cells get marked, workers get stopped."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_on_sigterm() -> None:
    """In the process that calls it (the `deepinit` driver), SIGTERM raises `Interrupted`."""
    def handler(signum, frame):
        raise Interrupted(signum)
    signal.signal(signal.SIGTERM, handler)


def signal_of(exc: BaseException) -> int:
    """The signal behind an interruption: Interrupted's, else SIGINT (KeyboardInterrupt)."""
    return int(getattr(exc, "signum", signal.SIGINT))


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


# ----------------------------------------------------------------------------- run folder files
def begin_attempt(run_dir: Path) -> None:
    """A new attempt at a cell: forget how the last one ended unless it finished (ok/diverged
    result.json stays, and the trainer skips the cell)."""
    run_dir = Path(run_dir)
    (run_dir / ERROR_FILE).unlink(missing_ok=True)
    (run_dir / INTERRUPTED_FILE).unlink(missing_ok=True)
    result = folder.read_result(run_dir)
    if result is not None and not is_finished_result(result):
        (run_dir / "result.json").unlink(missing_ok=True)


def record_failure(run_dir: Path, reason: str, details: str = "",
                   overrides: Optional[Sequence[str]] = None) -> bool:
    """result.json status failed with a one-line reason, and error.txt with the details (a
    traceback, a log tail). A finished cell is left alone. Returns whether it wrote."""
    run_dir = Path(run_dir)
    if folder.is_finished(run_dir):
        return False
    run_dir.mkdir(parents=True, exist_ok=True)
    text = (details or reason).rstrip() + "\n"
    atomic_write_text(run_dir / ERROR_FILE, text)
    record: dict[str, Any] = {"status": FAILED, "reason": reason, "error_file": ERROR_FILE}
    if overrides is not None:
        record["overrides"] = list(overrides)
    folder.write_result(run_dir, record)
    (run_dir / INTERRUPTED_FILE).unlink(missing_ok=True)
    return True


def mark_interrupted(run_dir: Path, reason: str) -> bool:
    """interrupted.json in a started cell that has no result.json yet. Returns whether it wrote."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or (run_dir / "result.json").exists():
        return False
    steps = [r["step"] for r in folder.read_metrics(run_dir) if isinstance(r.get("step"), int)]
    resume = folder.checkpoint_step(run_dir / folder.LAST)
    folder.write_json(run_dir / INTERRUPTED_FILE, {
        "status": INTERRUPTED, "reason": reason, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "last_logged_update": max(steps) if steps else None,
        "checkpoint": resume is not None,
        "resume_update": resume})  # where a rerun continues: checkpoint_last.pt's update
    return True


def resume_note(run_dir: Path, resume: bool = True) -> str:
    """What running the same command again does to an interrupted run, in words."""
    step = folder.checkpoint_step(Path(run_dir) / folder.LAST)
    if not resume:
        return f"trainer.resume=false: running the same command again starts {run_dir} over from update 0"
    if step is None:
        return (f"nothing was saved yet: running the same command again starts {run_dir} over "
                "from update 0")
    return (f"checkpoint_last.pt holds update {step}: running the same command again resumes "
            f"{run_dir} from update {step}")


def folder_status(run_dir: Optional[Path]) -> tuple[str, str, Optional[int]]:
    """(status, reason, updates) from a run folder alone: pending without one, running when it
    has neither result.json nor interrupted.json."""
    if run_dir is None or not Path(run_dir).is_dir():
        return PENDING, "", None
    run_dir = Path(run_dir)
    result = folder.read_result(run_dir)
    if result:
        return ended_status(result), str(result.get("reason") or ""), result.get("updates")
    marker = folder.read_json(run_dir / INTERRUPTED_FILE)
    steps = [r["step"] for r in folder.read_metrics(run_dir) if isinstance(r.get("step"), int)]
    updates = max(steps) if steps else None
    if marker is not None:
        return INTERRUPTED, str(marker.get("reason") or ""), updates
    return RUNNING, "", updates


# ----------------------------------------------------------------------------- job log
def job_log_path(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / JOB_LOG


def log_jobs(sweep_dir: Path, entries: Iterable[Mapping[str, Any]]) -> None:
    """Append one line per submitted cell: {"overrides", "launcher", "job_id", ...}."""
    path = job_log_path(sweep_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    with open(path, "a") as f:
        for e in entries:
            f.write(json.dumps({"time": stamp, "host": socket.gethostname(), **e}) + "\n")


def latest_jobs(sweep_dir: Path) -> dict[frozenset, dict]:
    """The last job submitted for each cell (by its set of overrides)."""
    out: dict[frozenset, dict] = {}
    try:
        lines = job_log_path(sweep_dir).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(e, dict) and e.get("overrides") is not None:
            out[frozenset(e["overrides"])] = e
    return out


# ----------------------------------------------------------------------------- job states
def _run(cmd: list[str]) -> Optional[str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def slurm_states(job_ids: Sequence[str]) -> dict[str, str]:
    """SLURM state names (PENDING, RUNNING, COMPLETED, CANCELLED, ...) of jobs or array tasks
    ("123_4"): squeue for live ones, sacct (needs accounting) for the rest. Unknown ids are left
    out."""
    wanted = {str(j) for j in job_ids if j}
    if not wanted or shutil.which("squeue") is None:
        return {}
    arrays = sorted({j.split("_")[0] for j in wanted})
    out: dict[str, str] = {}
    text = _run(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(arrays)])
    if text is None:  # some squeue versions reject a list with a finished job in it
        text = _run(["squeue", "-h", "-r", "-o", "%i %T"]) or ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in wanted:
            out[parts[0]] = parts[1]
    rest = wanted - set(out)
    if rest and shutil.which("sacct") is not None:
        text = _run(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j",
                     ",".join(sorted({j.split("_")[0] for j in rest}))]) or ""
        for line in text.splitlines():
            job, _, state = line.partition("|")
            if job in rest and state:
                out[job] = state.split()[0]  # "CANCELLED by 0" -> CANCELLED
    return out


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, ValueError):
        return False
    return not Path("/proc").is_dir()  # no /proc/PID on a Linux box: gone


def job_states(jobs: Iterable[Mapping[str, Any]],
               slurm: Callable[[Sequence[str]], dict[str, str]] = slurm_states) -> dict[str, str]:
    """job_id -> scheduler state for logged jobs: SLURM's, or RUNNING/GONE for local jobs whose
    controller process is on this host."""
    jobs = list(jobs)
    out = slurm([str(j["job_id"]) for j in jobs if j.get("launcher") == "slurm" and j.get("job_id")])
    host = socket.gethostname()
    for j in jobs:
        if j.get("launcher") == "local" and j.get("host") == host and str(j.get("job_id", "")).isdigit():
            out[str(j["job_id"])] = "RUNNING" if _pid_alive(int(j["job_id"])) else "GONE"
    return out


def cell_status(run_dir: Optional[Path], job: Optional[Mapping[str, Any]] = None,
                job_state: Optional[str] = None) -> tuple[str, str, Optional[int]]:
    """(status, reason, updates) of one cell from its folder and its last job's state.

    A finished folder wins; then a job that is waiting or running (a resubmitted failed cell is
    queued, not failed); then what the folder says; a job that ended without a word in the
    folder was interrupted (cancelled, preempted, out of time) or failed (anything else)."""
    status, reason, updates = folder_status(run_dir)
    if status in FINISHED:
        return status, reason, updates
    state = (job_state or "").upper()
    if state in _SLURM_ACTIVE:
        return _SLURM_ACTIVE[state], "", updates
    if status in (FAILED, INTERRUPTED) or not state:
        return status, reason, updates
    if state == "GONE" and status == RUNNING:  # a local job's process ended without a result
        return INTERRUPTED, "its process is gone", updates
    if state in _SLURM_INTERRUPTED:
        return INTERRUPTED, f"job {job.get('job_id') if job else ''} {state}".strip(), updates
    if state == "GONE":  # a local job that never created its folder: never started
        return status, reason, updates
    return FAILED, f"job {job.get('job_id') if job else ''} {state}".strip(), updates
