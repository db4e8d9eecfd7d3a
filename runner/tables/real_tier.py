"""The real and gpu tiers: a target's Multi30k suite trained cell by cell on this machine with its
records in results/<target>/<tier>/ (runner/tables/suite.py, runner/tables/pool.py), every
real-tier suite's missing cells in one pool (`deepinit reproduce all`), and how far each suite
has got (`deepinit reproduce status`)."""
from __future__ import annotations

import copy
import io
import json
import logging
import statistics
import sys
import tarfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import torch

from runner.config import Config, ConfigError
from runner.console import format_duration
from runner.files import atomic_path
from runner.run.attempt import INTERRUPTED_FILE
from runner.run.build import check_config
from runner.run.folder import LAST, read_json
from runner.run.hardware import gpu_visible, usable_cores
from runner.run.status import OK
from runner.sweep.plan import norm_key
from runner.tables import pool, suite
from runner.tables.all_schemes import feeds_all_schemes, refresh_all_schemes
from runner.tables.plan import (
    RECORD_UNTIMED_S,
    CellEstimate,
    Request,
    cell_count,
    check_judged_presets,
    describe_estimates,
    model_shape,
    per_cell_range,
    ran_whole_budget,
    real_suite,
    record_device,
    sweep_dir_for,
)
from runner.tables.pool import cells_device, estimate_wall_s
from runner.tables.records import cell_key, results_root
from runner.tables.report import write_report
from runner.tables.rulebook import NOT_TRAINED
from runner.tables.targets import REAL_SUITE_ORDER, SUITE_TIERS, TARGETS, Target


