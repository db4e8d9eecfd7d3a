"""One sweep cell's state: the files that say how its last attempt ended, its launcher job, and
the status derived from both.

Besides the run folder's own files (runner/run/folder.py), a cell may hold error.txt and
interrupted.json, the files of its last attempt (runner/run/attempt.py), and the sweep folder
holds the launchers' job log:

    SWEEP_DIR/.submitit/jobs.jsonl   one line per submitted cell: its overrides, launcher, job id

Statuses (runner/run/status.py): ok, stalled, diverged (finished: a rerun skips them), failed,
interrupted (a rerun runs them again), queued, running (a launcher job is waiting or working on
them), pending (not started).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from runner.run import folder
from runner.run.attempt import INTERRUPTED_FILE
from runner.run.status import (
    FAILED,
    FINISHED,
    INTERRUPTED,
    PENDING,
    QUEUED,
    RUNNING,
    ended_status,
)

JOB_LOG = Path(".submitit") / "jobs.jsonl"

# SLURM job states (squeue/sacct) -> cell status, for a job that has not written result.json.
_SLURM_ACTIVE = {"PENDING": QUEUED, "CONFIGURING": QUEUED, "REQUEUED": QUEUED,
                 "REQUEUE_HOLD": QUEUED, "REQUEUE_FED": QUEUED, "RESV_DEL_HOLD": QUEUED,
                 "SUSPENDED": QUEUED, "STOPPED": QUEUED, "RUNNING": RUNNING,
                 "COMPLETING": RUNNING, "STAGE_OUT": RUNNING, "SIGNALING": RUNNING,
                 "RESIZING": RUNNING}
_SLURM_INTERRUPTED = {"CANCELLED", "PREEMPTED", "TIMEOUT", "DEADLINE"}


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
