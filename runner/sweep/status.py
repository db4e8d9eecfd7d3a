"""Where a sweep stands: every cell's status (runner/sweep/cells.py), the table `deepinit -m`
prints when it ends and `deepinit sweep status` prints any time, and the exit-code rule.

Cells are the ones multirun.yaml expects (the last `deepinit -m` call into the folder) plus, for
`sweep status`, any other run folder found under it. The rule for `deepinit -m`'s exit code:

    0    every cell finished (ok, stalled or diverged: divergence is a result), or, when the
         launcher does not wait (`hydra.launcher.wait=false`), every cell is finished or queued
         or running
    1    any cell failed (a crash or a rejected config; error.txt says why) or was interrupted,
         or a launcher that waits returned with cells unfinished; the other cells' results
         are kept and a rerun runs only the cells that did not finish
    128+N  the driver was stopped by signal N (130: SIGINT, 143: SIGTERM)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from runner.run import folder
from runner.run.attempt import ERROR_FILE
from runner.run.status import FAILED, FINISHED, INTERRUPTED, STATUSES, STYLE
from runner.sweep import cells as cellfiles
from runner.sweep.report import _is_task_override, _key, _load_yaml, expected_cells, find_run_dirs


@dataclass
class CellState:
    overrides: list[str]
    status: str
    path: Optional[Path] = None
    reason: str = ""
    updates: Optional[int] = None
    job_id: Optional[str] = None
    job_state: Optional[str] = None
    expected: bool = True  # in multirun.yaml (else a folder left by another call)
    extra: dict = field(default_factory=dict)

    @property
    def error_file(self) -> Optional[Path]:
        if self.path is None:
            return None
        p = self.path / ERROR_FILE
        return p if p.exists() else None

    def as_dict(self, root: Path) -> dict:
        return {"overrides": self.overrides, "status": self.status, "reason": self.reason,
                "updates": self.updates, "job_id": self.job_id, "job_state": self.job_state,
                "path": str(self.path.relative_to(root)) if self.path else None,
                "error_file": str(self.error_file.relative_to(root)) if self.error_file else None,
                "expected": self.expected}


def _folder_overrides(run_dir: Path) -> list[str]:
    found = _load_yaml(run_dir / ".hydra" / "overrides.yaml")
    if not found:
        result = folder.read_result(run_dir) or {}
        found = result.get("overrides") or []
    return [str(o) for o in found]


def run_dirs_by_overrides(root: Path) -> dict[frozenset, Path]:
    """Run folders under a sweep folder, by the set of task overrides Hydra recorded."""
    out = {}
    if Path(root).is_dir():
        for d in find_run_dirs(Path(root)):
            out[frozenset(_folder_overrides(d))] = d
    return out


def sweep_states(root: Path, include_other: bool = True,
                 job_states: Callable = cellfiles.job_states) -> list[CellState]:
    """Every expected cell (multirun.yaml) with its status, then (include_other) other folders."""
    root = Path(root)
    folders = run_dirs_by_overrides(root)
    jobs = cellfiles.latest_jobs(root)
    states = job_states(jobs.values()) if jobs else {}

    def find(want: frozenset, table: dict):
        exact = table.get(want)
        if exact is not None:
            return exact
        return next((v for k, v in table.items() if want <= k), None)

    out: list[CellState] = []
    used: set = set()
    combos = expected_cells(root / "multirun.yaml") if (root / "multirun.yaml").exists() else []
    for combo in combos:
        want = frozenset(o for o in combo if _is_task_override(o))
        run_dir = find(want, folders)
        job = find(want, jobs)
        if run_dir is not None:
            used.add(run_dir)
        out.append(_state(sorted(want), run_dir, job, states))
    if include_other:
        for key, run_dir in sorted(folders.items(), key=lambda kv: str(kv[1])):
            if run_dir not in used:
                st = _state(sorted(o for o in key if _is_task_override(o)), run_dir,
                            jobs.get(key), states)
                st.expected = not combos
                out.append(st)
    return out


def _state(overrides: list[str], run_dir: Optional[Path], job: Optional[dict],
           states: dict) -> CellState:
    job_id = str(job["job_id"]) if job and job.get("job_id") is not None else None
    job_state = states.get(job_id) if job_id else None
    status, reason, updates = cellfiles.cell_status(run_dir, job, job_state)
    return CellState(overrides=overrides, status=status, path=run_dir, reason=reason,
                     updates=updates, job_id=job_id, job_state=job_state)


def counts(states: Sequence[CellState]) -> dict[str, int]:
    out = {s: 0 for s in STATUSES}
    for s in states:
        out[s.status] = out.get(s.status, 0) + 1
    return out


def counts_line(states: Sequence[CellState]) -> str:
    n = counts(states)
    parts = [f"{n[s]} {s}" for s in STATUSES if n[s]]
    return f"{len(states)} cells: " + (", ".join(parts) or "none")


def exit_code(states: Sequence[CellState], waited: bool = True) -> int:
    """1 when a cell failed or was interrupted, or (waited) one is not finished; else 0."""
    expected = [s for s in states if s.expected]
    if any(s.status in (FAILED, INTERRUPTED) for s in expected):
        return 1
    if waited and any(s.status not in FINISHED for s in expected):
        return 1
    return 0


def _axes(states: Sequence[CellState]) -> list[str]:
    """Override keys whose values differ between cells, in first-seen order."""
    values: dict[str, set] = {}
    for s in states:
        for o in s.overrides:
            values.setdefault(_key(o), set())
    for k in values:
        for s in states:
            values[k].add(next((o.split("=", 1)[-1] for o in s.overrides if _key(o) == k), ""))
    return [k for k, v in values.items() if len(v) > 1]


def render(states: Sequence[CellState], root: Path, title: str = "",
           console: Optional[Console] = None) -> None:
    """The rich table: one row per cell, its varying overrides, status, updates, job, why."""
    console = console or Console()
    axes = _axes(states)
    console.print(escape(f"{title or root}: {counts_line(states)}"), soft_wrap=True)
    t = Table()
    for a in axes or ["cell"]:
        t.add_column(a)
    jobs = any(s.job_id for s in states)  # no job column for the basic launcher's sweeps
    for h in ("status", "updates", "job", "note") if jobs else ("status", "updates", "note"):
        t.add_column(h, justify="right" if h == "updates" else "left")
    for s in states:
        if axes:
            cols = [next((o.split("=", 1)[-1] for o in s.overrides if _key(o) == a), "") for a in axes]
        else:
            cols = [" ".join(s.overrides) or "-"]
        note = s.reason
        if s.error_file is not None:
            note = f"{note} (error.txt)" if note else "error.txt"
        if not s.expected:
            note = f"not in multirun.yaml; {note}" if note else "not in multirun.yaml"
        t.add_row(*map(escape, cols), f"[{STYLE.get(s.status, '')}]{s.status}[/]",
                  "-" if s.updates is None else str(s.updates),
                  *([s.job_id or "-"] if jobs else []), escape(note))
    console.print(t)
    errors = [s.error_file for s in states if s.status == FAILED and s.error_file is not None]
    for e in errors[:10]:
        console.print(f"[bold red]failed[/]: {escape(str(e))}", soft_wrap=True)
    if len(errors) > 10:
        console.print(f"... and {len(errors) - 10} more error.txt files")