def run_real(target: Target, request: Request, tier: str = "real",
             compose: Optional[Callable[[list[str]], Config]] = None) -> int:
    """SCALE=real or gpu: the target's Multi30k suite, cell by cell on this machine, with records
    in results/<target>/<tier>/ (runner/tables/suite.py)."""
    start = time.monotonic()  # a --deadline counts from here (the probe and the plan included)
    gpu = tier == "gpu"
    # A plan or a report trains nothing: both work on a login node without a GPU.
    trains = not (request.dry_run or request.table_only)
    check_judged_presets(TARGETS)
    if (gpu and trains and not gpu_visible()
            and not any(norm_key(o).startswith("trainer.device=") for o in request.overrides)):
        print(f"deepinit reproduce: --scale gpu trains on CUDA, and no GPU is visible here "
              f"(torch {torch.__version__}); use --scale real on a CPU", file=sys.stderr)
        return 2
    parallel = request.parallel or (1 if gpu else usable_cores())
    work = sweep_dir_for(request.out.resolve(), target.name, tier)
    # Overrides that only pick among the preset's own cells (part of the suite) keep the suite's
    # records and report in results/, and the report stays the whole suite's. Overrides that make
    # other cells (another lr, other data) are a variant: its records and report go beside its
    # run folders, so results/ only ever holds the preset's own cells.
    whole = real_suite(target, (), tier)
    own = {cell_key(c.key) for c in whole.cells}
    variant = not all(cell_key(c.key) in own for c in suite.plan(whole.part.preset, list(request.overrides)))
    real = real_suite(target, request.overrides, tier, records_dir=work if variant else None)
    part, cells, records, todo, minutes = real.part, real.cells, real.records, real.todo, real.minutes
    shown = cells if variant else whole.cells
    print(f"reproduce-{target.name} (real data{', GPU' if gpu else ''}): {target.title}")
    where = (f"{work} (overrides that change the preset's cells: a variant, kept out of results/)"
             if variant else suite.results_dir(target.name, tier))
    print(f"preset sweeps/{part.preset}.yaml: {len(cells)} cells, {len(cells) - len(todo)} with a "
          f"record in {where}; run folders in {work}")
    for c in cells:
        print(f"  {c.label}   [{c.record['status'] if c.record else 'to train'}]")
    # where the cells train: a real-tier suite may run on a lent GPU (trainer.device=cuda), a
    # gpu-tier rehearsal on the CPU; only records from the same kind of device time its cells
    first = compose(todo[0].overrides) if compose is not None and todo else None
    if request.overrides and compose is not None and not request.table_only:
        check_cells(todo, first, compose)
    device = cells_device(first) if first is not None else None
    threads = (planned_threads(first, device, pool.cells_at_once(parallel, len(todo)), request.overrides)
               if first is not None else None)
    estimates = real.estimates(device or ("cuda" if gpu else "cpu"), threads)
    known = [e.seconds for e in estimates if e is not None]
    on_gpu = "; on a GPU, its records or the probe time the cells" if device == "cuda" and not gpu else ""
    if known:
        print(f"estimated wall time: ~{format_duration(estimate_wall_s(known, parallel))} for "
              f"{cell_count(len(known))}, {parallel} at a time ({per_cell_range(known)} per cell, from "
              f"{describe_estimates(estimates)}{on_gpu})")
    elif todo:
        print(f"estimated wall time: unknown for {cell_count(len(todo))}, {parallel} at a time (no record of "
              f"this suite on {device or 'this device'}, and the preset's minutes per cell are for "
              f"{'a GPU' if gpu else 'a CPU'}{on_gpu or '; its records time the cells once it has some'})")
    if request.dry_run:
        return 0

    def report(_group: str = "") -> Path:
        suite.attach_records(shown, records)
        path = write_report(target.name, target.title, part.preset, shown, tier,
                            out=work if variant else None)
        if tier == "real" and not variant and feeds_all_schemes(target.name):
            refresh_all_schemes()
        return path

    # the report follows the records cell by cell, so an interrupted suite leaves both in step
    reference = median_timed(cells, device)
    deadline = cell_deadline(request, reference, minutes, start)
    rounds: list[pool.ProbeRun] = []
    own_times = record_estimates(todo, estimates)  # cells whose arm, shape or width has records
    layers: dict[str, int] = {}  # each cell's layers, composed once, for the costs below

    def cell_layers(cell: suite.SuiteCell) -> int:
        if cell.name not in layers:
            layers[cell.name] = model_layers(compose(cell.overrides))
        return layers[cell.name]

    shares: dict[str, float] = {}  # each cell's share of its updates left, read once

    def share_left(cell: suite.SuiteCell) -> float:
        if cell.name not in shares:
            shares[cell.name] = cell_updates_left(work / cell.name, cell, compose)
        return shares[cell.name]

    probed = None
    # the counts at once the records have timed (alone among them): what a probe would measure
    if device is not None and todo:
        planned = compose(todo[0].overrides).trainer
        setting = (bool(planned.compile), planned.compile_scope if planned.compile else None)
    else:
        setting = (False, None)
    recorded = record_rounds(cells, reference, device, setting, usable_cores())
    timed_counts = recorded if 1 in recorded and len(recorded) > 1 else {}
    if request.probe and trains and todo and timed_counts:
        parallel = max(timed_counts.values(), key=lambda r: (r.cells_per_hour, -r.parallel)).parallel
        print("probe: skipped: the records time " + "; ".join(r.line() for r in timed_counts.values()))
    elif request.probe and trains and todo:
        probed = min(todo, key=cell_layers)  # the cheapest cell: the first to run under a deadline
        alone_s = (CellCosts(deadline, reference, todo, [], None, cell_layers, share_left,
                             own_times).seconds(probed, 1)
                   if deadline is not None else None)
        if probe_leaves_time(deadline, alone_s):
            budget = deadline.left() * PROBE_BUDGET_SHARE if deadline is not None else None
            parallel, rounds = probe(probed, work, device == "cuda", compose, budget)
        else:  # at the count the records were timed at, where their time holds
            parallel, probed = reference.record.get("pool_slots") or 1, None
            print(f"probe: skipped: its share of the {format_duration(deadline.left())} left would leave less "
                  f"than the ~{format_duration(alone_s)} a cell takes alone (records); {parallel} at a time, "
                  f"as the records were timed")
    if deadline is not None and trains and todo:
        costs = CellCosts(deadline, reference, todo, rounds or list(recorded.values()), probed, cell_layers,
                          share_left, own_times, device)
        if rounds or (request.probe and timed_counts):
            parallel = costs.parallel_for_deadline(parallel)
        deadline = costs.deadline(parallel)
    outcome = (pool.PoolOutcome() if request.table_only else
               pool.run_cells(cells, work, records, parallel, report, compose=compose, deadline=deadline,
                              # a deadline's per-cell times (records or the probe, at this parallel
                              # count) where it has them, else the plan's estimates
                              expected=(deadline.per_cell if deadline is not None and deadline.per_cell else
                                        {c.name: e.seconds for c, e in zip(todo, estimates) if e is not None})))
    path = report()
    print()
    print(path.read_text())
    print(f"wrote {path} and {records.path}")
    if request.bundle is not None:
        written = write_bundle(request.bundle, path.parent, work, probed is not None, {
            "target": target.name, "tier": tier, "parallel": parallel, "deadline_s": request.deadline_s,
            "start_unfinished": request.start_unfinished,
            "expected_cell_s": deadline.cell_s if deadline else None, "wall_s": time.monotonic() - start,
            "cells": len(cells), "with_record": sum(c.record is not None for c in cells),
            "probe": [asdict(r) for r in rounds],
            # the counts at once the records timed, where they chose the count instead of a probe
            "record_rounds": [asdict(r) for r in timed_counts.values()] if request.probe else [],
            **asdict(outcome)})
        print(f"packed the records, report, logs and a summary into {written}")
    if outcome.crashed:
        print(f"{outcome.crashed} cell(s) failed: their train.log files in {work} say why", file=sys.stderr)
    return 1 if outcome.crashed else 0


