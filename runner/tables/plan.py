"""Planning a reproduction: what a call asks for (Request), a target's cells with the state of
their run folders (cpu and paper scales: collect) or records (real and gpu tiers: real_suite),
and how long the cells left will take."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

from runner.config import ModelConfig, TrainerConfig
from runner.console import format_duration
from runner.run.status import OK, STALLED
from runner.sweep.plan import canonical, load_preset, norm_key, plan_cells
from runner.sweep.report import find_run_dirs, read_cell
from runner.tables import suite
from runner.tables.records import Records
from runner.tables.rulebook import check_preset
from runner.tables.targets import Part, Target


@dataclass(frozen=True)
class Request:
    """What a `deepinit reproduce` call asks for (runner/cli/reproduce.py builds it from the
    command line)."""

    target: str  # a target, "all", "all-schemes", "list" or "status"
    overrides: tuple[str, ...] = ()  # extra overrides for every cell
    scale: Optional[str] = None  # None: the target's default (paper with a GPU, else cpu)
    launcher: Optional[str] = None  # None: local
    parallel: int = 0  # cells at once (0: the default of the scale)
    probe: bool = False  # real and gpu tiers (`--parallel auto`): choose `parallel` by a short probe
    out: Path = Path("outputs/reproduce")  # parent of the sweep folder <target>-<scale>
    suites: tuple[str, ...] = ()  # with "all": only these real-tier suites, in this order
    dry_run: bool = False
    no_eval: bool = False
    table_only: bool = False
    # real and gpu tiers: seconds from the start after which no cell runs (None: no limit); a cell
    # that is not expected to finish before then is not started (runner/tables/pool.py)
    deadline_s: Optional[float] = None
    # with deadline_s: once no cell left fits, start the cheapest anyway, to resume at the next call
    start_unfinished: bool = False
    bundle: Optional[Path] = None  # real and gpu tiers: pack records, report, logs and a summary here


@dataclass
class CellResult:
    axes: dict[str, str]
    status: str  # ok | diverged | stalled | failed | interrupted | running | pending
    result: dict = field(default_factory=dict)
    path: Optional[Path] = None

    def get(self, key: str) -> Optional[float]:
        v = self.result.get(key)
        if v is None or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        return float(v)


@dataclass
class Outcome:
    """What a target's table is made of: the cells of each part, by part.sub."""

    target: str
    scale: str
    cells: dict[str, list[CellResult]]
    sweep_dir: Path


# ----------------------------------------------------------------------------- cpu scale
# CPU cost model for the plan's time estimate: seconds per update per layer of each stack for the
# 64-128-2 model on the toy task (2,048-token batches, one thread), measured on this 2-core
# machine (docs/reproductions.md); plus a fixed cost per cell (process start, data, validation).
SEC_PER_LAYER_UPDATE = 0.038
CELL_OVERHEAD_S = 20.0
TOY_MAX_TOKENS = 2048  # conf/data/toy.yaml; the step time above is for batches of this size


def cell_overrides(preset: str, axes: dict[str, str], fixed: Sequence[str]) -> frozenset[str]:
    """The task overrides Hydra records in the cell's .hydra/overrides.yaml (canonical)."""
    return canonical([f"+sweep={preset}", *(f"{k}={v}" for k, v in axes.items()), *fixed])


def _preset_value(preset: str, dotted: str, fixed: Sequence[str], axes: dict[str, str]):
    for source in (axes, dict(o.split("=", 1) for o in fixed if "=" in o)):
        for k, v in source.items():
            if norm_key(k) == dotted:
                return v
    node = load_preset(preset)
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def estimate_cell_s(preset: str, axes: dict[str, str], fixed: Sequence[str]) -> float:
    """Seconds one CPU-scale cell is expected to take on one core of an idle machine."""
    layers = _preset_value(preset, "model.layers", fixed, axes) or ModelConfig.layers
    updates = _preset_value(preset, "trainer.max_updates", fixed, axes) or TrainerConfig.max_updates
    tokens = _preset_value(preset, "data.max_tokens", fixed, axes) or TOY_MAX_TOKENS
    per_update = float(layers) * SEC_PER_LAYER_UPDATE * float(tokens) / TOY_MAX_TOKENS
    return float(updates) * per_update + CELL_OVERHEAD_S


