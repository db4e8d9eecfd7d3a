"""A suite's cells trained on this machine: each one process (`python -m runner.run RUN_DIR`, on the
config `deepinit train` would compose), `parallel` of them side by side (on a GPU, they share it)
with the machine's cores shared among them (cell_threads), a rich progress bar counting cells with
an ETA, and each finished cell's record written at once."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from runner.config import Config
from runner.console import console, format_duration
from runner.run.folder import read_metrics, read_result, write_config
from runner.run.hardware import gpu_visible, usable_cores
from runner.sweep.plan import norm_key
from runner.tables.records import Records, record_from_run
from runner.tables.suite import SuiteCell, fmt_number, seed_major


def _cell_env(threads: int = 1) -> dict[str, str]:
    """`threads` threads per cell for the libraries that read them from the environment (torch's
    own count is the config's trainer.threads; 0, torch's default, leaves the environment as it
    is), and the cells import this very copy of the package (a suite run from a git worktree of
    a fixed commit trains every cell with that commit's code)."""
    package_parent = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)
    counts = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
    return {**os.environ, **counts, "PYTHONPATH": path}


def cells_device(cfg: Config) -> str:
    """Where a cell of this config trains: "cuda" or "cpu" (trainer.device; auto: a GPU when one
    is visible)."""
    if cfg.trainer.device == "auto":
        return "cuda" if gpu_visible() else "cpu"
    return "cpu" if cfg.trainer.device == "cpu" else "cuda"