# The probe (`--parallel auto`): rounds of this many updates, 1, 2, 4, 8 and 16 cells at once, up
# to the machine's core count (on a GPU each cell's process still needs a core to launch its
# kernels: a GPU machine lent here has 16). On a CPU a step's time settles within a few updates. On a GPU the
# first ~100 updates meet new batch shapes and run many times slower (an H200: 45 s for a 6+6
# cell's first 100, 20 s for the next 400; results/performance/gpu-h200-2026-11-28), so a GPU
# probe runs past them and reads the steady rate from its second half (pool.steady_seconds_per_update).
PROBE_UPDATES = 30
PROBE_UPDATES_CUDA = 200
PROBE_CANDIDATES = (1, 2, 4, 8, 16)
# With a deadline, the probe's rounds stop before this share of the time left would be spent on them.
PROBE_BUDGET_SHARE = 1 / 3


def probe_leaves_time(deadline: Optional[pool.Deadline], alone_s: Optional[float]) -> bool:
    """Whether a probe is worth its time: after spending its share of the time to the deadline
    (PROBE_BUDGET_SHARE), the cheapest cell, whose records say it takes `alone_s` alone, must still
    fit. Otherwise the probe would only choose among counts of which none finishes a cell: a
    9-minute GPU call after its tests leaves about 400 s, a third of it for the probe, and a 6+6
    GPU-tier cell takes ~295 s alone. Without a deadline or records, the probe runs."""
    if deadline is None or alone_s is None:
        return True
    return deadline.left() * (1.0 - PROBE_BUDGET_SHARE) >= alone_s


def probe(cell: suite.SuiteCell, work: Path, on_gpu: bool,
          compose: Callable[[list[str]], Config], budget_s: Optional[float] = None) -> tuple[int, list[pool.ProbeRun]]:
    """`--parallel auto`: how many cells at once, from a short probe of `cell` (run_real gives
    the cell to train with the fewest layers; runner/tables/pool.py probe_parallel), in a scratch
    folder beside the suite's run folders. `on_gpu`: the cells train on a GPU (cells_device)."""
    cores = usable_cores()  # one core per cell, on a CPU and, to launch kernels, on a GPU
    candidates = tuple(n for n in PROBE_CANDIDATES if n <= cores)
    updates = PROBE_UPDATES_CUDA if on_gpu else PROBE_UPDATES
    cfg = compose(cell.overrides)
    full = cfg.trainer.max_updates
    # A warmup's length does not change what a step costs, but one longer than the probe's run
    # is refused by the config check: the probe's copies warm up for half of their updates instead
    # (None: warmup=auto, which the run resolves from its init scheme).
    fit = (f"warmup.updates={updates // 2}",) if (cfg.warmup.updates or 0) >= updates else ()
    print(f"probe: {updates} updates of {cell.label}, {', '.join(map(str, candidates))} at once")
    parallel, rounds = pool.probe_parallel(cell, probe_dir(work), candidates,
                                           updates, full, compose=compose, extra=fit, budget_s=budget_s)
    print(f"probe: {parallel} cell(s) at once ({rounds[[r.parallel for r in rounds].index(parallel)].line()})"
          if rounds else "probe: no round finished; 1 cell at a time")
    return parallel, rounds


def probe_dir(work: Path) -> Path:
    """The probe's scratch folder, beside the suite's run folders: x<N>/copy<i>/ per round."""
    return work.parent / f"{work.name}-probe"