def cell_count(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def collect(part: Part, part_dir: Path, extra: Sequence[str] = ()) -> list[CellResult]:
    """Planned cells of a part with their run folders' outcomes (pending when none)."""
    cells, fixed = plan_cells(part.preset, extra)
    found = {}
    if part_dir.is_dir():
        for d in find_run_dirs(part_dir):
            c = read_cell(d)
            found[canonical(c.overrides)] = c
    out = []
    for axes in cells:
        c = found.get(cell_overrides(part.preset, axes, fixed))
        clean = {norm_key(k): v for k, v in axes.items()}
        for o in fixed:  # a single value given for an axis (e.g. method=pre_ln) still labels it
            k, _, v = o.partition("=")
            clean.setdefault(norm_key(k), v)
        if c is None:
            out.append(CellResult(clean, "pending"))
        else:
            out.append(CellResult(clean, c.status, dict(c.result), c.path))
    return out


def sweep_dir_for(out: Path, target: str, scale: str) -> Path:
    return out / f"{target}-{scale}"


def part_dir(sweep_dir: Path, part: Part) -> Path:
    return sweep_dir / part.sub if part.sub else sweep_dir


# What a record's wall_s leaves out of a cell's wall time: start-up, data loading and the final
# decoding (a Table 2 cell on CPU: 2,278 s from its first log line to its last, wall_s 2,256; on an
# H200 about 15 s).
RECORD_UNTIMED_S = 30.0


def record_device(record: dict) -> str:
    """The kind of device a record's cell trained on: "cpu" or "cuda" (cuda:1 is cuda)."""
    return str((record.get("machine") or {}).get("device") or "").split(":")[0]


def record_threads(record: dict) -> Optional[int]:
    """The CPU threads a record's cell trained with (None for a record without the count)."""
    threads = (record.get("machine") or {}).get("threads")
    return int(threads) if threads else None


def ran_whole_budget(record: dict) -> bool:
    """A record of a cell that trained its whole budget (ok or stalled, not ended early by a
    divergence or the early-stopping rule), with its wall time: a time that stands for a cell of
    another arm of the same size."""
    return (record.get("status") in (OK, STALLED) and not record.get("stopped_early")
            and bool(record.get("wall_s")))


@dataclass(frozen=True)
class CellEstimate:
    """A cell's expected wall time alone and what it comes from: "arm" (the median of its arm's
    records: the same settings, other seeds), "shape" (the median of the whole-budget records of
    cells with the same model.* settings), "depth" (those of the nearest other depth at the same
    width, scaled by layers), or "preset" (the preset's minutes per cell). `threads_matched`:
    False when its records ran with another CPU thread count than the cell will."""

    seconds: float
    source: str
    threads_matched: bool = True


def model_shape(cell) -> dict:
    """A cell's model axes (model.*), its layers included: cells of one shape cost the same."""
    return {k: v for k, v in cell.arm.items() if k.startswith("model.")}


@dataclass
class RealSuite:
    """A target's real tier as it stands: its planned cells with the records they have."""

    target: Target
    part: Part
    cells: list
    records: Records
    minutes: float  # the preset's cpu_ or gpu_minutes_per_cell (0: none given)
    tier: str = "real"

    @property
    def todo(self) -> list:
        """The cells without a record, seed-major (the order they are trained in)."""
        return suite.seed_major(self.cells)

    def estimates(self, device: str, threads: Optional[int] = None) -> list[Optional[CellEstimate]]:
        """Each cell of `todo`'s expected seconds on `device` ("cpu" or "cuda"), from the records
        this suite has on that kind of device where they time it, else the preset's figure where
        it is for that device (cpu_minutes_per_cell for a real tier, gpu_ for a gpu tier), else
        None. Cells of one suite differ in cost by up to 6x (width's 64- and 256-wide models),
        which one figure per preset cannot say. A record's time is as measured, on a machine that
        may have been busy with other work; the arm's median counts every record of the arm (a
        diverged seed is the arm's cost too), the shape's only whole-budget ones.

        `threads`: the CPU threads each cell will train with (pool.cell_threads). Records timed
        with that many threads (`machine.threads`) come first, as arm, shape and depth; only a
        cell that none of them times takes records timed with another count (1 and 2 threads
        differ by 1.6x to 1.9x per update on the 2-core CPU,
        results/performance/cell-threads-cpu-47a7a9d), and its estimate says so."""
        timed = [c for c in self.cells if c.record and c.record.get("wall_s") and record_device(c.record) == device]
        preset_device = "cuda" if self.tier == "gpu" else "cpu"
        same = [c for c in timed if record_threads(c.record) == threads] if threads else timed
        tiers = [(same, True)] + ([(timed, False)] if threads and len(same) < len(timed) else [])

        def median_s(cells: list) -> Optional[float]:
            return statistics.median(c.record["wall_s"] for c in cells) + RECORD_UNTIMED_S if cells else None

        def shape(cell, layers: bool = True) -> dict:
            return {k: v for k, v in model_shape(cell).items() if layers or k != "model.layers"}

        def deeper_or_shallower(cell, whole: list) -> Optional[float]:
            """The whole-budget records of the same width at another depth, scaled by layers (as
            CellCosts scales), the nearest depth's median."""
            if "model.layers" not in cell.arm:
                return None
            others = [c for c in whole if shape(c, layers=False) == shape(cell, layers=False)
                      and c.arm.get("model.layers") != cell.arm["model.layers"]]
            if not others:
                return None
            target = float(cell.arm["model.layers"])
            nearest = min({float(c.arm["model.layers"]) for c in others}, key=lambda n: abs(n - target))
            return median_s([c for c in others if float(c.arm["model.layers"]) == nearest]) * target / nearest

        def from_records(cell) -> Optional[CellEstimate]:
            for records, matched in tiers:
                whole = [c for c in records if ran_whole_budget(c.record)]
                arm_s = median_s([c for c in records if c.arm == cell.arm])
                shape_s = median_s([c for c in whole if shape(c) == shape(cell)])
                scaled_s = deeper_or_shallower(cell, whole) if shape_s is None else None
                for seconds, source in ((arm_s, "arm"), (shape_s, "shape"), (scaled_s, "depth")):
                    if seconds is not None:
                        return CellEstimate(seconds, source, threads_matched=matched)
            return None

        out = []
        for cell in self.todo:
            out.append(from_records(cell) or (
                CellEstimate(self.minutes * 60, "preset") if self.minutes and device == preset_device else None))
        return out


def per_cell_range(seconds: Sequence[float]) -> str:
    """The span of cells' expected times: "~32.0 min", or "~23.5 min to 2.4 h"."""
    low, high = format_duration(min(seconds)), format_duration(max(seconds))
    return f"~{low}" if low == high else f"~{low} to {high}"


def describe_estimates(estimates: Sequence[Optional[CellEstimate]]) -> str:
    """Where a suite's per-cell estimates come from, for a plan's printout: "records of the same
    arm for 4, records of the same model shape for 6, the preset's minutes per cell for 2"; a
    source timed at another thread count than the cells will get is counted apart."""
    words = {"arm": "records of the same arm", "shape": "records of the same model shape",
             "depth": "records of the same width at another depth, scaled by layers",
             "preset": "the preset's minutes per cell", None: "no estimate"}
    counts: dict[tuple, int] = {}
    for e in estimates:
        key = (e.source, e.threads_matched) if e is not None else (None, True)
        counts[key] = counts.get(key, 0) + 1
    order = [(s, m) for s in words for m in (True, False)]
    return ", ".join(f"{words[s]}{'' if m else ' timed at another thread count'} for {counts[(s, m)]}"
                     for s, m in order if counts.get((s, m)))


def check_judged_presets(targets: Mapping[str, Target]) -> None:
    """check_preset on every real and GPU tier preset of `targets`: a pool that refreshes a table
    gathered from several suites (all-schemes) reads them all, so one that disagrees with the
    rule book is refused before any cell starts rather than after the first one ends."""
    for target in targets.values():
        for tier in ("real", "gpu"):
            for part in target.parts.get(tier, ()):
                check_preset(load_preset(part.preset), part.preset)


def real_suite(target: Target, overrides: Sequence[str] = (), tier: str = "real",
               records_dir: Optional[Path] = None) -> RealSuite:
    """The suite's cells (with `overrides`) and the records they have in `records_dir`
    (default: results/<target>/<tier>/)."""
    part = target.parts[tier][0]
    check_preset(load_preset(part.preset), part.preset)  # its records are judged by the rule book
    cells = suite.plan(part.preset, list(overrides))
    records = Records.load(records_dir or suite.results_dir(target.name, tier))
    suite.attach_records(cells, records)
    key = "gpu_minutes_per_cell" if tier == "gpu" else "cpu_minutes_per_cell"
    minutes = float((load_preset(part.preset).get("sweep") or {}).get(key) or 0)
    return RealSuite(target, part, cells, records, minutes, tier)