def cell_threads(device: str, parallel: int, cores: Optional[int] = None) -> int:
    """The CPU threads of each cell when `parallel` cells share the machine: on the CPU, its cores
    shared out (one each at the default of one cell per core; all of them for a cell trained
    alone, as `--parallel 1` asks, so that a long cell that must finish in one sitting uses every
    core), at most OMP_NUM_THREADS where the environment sets it (torch's own default count
    follows it too); on a GPU one, as each process only launches kernels. `device`: "cpu" or
    "cuda" (cells_device). `cores`: usable_cores() unless given. Threads change how CPU sums
    round, so a cell's losses repeat bit for bit at the same count only (its record's
    machine.threads)."""
    if device != "cpu":
        return 1
    share = max(1, (cores or usable_cores()) // max(1, parallel))
    limit = os.environ.get("OMP_NUM_THREADS", "").strip()
    return min(share, int(limit)) if limit.isdigit() and int(limit) > 0 else share


def cells_at_once(parallel: int, cells: int) -> int:
    """How many cells a pool of `parallel` slots runs at once with `cells` to train, the count
    cell_threads shares the cores among: fewer slots than cells leave none idle."""
    return max(1, min(parallel, cells))


def sets_threads(overrides: Sequence[str]) -> bool:
    """Whether the overrides set trainer.threads themselves (a user's, passed to every cell)."""
    return any(norm_key(o.split("=", 1)[0]) == "trainer.threads" for o in overrides if "=" in o)


@dataclass
class Job:
    """One cell to train, with where its run folder and its record go. `group` names its suite
    (the target) when one pool trains several suites."""

    cell: SuiteCell
    work: Path
    records: Records
    group: str = ""
    expected_s: Optional[float] = None  # its wall time as estimated (RealSuite.estimates), for the ETA

    @property
    def label(self) -> str:
        return f"{self.group}: {self.cell.label}" if self.group else self.cell.label


@dataclass(frozen=True)
class Deadline:
    """When the pool must be done (time.monotonic()), and the seconds a cell is expected to take
    (None: unknown, so a cell is started while time is left), or, by cell name, each cell's own
    (`per_cell`; cells it does not name take `cell_s`)."""

    at: float
    cell_s: Optional[float] = None
    per_cell: Mapping[str, float] = field(default_factory=dict)
    # once no cell left fits, the cheapest cells left take the free slots anyway (while
    # UNFINISHED_MIN_LEFT_S are left): they stop at the deadline with a checkpoint that the next
    # call on this machine resumes from
    start_unfinished: bool = False

    def left(self) -> float:
        return self.at - time.monotonic()

    def expected_s(self, name: str = "") -> float:
        return self.per_cell.get(name, self.cell_s or 0.0)

    def fits(self, name: str = "") -> bool:
        """Whether the cell `name` (any cell, without per-cell times), started now, is expected
        to finish in time."""
        return self.left() > self.expected_s(name)


@dataclass
class PoolOutcome:
    """What a pool did: cells that crashed, and with a deadline, the cells it did not start
    (expected to end after it) and those it stopped at it (interrupted; the next call resumes
    them where there is a checkpoint)."""

    crashed: int = 0
    not_started: int = 0
    stopped: int = 0
    trained: int = 0


# With Deadline.start_unfinished, no cell starts with less time than this left: a start-up, a
# first validation and a checkpoint would take most of it.
UNFINISHED_MIN_LEFT_S = 300.0
# How often the pool looks for ended cells: a cell's slot goes to the next cell within this time
# (a waitpid per running cell, nothing more)
POLL_S = 0.2


def fill_slots(costs: Sequence[float], parallel: int, busy: Sequence[float] = ()) -> float:
    """Seconds until the last cell ends when `parallel` slots (the first ones busy for `busy`
    seconds) take the cells of `costs`, in the order given, each to the slot that frees first."""
    slots = [*busy, *[0.0] * max(0, max(1, parallel) - len(busy))]
    for cost in costs:
        slots[slots.index(min(slots))] += cost
    return max(slots)


def estimate_wall_s(costs: Sequence[float], parallel: int) -> float:
    """Wall time of cells run `parallel` at a time, longest first (a plan's estimate)."""
    return fill_slots(sorted(costs, reverse=True), parallel)


def run_cells(cells: Sequence[SuiteCell], work: Path, records: Records, parallel: int,
              on_cell_done: Optional[Callable[[str], None]] = None, *,
              compose: Callable[[list[str]], Config], deadline: Optional[Deadline] = None,
              expected: Optional[Mapping[str, float]] = None) -> PoolOutcome:
    """Train the cells without a record, `parallel` at a time (cell_threads each); write each
    finished cell's record at once (run_jobs). With per-cell times in the deadline, the cheaper
    cells go first (seed-major among equals), so a session cut short ends with the most records.
    `expected`: each cell's estimated wall time by name, for the time left in the log."""
    order = seed_major(cells)
    if deadline is not None and deadline.per_cell:
        order = sorted(order, key=lambda c: deadline.expected_s(c.name))
    return run_jobs([Job(c, work, records, expected_s=(expected or {}).get(c.name)) for c in order], parallel,
                    on_cell_done, compose=compose, deadline=deadline)


def run_jobs(jobs: Sequence[Job], parallel: int,
             on_cell_done: Optional[Callable[[str], None]] = None, *,
             compose: Callable[[list[str]], Config], deadline: Optional[Deadline] = None) -> PoolOutcome:
    """Train the jobs in order, `parallel` at a time (cell_threads each), writing each finished
    cell's record at once; a slot that frees takes the next job whatever its suite, so no core
    idles between suites. `on_cell_done(group)` runs after each job of the group has ended
    (recorded or crashed), so a suite's report can follow its records cell by cell.
    Ctrl-C or SIGTERM stops the running cells (`stop_cells`) before it propagates. Each cell is a
    process of its own, `python -m runner.run RUN_DIR`, on the config `compose` makes of its
    overrides (the CLI's composition: runner/cli/reproduce.py passes it). With a `deadline`, a
    cell is started only when it is expected to finish before it, and the cells still running at
    it are stopped (interrupted, like Ctrl-C), so a machine lent until then ends with every
    finished cell recorded. Returns what the pool did (PoolOutcome)."""
    pool = _Pool(jobs, parallel, on_cell_done, compose, deadline)
    columns = (TextColumn("[bold]cells"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[now]}"))
    with Progress(*columns, console=console) as progress:
        try:
            return pool.run(progress)
        except BaseException:  # Ctrl-C, SIGTERM (runner.run.attempt.Interrupted), an error: no orphan cells
            progress.stop()
            stop_cells([proc for _, proc, _ in pool.running])
            raise


# ----------------------------------------------------------------------------- how many at once
@dataclass(frozen=True)
class ProbeRun:
    """One round of the probe: `parallel` copies of a cell trained at once for a few updates."""

    parallel: int
    seconds_per_update: float  # median over the copies
    start_s: float  # median seconds of each copy's run outside its updates (start-up, data, the end)
    cells_per_hour: float  # projected for cells of the suite's full length

    def line(self) -> str:
        return (f"{self.parallel} at once: {self.seconds_per_update:.3f} s/update each, "
                f"{self.start_s:.0f} s start-up, ~{self.cells_per_hour:.1f} cells/hour")


# Probe rounds keep only what is measured: no checkpoint, one validation batch, no decoding.
PROBE_OVERRIDES = ("trainer.save_interval=0", "trainer.keep_checkpoints=0", "trainer.valid_interval=0",
                   "trainer.valid_max_batches=1", "trainer.final_bleu=false", "trainer.valid_bleu=false")
PROBE_LOGS = 10  # logged intervals per probe run: the steady rate is read from the later ones


def steady_seconds_per_update(record: dict, metrics: Sequence[dict]) -> float:
    """Seconds per update over the second half of a run's updates, from the training log's
    cumulative wall times: a GPU's first updates meet new batch shapes and run many times slower
    (an H200's first 100 updates of a 6+6 cell took 45 s, the next 400 took 20 s), so a short
    run's mean (`seconds_per_update`) would project that start-up onto every update. The mean
    where the log has fewer than two records in the second half."""
    half = record["updates"] / 2
    late = [(r["step"], r["wall_s"]) for r in metrics
            if r.get("split") == "train" and r.get("wall_s") is not None and r["step"] > half]
    if len(late) < 2 or late[-1][0] <= late[0][0] or late[-1][1] <= late[0][1]:
        return record["seconds_per_update"]
    return (late[-1][1] - late[0][1]) / (late[-1][0] - late[0][0])


def probe_parallel(cell: SuiteCell, work: Path, candidates: Sequence[int], updates: int, full_updates: int,
                   *, compose: Callable[[list[str]], Config], extra: Sequence[str] = (),
                   budget_s: Optional[float] = None) -> tuple[int, list[ProbeRun]]:
    """How many cells to run at once: `cell` trained for `updates` updates alone, then as n copies
    at once for each n of `candidates` (separate processes in `work`, as the pool runs them), each
    round's cells per hour projected for cells of `full_updates` updates from its steady seconds
    per update (steady_seconds_per_update) and the rest of its wall time as start-up; it stops at
    the first round that gains nothing on the best before it, and before a round that would end
    past `budget_s` seconds of probing (each round takes at least as long as the one before).
    A round still running when `budget_s` is spent is stopped, and the probe ends there. The probe
    starts from an empty `work` (its folders hold this call's rounds only). `extra` overrides fit
    the cell to the probe's short run without changing a step's cost.
    Returns the n with the most cells per hour (the smallest on a tie) and every round."""
    rounds: list[ProbeRun] = []
    probe = SuiteCell([*cell.overrides, f"trainer.max_updates={updates}", *PROBE_OVERRIDES,
                       f"trainer.log_interval={max(1, updates // PROBE_LOGS)}", *extra],
                      cell.key, cell.arm, cell.seed)
    shutil.rmtree(work, ignore_errors=True)  # an earlier call's copies would be read as this call's
    began, last_round_s = time.monotonic(), 0.0
    # a round still running when the budget is spent is stopped, and the probe ends with it
    budget = Deadline(began + budget_s) if budget_s is not None else None
    for n in sorted(set(candidates)):
        if budget_s is not None and rounds and time.monotonic() - began + last_round_s > budget_s:
            console.print(f"probe: no time for {n} at once within the probe's {format_duration(budget_s)}")
            break
        folder = work / f"x{n}"
        jobs = [Job(probe, folder / f"copy{i}", Records.load(folder / f"copy{i}"), f"probe x{n}")
                for i in range(n)]
        round_began = time.monotonic()
        run_jobs(jobs, n, compose=compose, deadline=budget)
        last_round_s = time.monotonic() - round_began
        done = [(r, read_metrics(j.work / probe.name)) for j in jobs
                if (r := record_from_run(j.work / probe.name, probe.key, probe.arm, probe.seed))
                and r.get("seconds_per_update") and r.get("updates")]
        if len(done) < n:
            console.print(f"probe: {n} at once did not finish ({len(done)} of {n} copies); stopping the probe")
            break
        steady = [steady_seconds_per_update(r, m) for r, m in done]
        spu = float(np.median(steady))
        start = float(np.median([max(0.0, r["wall_s"] - r["updates"] * s) for (r, _), s in zip(done, steady)]))
        rounds.append(ProbeRun(n, spu, start, n * 3600.0 / (start + full_updates * spu)))
        console.print(f"probe: {rounds[-1].line()}")
        if len(rounds) > 1 and rounds[-1].cells_per_hour <= max(r.cells_per_hour for r in rounds[:-1]):
            break  # more at once no longer pays: the larger rounds are not tried
    if not rounds:
        return 1, rounds
    best = max(rounds, key=lambda r: (r.cells_per_hour, -r.parallel))
    return best.parallel, rounds


def stop_cells(procs: Sequence[subprocess.Popen], grace_s: float = 60.0,
               settle_s: float = 2.0) -> None:
    """Stop running cells so that none trains on orphaned (a later call would start the same
    cell in the same folder): SIGTERM, which a cell handles like Ctrl-C (it writes
    interrupted.json, and the next call resumes it from checkpoint_last), then SIGKILL after
    grace_s. Processes that a Ctrl-C in the terminal reached already get settle_s to end first."""
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Pool:
    """run_jobs' state: the queue and the running cells (job, process, log file)."""

    def __init__(self, jobs: Sequence[Job], parallel: int,
                 on_cell_done: Optional[Callable[[str], None]], compose: Callable[[list[str]], Config],
                 deadline: Optional[Deadline] = None):
        self.compose = compose
        self.deadline = deadline
        self.queue = list(jobs)
        self.parallel = parallel
        # the cells that can run at once: a pool of fewer jobs than slots shares the cores among those
        self.sharing = cells_at_once(parallel, len(self.queue))
        self.on_cell_done = on_cell_done
        self.running: list[tuple[Job, subprocess.Popen, object]] = []
        self.started: dict[str, float] = {}  # each running cell's start (time.monotonic())
        # the most cells running at once while each cell ran (its record's pool_slots): a pool's
        # last cells, or a pool of more slots than cells, share the machine with fewer than `parallel`
        self.peak: dict[str, int] = {}
        self.walls: list[float] = []  # the wall_s of each cell recorded here

    def _now(self) -> str:
        return f"running: {', '.join(j.label for j, _, _ in self.running)}"

    def _start(self, job: Job) -> None:
        job.work.mkdir(parents=True, exist_ok=True)
        run_dir = job.work / job.cell.name
        overrides = [*job.cell.overrides, "trainer.progress=false"]
        cfg = self.compose(overrides)
        if not sets_threads(job.cell.overrides):  # a user's trainer.threads reaches the cell as given
            threads = cell_threads(cells_device(cfg), self.sharing)
            overrides.insert(-1, f"trainer.threads={threads}")
            cfg = replace(cfg, trainer=replace(cfg.trainer, threads=threads))  # as composing them would
        write_config(run_dir, cfg, overrides)  # what `deepinit train` would compose
        log = open(job.work / f"{job.cell.name}.out", "w")
        cmd = [sys.executable, "-m", "runner.run", str(run_dir)]
        self.started[job.cell.name] = time.monotonic()
        self.running.append((job, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                   env=_cell_env(cfg.trainer.threads)), log))
        for running, _, _ in self.running:
            self.peak[running.cell.name] = max(self.peak.get(running.cell.name, 0), len(self.running))

    def _finish(self, job: Job, proc: subprocess.Popen, ended: int, total: int) -> bool:
        """Record a cell whose process ended, the `ended`-th of `total`; False when it crashed.
        Its line ends with the count and the time left (_count)."""
        cell = job.cell
        record = record_from_run(job.work / cell.name, cell.key, cell.arm, cell.seed)
        if record is None or record["status"] == "failed":
            reason = (record or {}).get("reason") or f"exit code {proc.returncode}"
            console.print(f"[red]failed[/] {job.label}: {reason} ({job.work / cell.name}){self._count(ended, total)}")
            return False
        record["pool_slots"] = self.peak.pop(cell.name, 1)  # the most cells at once while it ran
        cell.record = record
        if record.get("wall_s"):
            self.walls.append(float(record["wall_s"]))
        job.records.put(record)
        job.records.save()
        console.print(f"{record['status']:>8} {job.label}: best valid loss "
                      f"{fmt_number(record.get('best_valid_loss'), '.3f')}, BLEU "
                      f"{fmt_number(record.get('bleu'), '.2f')}, {record.get('wall_s') or 0:.0f} s"
                      f"{self._count(ended, total)}")
        return True

    def left_s(self) -> Optional[float]:
        """The wall time the cells not yet ended should take, as this pool runs them: each running
        cell holds its slot for what is left of its time, and the queued cells go, in queue
        order, to the slot that frees first. A cell's time is its expected seconds where every
        cell has them, else the mean wall time of the cells recorded here (a record's own
        wall_s, so a cell resumed from a checkpoint, which ends minutes after this pool started
        it, does not read as a fast one); None without either."""
        pending = [*self.queue, *(job for job, _, _ in self.running)]
        estimated = all(job.expected_s for job in pending)
        if not (estimated or self.walls):
            return None
        mean = float(np.mean(self.walls)) if self.walls else 0.0

        def cost(job: Job) -> float:
            return float(job.expected_s) if estimated else mean

        now = time.monotonic()
        busy = [max(0.0, cost(job) - (now - self.started.get(job.cell.name, now))) for job, _, _ in self.running]
        return fill_slots([cost(job) for job in self.queue], self.parallel, busy)

    def _count(self, ended: int, total: int) -> str:
        """The end of a finished cell's line in a log without the progress bar (not a terminal):
        '[k of N cells, ~T left]' (left_s)."""
        if console.is_terminal:
            return ""
        left = self.left_s()
        left_words = "" if ended == total or left is None else f", ~{format_duration(left)} left"
        return f"  [{ended} of {total} cells{left_words}]"

    def run(self, progress: Progress) -> PoolOutcome:
        task = progress.add_task("cells", total=len(self.queue), now="")
        outcome, ended, total = PoolOutcome(), 0, len(self.queue)
        deadline = self.deadline
        while self.queue or self.running:
            while self.queue and len(self.running) < self.parallel:
                fitting = 0 if deadline is None else next(
                    (i for i, job in enumerate(self.queue) if deadline.fits(job.cell.name)), None)
                if fitting is None and deadline.start_unfinished and deadline.left() > UNFINISHED_MIN_LEFT_S:
                    costs = [deadline.expected_s(job.cell.name) for job in self.queue]
                    fitting = costs.index(min(costs))
                    console.print(f"deadline: starting {self.queue[fitting].label} (~"
                                  f"{format_duration(costs[fitting])}) with {format_duration(deadline.left())} "
                                  "left: it stops at the deadline with a checkpoint, and the next call on "
                                  "this machine resumes it")
                if fitting is None:  # time stays the same or shrinks: what does not fit now never will
                    outcome.not_started = len(self.queue)
                    cheapest = min(deadline.expected_s(job.cell.name) for job in self.queue)
                    console.print(f"deadline: {outcome.not_started} cell(s) not started, "
                                  f"{format_duration(max(0.0, deadline.left()))} left and ~"
                                  f"{format_duration(cheapest)} for the cheapest")
                    self.queue.clear()
                    progress.update(task, total=ended + len(self.running))
                    break
                self._start(self.queue.pop(fitting))
                progress.update(task, now=self._now())
            if deadline is not None and self.running and deadline.left() <= 0:
                outcome.stopped = len(self.running)
                console.print(f"deadline: stopping {outcome.stopped} running cell(s); the same command "
                              "resumes them where they have a checkpoint")
                stop_cells([proc for _, proc, _ in self.running], settle_s=0.0)
            time.sleep(POLL_S if deadline is None else max(0.05, min(POLL_S, deadline.left())))
            for item in list(self.running):
                job, proc, log = item
                if proc.poll() is None:
                    continue
                self.running.remove(item)
                log.close()
                ended += 1
                if outcome.stopped and not read_result(job.work / job.cell.name):
                    progress.advance(task)
                    continue  # stopped at the deadline before its result: interrupted, not crashed
                ok = self._finish(job, proc, ended, total)
                outcome.crashed += not ok
                outcome.trained += ok
                if self.on_cell_done is not None:
                    try:
                        self.on_cell_done(job.group)
                    except Exception as err:  # the record is saved; a report must not stop the pool
                        console.print(f"[yellow]warning[/] {job.group}: report not written: "
                                      f"{type(err).__name__}: {err}")
                progress.advance(task)
                progress.update(task, now=self._now())
        return outcome

