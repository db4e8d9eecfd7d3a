"""A run's status: the one vocabulary every report uses (the run summary, `deepinit -m`'s table,
`deepinit sweep status`, `deepinit report`, the reproduction tables).

A run that ended says how in result.json's "status": ok, diverged (the training loss blew up;
a result, not an error) or failed (a crash, a rejected config, a dead job). A run that finished
ok but never beat the unigram model (result.json "stalled": true, docs/training.md) reads
"stalled" everywhere (`run_status`). A run without a result.json is interrupted (its folder
holds interrupted.json: a rerun resumes it), running, queued (a launcher job waits for it) or
pending (no folder yet).

The rule book of the reproduction tables (runner/tables/rulebook.py) reads these statuses into
its own outcomes (trained, diverged, collapsed, stalled, below_bar, failed).
"""
from __future__ import annotations

from typing import Optional

OK = "ok"
STALLED = "stalled"
DIVERGED = "diverged"
FAILED = "failed"
INTERRUPTED = "interrupted"
RUNNING = "running"
QUEUED = "queued"
PENDING = "pending"

# every status, in the order counts of them are printed
STATUSES = (OK, STALLED, DIVERGED, FAILED, INTERRUPTED, RUNNING, QUEUED, PENDING)
# finished: a rerun skips the run (divergence and a stall are results)
FINISHED = (OK, STALLED, DIVERGED)
# ended: result.json says how (finished, or failed)
ENDED = (OK, STALLED, DIVERGED, FAILED)
# result.json "status" values of a finished run (stalled is "ok" with "stalled": true)
FINISHED_RESULTS = (OK, DIVERGED)
# no result.json yet: a launcher job is waiting or working on the run
ACTIVE = (QUEUED, RUNNING)
# no result.json yet (interrupted, running, queued, or not started)
UNFINISHED = (INTERRUPTED, RUNNING, QUEUED, PENDING)
# finished without a trained model (a result: the paper's "failed to train")
FAILED_TO_TRAIN = (DIVERGED, STALLED)
# ended without a trained model: failed to train, or crashed
UNTRAINED = (DIVERGED, STALLED, FAILED)
# each status' rich style in the sweep tables
STYLE = {OK: "green", STALLED: "magenta", DIVERGED: "red", FAILED: "bold red", INTERRUPTED: "bold yellow",
         RUNNING: "yellow", QUEUED: "cyan", PENDING: "dim"}


def run_status(result: Optional[dict]) -> Optional[str]:
    """A run's status from its result.json (None without one): result.json's status, except that
    a run that finished ok but never beat the unigram model ("stalled": true) is "stalled"."""
    if not result:
        return None
    status = result.get("status")
    return STALLED if status == OK and result.get("stalled") else status


def ended_status(result: dict) -> str:
    """`run_status` of a run that has a result.json, with a status outside this vocabulary (or
    none) read as failed."""
    status = run_status(result)
    return status if status in STATUSES else FAILED


def is_finished_result(result: Optional[dict]) -> bool:
    """Whether result.json says the run finished (ok, stalled or diverged): a rerun skips it."""
    return bool(result) and result.get("status") in FINISHED_RESULTS