def median_timed(cells: Sequence[suite.SuiteCell], device: Optional[str] = None) -> Optional[suite.SuiteCell]:
    """The cell whose record has the median wall time (the upper one of an even count) among the
    records of cells that ran their whole budget (ok or stalled, not stopped early: a diverged
    cell or one the early-stopping rule ended is shorter) on `device` ("cpu" or "cuda"; None:
    any), None when there is none: the one cell a suite's measured time per cell comes from (a
    CPU cell's hour says nothing of a GPU's minutes)."""
    def whole(record: dict) -> bool:
        return ran_whole_budget(record) and (device is None or record_device(record) == device)

    timed = sorted((c for c in cells if c.record and whole(c.record)), key=lambda c: c.record["wall_s"])
    return timed[len(timed) // 2] if timed else None


def record_estimates(todo: Sequence[suite.SuiteCell],
                     estimates: Sequence[Optional[CellEstimate]]) -> dict[str, float]:
    """{cell name: seconds} of the cells whose estimate comes from records (their arm's, their
    model shape's, or the same width's at another depth; RealSuite.estimates), not from the
    preset's one figure."""
    return {cell.name: e.seconds for cell, e in zip(todo, estimates)
            if e is not None and e.source in ("arm", "shape", "depth")}


def cell_deadline(request: Request, reference: Optional[suite.SuiteCell], minutes: float,
                  start: Optional[float] = None) -> Optional[pool.Deadline]:
    """The pool's deadline for `--deadline`: the seconds a cell is expected to take are the wall
    time of the `reference` cell's record (median_timed; measured on the machine that trained
    it) plus RECORD_UNTIMED_S, else the preset's minutes per cell, else unknown."""
    if request.deadline_s is None:
        return None
    start = time.monotonic() if start is None else start
    cell_s = (reference.record["wall_s"] + RECORD_UNTIMED_S if reference is not None
              else (minutes * 60 if minutes else None))
    return pool.Deadline(start + request.deadline_s, cell_s, start_unfinished=request.start_unfinished)


def run_setting(record: dict) -> tuple:
    """How a record's cell ran, as far as its speed goes: the device's name, and whether (and
    how) it was compiled."""
    machine = record.get("machine") or {}
    return (machine.get("device_name"), bool(machine.get("compile")),
            (machine.get("compile_scope") or "model") if machine.get("compile") else None)


def record_rounds(cells: Sequence[suite.SuiteCell], reference: Optional[suite.SuiteCell],
                  device: Optional[str], compile_setting: tuple = (False, None),
                  most: Optional[int] = None) -> dict[int, pool.ProbeRun]:
    """What the records measured of cells sharing the machine, as probe rounds: for each count
    of cells running at once while a record's cell ran (`pool_slots`; a record without one ran
    alone), up to `most` (the machine's cores, as the probe's counts), the median seconds per
    update, start-up (wall time outside the updates: validation and decoding included) and cells
    per hour of the whole-budget records on `device` of the `reference` cell's model shape and
    device name (median_timed), compiled as the cells to train will be (`compile_setting`:
    (compile, scope)). {} without a reference, or where the reference ran otherwise. A whole
    cell times a count better than the probe's short rounds, and costs a GPU call nothing."""
    if reference is None or device is None:
        return {}

    wanted = (run_setting(reference.record)[0], *compile_setting)
    if run_setting(reference.record) != wanted:
        return {}
    by_count: dict[int, list[dict]] = {}
    for cell in cells:
        r = cell.record
        if (r and ran_whole_budget(r) and record_device(r) == device and r.get("seconds_per_update")
                and r.get("updates") and model_shape(cell) == model_shape(reference) and run_setting(r) == wanted
                and (most is None or int(r.get("pool_slots") or 1) <= most) and pool_threads(r, device, most)):
            by_count.setdefault(int(r.get("pool_slots") or 1), []).append(r)
    rounds = {}
    for n, records in sorted(by_count.items()):
        spu = statistics.median(r["seconds_per_update"] for r in records)
        start = statistics.median(max(0.0, r["wall_s"] - r["updates"] * r["seconds_per_update"]) for r in records)
        rounds[n] = pool.ProbeRun(n, spu, start, n * 3600.0 / statistics.median(r["wall_s"] for r in records))
    return rounds


def check_cells(todo: Sequence[suite.SuiteCell], first: Config,
                compose: Callable[[list[str]], Config]) -> None:
    """check_config on each cell left to train (`first`: the first one's config, composed), as
    its run will check it, before any starts: the presets' own cells pass (tests), but a user's
    override can fail some or all of them, each of which would start, crash and count as failed.
    Raises ConfigError naming the cell. The warnings composing and checking log were given for
    the first cell already; the others' repeat them, so they are not logged."""
    for cell in todo:
        try:
            if cell is todo[0]:
                check_config(copy.deepcopy(first))  # check_config fills in what the run resolves
                continue
            logging.disable(logging.WARNING)
            try:
                check_config(compose(cell.overrides))
            finally:
                logging.disable(logging.NOTSET)
        except ConfigError as err:
            raise ConfigError(f"{cell.label}: {err}") from None


def planned_threads(cfg: Config, device: Optional[str], parallel: int, overrides: Sequence[str]) -> Optional[int]:
    """The CPU threads each of a suite's cells will train with at `parallel` at once: a user's
    trainer.threads as given (None for 0, torch's default), else the pool's share of the cores
    (pool.cell_threads); None on a GPU, where records are not told apart by threads."""
    if device != "cpu":
        return None
    if pool.sets_threads(overrides):
        return cfg.trainer.threads or None
    return pool.cell_threads(device, parallel)


def pool_threads(record: dict, device: str, cores: Optional[int]) -> bool:
    """Whether a record's cell ran with the threads a pool gives a cell now at the record's count
    at once (pool.cell_threads): on a CPU of `cores` cores, a cell alone gets them all, so a record
    timed alone with one thread (as pools ran every cell before) does not time a pool of one."""
    slots = int(record.get("pool_slots") or 1)
    threads = int((record.get("machine") or {}).get("threads") or 1)
    return threads == pool.cell_threads(device, slots, cores)


# What a probe round does not time: validation passes, checkpoints and the final beam-search
# decoding (a guess, not a measurement; a cell's record replaces the whole estimate once one exists).
PROBE_UNTIMED_S = 60.0


def model_layers(cfg: Config) -> int:
    """Layers a token passes through: both stacks of translation, the one stack of task=lm."""
    if cfg.task == "lm":
        return cfg.model.num_decoder_layers
    return cfg.model.num_encoder_layers + cfg.model.num_decoder_layers


def updates_left(run_dir: Path, max_updates: int) -> float:
    """The share of a cell's `max_updates` its next start still has to train: below 1 where a stop
    saved a checkpoint that the start resumes from (interrupted.json's `checkpoint` and
    `resume_update`; runner/run/attempt.py), 1 for a fresh cell, and for one whose last stop left
    no such marker (a kill leaves none: the estimate then stays that of the whole cell)."""
    marker = read_json(run_dir / INTERRUPTED_FILE)
    done = marker.get("resume_update") if isinstance(marker, dict) and marker.get("checkpoint") else None
    if not isinstance(done, int) or isinstance(done, bool) or max_updates <= 0 or not (run_dir / LAST).is_file():
        return 1.0
    return min(1.0, max(0.0, 1.0 - done / max_updates))


def cell_updates_left(run_dir: Path, cell: suite.SuiteCell, compose: Callable[[list[str]], Config]) -> float:
    """updates_left of a cell's run folder, its max_updates composed only where a stop left a marker."""
    if not (run_dir / INTERRUPTED_FILE).is_file():
        return 1.0
    return updates_left(run_dir, compose(cell.overrides).trainer.max_updates)


def resumed_seconds(whole: float, share_left: float) -> float:
    """A cell's expected seconds when `share_left` of its updates remain (updates_left): that share
    of its time past RECORD_UNTIMED_S, which start-up and the final decoding take in full."""
    if share_left >= 1.0:
        return whole
    return min(whole, RECORD_UNTIMED_S + (whole - RECORD_UNTIMED_S) * max(0.0, share_left))


class CellCosts:
    """Each cell's expected seconds under a deadline, with `parallel` cells sharing the machine.

    Two measurements can give it, each taken on one cell and scaled to every other cell by its
    layers over that cell's (an 18+18 cell expects 3x a 6+6 one):
    - the suite's records: the median record's wall time (median_timed) plus RECORD_UNTIMED_S, as
      cell_deadline, brought to a cell trained alone (divided by the probe's slowdown at the
      record's `pool_slots`, the cells its pool ran at once; a record without one, or one whose
      count the probe did not try, is taken as trained alone), times the probe's slowdown at
      `parallel` (seconds per update there over alone, both read in the same window of updates;
      1 without a probe). A cell whose own arm or model shape has records (`recorded`: the
      plan's estimates, RealSuite.estimates) takes that time instead of the median record's
      scaled by layers, with the same slowdown: cells of one depth differ by up to 6x in width's
      suite, which layers alone cannot say;
    - without a record, the probe: its projection for the probed cell at `parallel`, its start-up
      plus the cell's updates at the steady seconds per update, plus PROBE_UNTIMED_S.
    A record wins where both exist: it timed a whole cell, where the probe's short rounds read a
    GPU still warming up (on an H200, 85 ms per update over updates 100-200 of a 6+6 cell against
    34-41 ms after update 500), which projects twice the cell's time. With neither (the preset's
    minutes per cell, one figure for every cell), the deadline stays as it is."""

    def __init__(self, deadline: pool.Deadline, reference: Optional[suite.SuiteCell],
                 todo: Sequence[suite.SuiteCell], rounds: Sequence[pool.ProbeRun],
                 probed: Optional[suite.SuiteCell], cell_layers: Callable[[suite.SuiteCell], int],
                 share_left: Callable[[suite.SuiteCell], float] = lambda cell: 1.0,
                 recorded: Optional[Mapping[str, float]] = None, device: Optional[str] = None):
        """`reference`: the record that timed the suite (median_timed, the cell `deadline`'s
        cell_s comes from; cell_deadline). `share_left`: the share of a cell's updates it still
        has to train (below 1 for a cell that resumes from a checkpoint; updates_left).
        `recorded`: {cell name: seconds} from the records of the cell's own arm or model shape
        (record_estimates). `device`: where the cells train (cells_device); on a CPU, cells at
        once share its cores (pool.cell_threads)."""
        self.base, self.reference, self.todo, self.layers = deadline, reference, list(todo), cell_layers
        self.rounds = {r.parallel: r for r in rounds}
        self.probed = probed if rounds else None
        self.share_left = share_left
        self.recorded = dict(recorded or {})
        self.device = device

    def seconds(self, cell: suite.SuiteCell, parallel: int) -> Optional[float]:
        """The cell's expected seconds at `parallel` at once; for a cell that resumes, the share
        of its updates left of the time past RECORD_UNTIMED_S (start-up and the final decoding
        are paid in full)."""
        whole = self.whole_seconds(cell, parallel)
        return None if whole is None else resumed_seconds(whole, self.share_left(cell))

    def whole_seconds(self, cell: suite.SuiteCell, parallel: int) -> Optional[float]:
        """The seconds of the cell's whole budget at `parallel` at once."""
        size = max(1, self.layers(cell))
        chosen = self.rounds.get(parallel)
        if self.reference is not None and self.base.cell_s is not None:
            slots = self.reference.record.get("pool_slots") or 1
            # at the count the record ran at, its own time; otherwise brought to alone (at most
            # its time) and to `parallel` at once (at least the slowdown measured there)
            factor = 1.0 if parallel == slots else self.slowdown(parallel) / self.slowdown(slots, "lower")
            if cell.name in self.recorded:
                return self.recorded[cell.name] * factor
            return self.base.cell_s * factor * size / max(1, self.layers(self.reference))
        if chosen is not None and self.probed is not None:
            projected = 3600.0 * parallel / chosen.cells_per_hour + PROBE_UNTIMED_S
            return projected * size / max(1, self.layers(self.probed))
        return None

    def slowdown(self, parallel: int, bound: str = "upper") -> float:
        """The seconds per update with `parallel` cells at once over alone, at least 1, from the
        rounds (the probe's, or record_rounds'); 1 where they do not measure alone. A count they
        did not measure, as an upper bound (a cell's time at that count): that of the next
        measured count above it, and past the largest measured count (above 1), no more cells
        per hour than there (each cell slower in proportion to the count); as a lower bound (to
        bring a record's time back to alone): 1."""
        alone, chosen = self.rounds.get(1), self.rounds.get(parallel)
        if alone is None:
            return 1.0
        if chosen is None and bound == "upper":
            above = [n for n in self.rounds if n > parallel]
            if above:
                chosen = self.rounds[min(above)]
            elif (top := max(self.rounds)) > 1:
                return max(1.0, self.rounds[top].seconds_per_update / alone.seconds_per_update * parallel / top)
            elif self.device == "cpu" and parallel > 1:
                # timed alone only, with every core: `parallel` cells at once split them, so each
                # is at most `parallel` times slower (no more cells per hour than alone)
                return float(parallel)
        return max(1.0, chosen.seconds_per_update / alone.seconds_per_update) if chosen else 1.0

    def deadline(self, parallel: int) -> pool.Deadline:
        """The deadline with each cell's own expected seconds at `parallel` at once (`cell_s`: the
        cheapest cell's, as the summary reports it)."""
        per_cell = {c.name: s for c in self.todo if (s := self.seconds(c, parallel)) is not None}
        if not per_cell:
            return self.base
        return replace(self.base, cell_s=min(per_cell.values()), per_cell=per_cell)

    def finished(self, parallel: int, left: float) -> int:
        """Cells finished in `left` seconds at `parallel` at once, cheapest first, each slot
        taking the next cell when it ends in time."""
        costs = sorted(self.deadline(parallel).per_cell.values())
        slots = [0.0] * parallel
        done = 0
        for cost in costs:
            slot = min(range(parallel), key=slots.__getitem__)
            if slots[slot] + cost > left:
                break  # the earliest free slot cannot fit the cheapest cell left: none can
            slots[slot] += cost
            done += 1
        return done

    def parallel_for_deadline(self, parallel: int) -> int:
        """The probed count at once that finishes the most cells before the deadline: the most
        cells per hour can be a count whose slower cells no longer fit in the time left.
        `parallel` (the probe's choice) where no count finishes a cell; the more cells per hour
        on a tie."""
        left = self.base.left()
        if left <= 0 or not self.rounds:
            return parallel
        count = {n: self.finished(n, left) for n in self.rounds}
        best = max(self.rounds.values(), key=lambda r: (count[r.parallel], r.cells_per_hour, -r.parallel))
        if count[best.parallel] == 0:
            return parallel
        if best.parallel != parallel:
            print(f"probe: {best.parallel} cell(s) at once finish {count[best.parallel]} before the deadline "
                  f"({format_duration(left)} left); {parallel} at once would finish {count.get(parallel, 0)}")
        return best.parallel


def write_bundle(bundle: Path, results: Path, work: Path, probed: bool, summary: dict) -> Path:
    """One .tgz of what a machine that hands back a few files needs to return: the suite's
    records, report and plots (`results`), each cell's log (`work`/*.out and its run folder's
    train.log and result.json; no checkpoints), the same of the probe's copies when this call
    probed (probe_dir, under logs/probe/) and `summary` as summary.json."""
    bundle = bundle.resolve()
    bundle.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(bundle) as tmp, tarfile.open(tmp, "w:gz") as tar:  # a bundle is whole or absent
        for f in sorted(results.glob("*")):
            if f.is_file() and f.suffix in (".jsonl", ".md", ".png", ".json"):
                tar.add(f, arcname=f"results/{f.name}")
        _add_cell_logs(tar, work, sorted(work.glob("*.out")), "logs")
        if probed:
            probes = probe_dir(work)
            _add_cell_logs(tar, probes, sorted(probes.glob("x*/copy*/*.out")), "logs/probe")
        data = json.dumps(summary, indent=1).encode()
        info = tarfile.TarInfo("summary.json")
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return bundle


def _add_cell_logs(tar: tarfile.TarFile, root: Path, outs: Sequence[Path], prefix: str) -> None:
    """Each cell's .out file and its run folder's train.log and result.json, under `prefix` at
    their paths below `root`."""
    for out in outs:
        rel = out.relative_to(root)
        tar.add(out, arcname=f"{prefix}/{rel}")
        for name in ("train.log", "result.json"):
            run_file = out.parent / out.stem / name
            if run_file.is_file():
                tar.add(run_file, arcname=f"{prefix}/{rel.parent / out.stem / name}")


def run_all_real(request: Request, compose: Optional[Callable[[list[str]], Config]] = None) -> int:
    """Every real-tier suite's cells without a record (or those of `--suites`, in that order),
    `--parallel` at a time in one pool (a core freed at the end of one suite starts the next
    suite's first cell); a suite's report is rewritten after each of its cells, so the records
    and the report stay in step when the pool is stopped."""
    if request.overrides:
        print("deepinit reproduce all: overrides change one target's cells; run that target by itself",
              file=sys.stderr)
        return 2
    check_judged_presets(TARGETS)
    parallel = request.parallel or usable_cores()
    names = list(dict.fromkeys(request.suites or REAL_SUITE_ORDER))  # once each, in order
    jobs, costs, plans = [], [], {}
    print(f"reproduce all (real data): {len(names)} suites, records in {results_root()}")
    for name in names:
        plans[name] = real_suite(TARGETS[name])
    # one pool for every suite's cells
    threads = pool.cell_threads("cpu", pool.cells_at_once(parallel, sum(len(r.todo) for r in plans.values())))
    for name in names:
        real = plans[name]
        todo, work = real.todo, sweep_dir_for(request.out.resolve(), name, "real")
        estimates = real.estimates("cpu", threads)
        jobs += [pool.Job(cell, work, real.records, name, e.seconds if e is not None else None)
                 for cell, e in zip(todo, estimates)]
        known = [e.seconds for e in estimates if e is not None]
        costs += known
        print(f"  {name:24s} {len(real.cells) - len(todo):3d} of {len(real.cells):3d} cells have a record; "
              f"{len(todo)} to train" + (f" ({per_cell_range(known)} each, from {describe_estimates(estimates)})"
                                         if known else ""))
    print(f"estimated wall time: ~{format_duration(estimate_wall_s(costs, parallel))} for "
          f"{cell_count(len(costs))}, {parallel} at a time")
    if request.dry_run:
        return 0

    def report(name: str, with_all_schemes: bool = True) -> Path:
        real = plans[name]
        path = write_report(name, real.target.title, real.part.preset, real.cells)
        if with_all_schemes and feeds_all_schemes(name):
            refresh_all_schemes()
        return path

    deadline = cell_deadline(request, None, 0.0)
    if deadline is not None:  # suites differ in cost: each preset's minutes are not one figure
        print("deepinit reproduce all: --deadline stops the running cells at it, and starts a cell "
              "only while time is left (run one target for a per-cell estimate)")
    outcome = (pool.PoolOutcome() if request.table_only else
               pool.run_jobs(jobs, parallel, report, compose=compose, deadline=deadline))
    crashed = outcome.crashed
    for name in plans:  # every report, finished or not, from the records as they are now
        print(f"{name}: report written to {report(name, with_all_schemes=False)}")
    if any(feeds_all_schemes(name) for name in plans):
        refresh_all_schemes()
    if crashed:
        print(f"{crashed} cell(s) failed: their .out files under {request.out.resolve()} say why", file=sys.stderr)
    return 1 if crashed else 0


def real_tier_status(parallel: int, out: Optional[Path] = None,
                     compose: Optional[Callable[[list[str]], Config]] = None) -> list[dict]:
    """Per target with a real tier (and, as "<target> (gpu)", per gpu tier): planned cells,
    records by status, verdicts by kind, and the estimated wall time of the cells without a
    record (`parallel` at a time on CPU, one at a time on a GPU; each cell's time from the
    suite's records on that kind of device, on a CPU first those timed with the threads a pool
    gives each of `parallel` cells, else the preset's minutes per cell: RealSuite.estimates).
    With `out` (the suites' --out) and `compose`: "started", the cells without a record whose
    run folder there holds a checkpoint to resume from, each of which counts in the time left
    for its updates left only (updates_left)."""
    rows = []
    tiers = [(t, tier) for tier in SUITE_TIERS for t in TARGETS.values() if tier in t.parts]
    for target, tier in tiers:
        real = real_suite(target, tier=tier)
        cells = real.cells
        started: dict[str, float] = {}  # cell name -> share of its updates left
        if out is not None and compose is not None:
            work = sweep_dir_for(out.resolve(), target.name, tier)
            for cell in real.todo:
                if (share := cell_updates_left(work / cell.name, cell, compose)) < 1.0:
                    started[cell.name] = share
        device = "cuda" if tier == "gpu" else "cpu"
        threads = pool.cell_threads(device, pool.cells_at_once(parallel, len(real.todo))) if device == "cpu" else None
        known = [resumed_seconds(e.seconds, started.get(c.name, 1.0))
                 for c, e in zip(real.todo, real.estimates(device, threads)) if e is not None]
        done = [c.record for c in cells if c.record is not None]
        decoded = suite.suite_decodes(cells)
        verdict_counts: dict[str, int] = {}
        for verdict in suite.verdicts(real.part.preset, cells):
            verdict_counts[verdict.verdict] = verdict_counts.get(verdict.verdict, 0) + 1
        rows.append({"target": target.name + (" (gpu)" if tier == "gpu" else ""), "tier": tier,
                     "cells": len(cells), "records": len(done), "started": len(started),
                     # the rule book's outcomes ("ok": trained)
                     **{status: sum(suite.cell_outcome(r, decoded) == status for r in done)
                        for status in (OK, *NOT_TRAINED)},
                     "verdicts": verdict_counts,
                     "remaining_s": estimate_wall_s(known, 1 if tier == "gpu" else parallel)
                     if known else None})
    return rows


def print_status(parallel: int, out: Optional[Path] = None,
                 compose: Optional[Callable[[list[str]], Config]] = None) -> int:
    """`deepinit reproduce status`: how far every real-tier suite has got, from results/, and
    from the run folders under `out` for the cells started and not finished (real_tier_status)."""
    from rich import box  # noqa: PLC0415 (only this view draws a table)
    from rich.table import Table  # noqa: PLC0415 (see above)

    from runner.console import console  # noqa: PLC0415 (see above)

    rows = real_tier_status(parallel, out, compose)
    table = Table(title=f"real-data suites: records in {results_root()}", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in ("target", "cells", "not trained", "claims", "left"):
        # only the claims wrap, so that a narrow terminal or a pipe cuts no number short
        table.add_column(col, justify="left" if col in ("target", "claims") else "right",
                         no_wrap=col != "claims", overflow="fold" if col == "claims" else "ellipsis")
    order = ("reproduced", "not reproduced", "underpowered", "inconclusive", "incomplete", "not run")
    for r in rows:
        verdicts = ", ".join(f"{r['verdicts'][v]} {v}" for v in
                             sorted(r["verdicts"], key=lambda v: (order + (v,)).index(v))) or "-"
        remaining = ("done" if r["records"] == r["cells"] else
                     "-" if r["remaining_s"] is None else f"~{format_duration(r['remaining_s'])}")
        failed = " ".join(f"{r[k]}{letter}" for k, letter in (("diverged", "d"), ("collapsed", "c"),
                                                                 ("stalled", "s"), ("below_bar", "b")) if r[k])
        cells = f"{r['records']}/{r['cells']}" + (f"+{r['started']}" if r["started"] else "")
        table.add_row(r["target"], cells, failed or "0", verdicts, remaining)
    total_left = sum(r["remaining_s"] or 0 for r in rows if r["tier"] == "real")
    gpu_left = sum(r["remaining_s"] or 0 for r in rows if r["tier"] == "gpu")
    console.print(table)
    started = (f", +N: N more started, stopped with a checkpoint in {out} that the next call resumes from "
               "(left counts their updates left)") if any(r["started"] for r in rows) else ""
    console.print(f"cells: with a record / planned{started} (a crashed cell gets no record and runs again); "
                  f"not trained: the cells that did not train, by the rule book (d diverged, c collapsed, "
                  f"s stalled, b below the BLEU bar); claims: verdicts so far; left: "
                  f"estimated wall time of the cells without a record, {parallel} at a time (each cell's "
                  f"time from the median record of its arm, else of its model shape, as measured, else "
                  f"the preset's minutes per cell); in all ~{format_duration(total_left)} of "
                  f"CPU suites, plus ~{format_duration(gpu_left)} of (gpu) suites, one cell at a time on one "
                  "GPU (estimated). `deepinit reproduce TARGET --scale real|gpu` runs a suite's missing "
                  "cells.")
    return 0
