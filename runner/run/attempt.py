"""One attempt at a run in its folder: the files that say how the last attempt ended, and the
signals that stop one. Every way of starting a run (`deepinit train`, a sweep's launcher,
`python -m runner.run`) marks its folder the same way:

    RUN_DIR/error.txt          why its last attempt failed: a crash's traceback, the reason its
                               config was rejected, or how its job died (status `failed`)
    RUN_DIR/interrupted.json   its last attempt was stopped before it finished: SIGINT/SIGTERM,
                               the local launcher stopped, a SLURM job out of requeues (status
                               `interrupted`; a rerun resumes it from checkpoint_last.pt, at
                               the update its "resume_update" says, or starts it over when null)

result.json stays what it was (written last, by a finished or failed attempt), so tools that read
result.json as "finished" are unaffected by interruptions. A new attempt clears error.txt,
interrupted.json and a failed result.json (`begin_attempt`), so a rerun cell reads as running.
"""
from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from runner.files import atomic_write_text
from runner.run import folder
from runner.run.status import FAILED, INTERRUPTED, is_finished_result

ERROR_FILE = "error.txt"
INTERRUPTED_FILE = "interrupted.json"


# ----------------------------------------------------------------------------- signals
class Interrupted(KeyboardInterrupt):
    """SIGTERM delivered as an exception (like SIGINT's KeyboardInterrupt), so that `finally` and
    `except KeyboardInterrupt` blocks run: cells get marked, workers get stopped."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within it (a command's main: the `deepinit` driver, a `python -m runner.run` run), SIGTERM
    raises `Interrupted`; the handler found before is put back on leaving, so that a command run
    as a function (a test, a notebook) leaves its process as it was."""
    def handler(signum, frame):
        raise Interrupted(signum)
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler set outside Python, which cannot be put back
            signal.signal(signal.SIGTERM, previous)


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
