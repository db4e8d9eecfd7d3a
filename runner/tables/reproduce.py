"""One command per published table: `make reproduce-<target>` (`deepinit reproduce`).

    deepinit reproduce TARGET [--scale cpu|real|gpu|paper] [--launcher basic|local|slurm]
                              [--dry-run] [--no-eval] [--out DIR] [overrides ...]

TARGET is table2 | grid | tfixup-depth | lipschitz | ... (`list` prints them). SCALE=real (CPU)
and SCALE=gpu run the target's Multi30k suite cell by cell with records in results/
(runner/tables/suite.py); the other
scales are one or more sweep presets (`sweeps/reproduce_<target>_<scale|dataset>.yaml`) run through `deepinit -m`
into `outputs/reproduce/<target>-<scale>/` (a fixed folder, so a second call only runs the cells
that have not finished: the trainer skips finished ones). Finished cells are then scored
(the same scoring as `deepinit eval`), and the table is printed in the paper's layout with the
paper's numbers beside ours and written to `reproduction.md` in the sweep folder.

Extra overrides apply to every cell; one that names a swept axis replaces its values (e.g.
`model.layers=6,20,50` caps the depth scan). Paper numbers: the constants below, each with its
paper's table or figure.
"""
from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from runner.bench import CUDA_BF16_PEAK_TFLOPS, train_flops
from runner.config import Config, ModelConfig, TrainerConfig
from runner.console import format_duration
from runner.run.attempt import signal_of
from runner.run.evaluate import evaluate_run
from runner.run.folder import wait_interruptibly
from runner.run.status import DIVERGED, ENDED, FAILED, FAILED_TO_TRAIN, FINISHED, OK, STATUSES, UNFINISHED, UNTRAINED
from runner.sweep.plan import canonical, load_preset, norm_key, plan_cells
from runner.sweep.report import (
    find_run_dirs,
    load_sweep,
    markdown_table,
    plot_heatmaps,
    read_cell,
)
from runner.tables import suite
from runner.tables.evidence import selector_matches
from runner.tables.records import Records, cell_key, results_root
from runner.tables.rulebook import NOT_TRAINED

REPO = Path(__file__).resolve().parents[2]
# cpu: the toy smoke tier; real: Multi30k on CPU, gpu: Multi30k at the papers' model size on one GPU
# (both runner/tables/suite.py, records in results/); paper: the papers' recipes and corpora
SCALES = ("cpu", "real", "gpu", "paper")
SUITE_TIERS = ("real", "gpu")
LAUNCHERS = ("basic", "local", "slurm")
# The grid compares with the paper's count of diverged runs: stalled cells are counted apart.
DIVERGED_OR_CRASHED = (DIVERGED, FAILED)

# CPU cost model for the plan's time estimate: seconds per update per layer of each stack for the
# 64-128-2 model on the toy task (2,048-token batches, one thread), measured on this 2-core
# machine (docs/reproductions.md); plus a fixed cost per cell (process start, data, validation).
SEC_PER_LAYER_UPDATE = 0.038
CELL_OVERHEAD_S = 20.0
TOY_MAX_TOKENS = 2048  # conf/data/toy.yaml; the step time above is for batches of this size


# ----------------------------------------------------------------------------- paper numbers
# Liu et al. 2020 (Understanding the Difficulty of Training Transformers, EMNLP), Table 2
# (BLEU; None = "failed", training diverged); (mean, std or None)
TABLE2_PAPER: dict[str, dict[str, Optional[tuple[float, Optional[float]]]]] = {
    "IWSLT'14 De-En, 6L-6L small": {"post_ln": (35.64, 0.23), "pre_ln": (35.50, 0.04),
                                    "admin": (35.67, 0.15)},
    "WMT'14 En-Fr, 6L-6L base": {"post_ln": (41.29, None), "pre_ln": (40.74, None),
                                 "admin": (41.47, None)},
    "WMT'14 En-Fr, 60L-12L base": {"post_ln": None, "pre_ln": (43.10, None),
                                   "admin": (43.80, None)},
    "WMT'14 En-De, 6L-6L base": {"post_ln": (27.80, None), "pre_ln": (27.27, None),
                                 "admin": (27.90, None)},
    "WMT'14 En-De, 12L-12L base": {"post_ln": None, "pre_ln": (28.26, None),
                                   "admin": (28.58, None)},
    "WMT'14 En-De, 18L-18L base": {"post_ln": None, "pre_ln": (28.38, None),
                                   "admin": (29.03, None)},
}
TABLE2_WMT_ROW = {6: "WMT'14 En-De, 6L-6L base", 12: "WMT'14 En-De, 12L-12L base",
                  18: "WMT'14 En-De, 18L-18L base"}
METHODS = {"post_ln": "Post-LN", "pre_ln": "Pre-LN", "admin": "Admin"}
# Liu et al. 2020, Fig. 10, the no-warmup grid: diverged cells of 15 per method
GRID_PAPER_DIVERGED = {"post_ln": 7, "pre_ln": 0, "admin": 0}
GRID_PAPER_NOTE = {"post_ln": "beats Pre-LN in 7 of its 8 converged cells",
                   "pre_ln": "converges in all 15", "admin": "converges in all 15, beats Pre-LN"}
# Huang et al. 2020 (T-Fixup, ICML), Fig. 4(b) and its talk slides: IWSLT'14 De-En 64-128-2,
# first 50k updates
TFIXUP_DEPTH_PAPER = {6: 25.35, 20: 28.29, 50: 29.28, 100: 28.98, 200: 27.65}
# Xu et al. 2020 (Lipschitz Constrained Parameter Initialization for Deep Transformers, ACL),
# Tables 1 and 3, WMT'14 En-De (None = failed to converge)
LIPSCHITZ_PAPER: dict[tuple[str, str], dict[int, Optional[float]]] = {
    ("order_v1", "xavier"): {6: 27.77, 12: None, 18: None, 24: None},
    ("order_v1", "lipschitz"): {6: 27.96, 12: 28.67, 18: 29.05, 24: 29.46},
    ("order_v2", "xavier"): {6: 27.31, 12: 28.12, 18: 28.60, 24: 29.02},
    ("order_v2", "lipschitz"): {6: 27.38, 12: 28.13, 18: 28.67, 24: 29.20},
}
LIPSCHITZ_COLUMNS = [("order_v1", "xavier", "v1 (Post-LN)"), ("order_v1", "lipschitz", "v1-L"),
                     ("order_v2", "xavier", "v2 (Pre-LN)"), ("order_v2", "lipschitz", "v2-L")]


# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Part:
    """One `deepinit -m +sweep=<preset>` call of a target, into <sweep dir>/<sub>."""

    preset: str
    sub: str = ""
    data_env: Optional[str] = None  # env var naming the prepared data folder (paper scale)
    data_langs: tuple[str, str] = ("de", "en")
    data_hint: str = ""
    beam: int = 5
    lenpen: float = 1.0
    average_last: int = 10


@dataclass(frozen=True)
class Target:
    name: str
    title: str
    parts: dict[str, tuple[Part, ...]]
    render: Optional[Callable[["Outcome"], str]]  # the cpu/paper table; None: real tier only


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


IWSLT_HINT = ("the prepared IWSLT'14 De-En folder with a train split: "
              "`deepinit data prepare iwslt14 --out DIR` (downloads de-en.tgz; or --raw PATH), then "
              "DEEPINIT_IWSLT14_DIR=DIR (docs/data.md)")
WMT_HINT = ("a prepared, BPE'd WMT'14 En-De folder with {train,valid,test}.{en,de} "
            "(as Transformer-Clinic pre-process/wmt14en-de.sh: joint BPE 32k, newstest2013 valid, "
            "newstest2014 test): `deepinit data prepare wmt14-en-de --recipe admin --out DIR` "
            "(downloads the archives; or --raw DIR), then DEEPINIT_WMT14_DIR=DIR (docs/data.md)")
# CPU scale: greedy decoding of the last checkpoint (cheap); paper scale: the papers' protocol
# (Admin IWSLT beam 5 lenpen 1, WMT beam 4 lenpen 0.6: Transformer-Clinic nmt-experiments/eval_*.sh;
# T-Fixup beam 4 lenpen 0.3: layer6ai-labs/T-Fixup InferenceIWSLT.py; each the average of the last
# 10 checkpoints; Lipschitz beam 4, no length penalty, the average of the last 5: its Sec. 2.1).
CPU_EVAL = dict(beam=1, lenpen=1.0, average_last=0)


# ----------------------------------------------------------------------------- plan
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


def estimate_wall_s(costs: Sequence[float], parallel: int) -> float:
    """Wall time of cells run `parallel` at a time, longest first (what a pool of slots does)."""
    slots = [0.0] * max(1, parallel)
    for c in sorted(costs, reverse=True):
        slots[slots.index(min(slots))] += c
    return max(slots)


# ----------------------------------------------------------------------------- reading results
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


def metric_for(scale: str) -> str:
    # CPU scale is compared by validation loss (a reduced model reproduces the pattern, not
    # absolute BLEU); the paper scale by BLEU, the papers' metric.
    return "best_valid_loss" if scale == "cpu" else "bleu"


def _better(metric: str, a: float, b: float) -> bool:
    return a > b if metric == "bleu" else a < b


def summarize(cells: Sequence[CellResult], metric: str) -> Optional[float]:
    """Mean metric over the ok cells (seeds), None when none is ok."""
    vals = [c.get(metric) for c in cells if c.status == "ok"]
    vals = [v for v in vals if v is not None]
    return statistics.fmean(vals) if vals else None


def fmt_ours(cells: Sequence[CellResult], scale: str) -> str:
    """One table entry for our cells of one setting (several = seeds): 'failed' where the runs
    diverged or stalled at the unigram plateau, the metric (mean ± std over seeds) otherwise."""
    if not cells:
        return "not run"
    n = len(cells)
    div = sum(c.status in FAILED_TO_TRAIN for c in cells)
    crashed = sum(c.status == "failed" for c in cells)
    unfinished = sum(c.status in UNFINISHED for c in cells)
    ok = [c for c in cells if c.status == "ok"]
    if unfinished == n:
        return "pending" if all(c.status == "pending" for c in cells) else "running"
    if div == n:
        if n == 1 and cells[0].status == "stalled":
            return "failed (stalled)"
        step = cells[0].result.get("diverged_step")
        return "failed" + (f" (diverged @{step})" if n == 1 and step is not None else "")
    if crashed == n:
        return "crashed"
    parts = []
    loss = [c.get("best_valid_loss") for c in ok if c.get("best_valid_loss") is not None]
    bleu = [c.get("bleu") for c in ok if c.get("bleu") is not None]

    def stat(vals: list[float], digits: int, spread: bool) -> str:
        if len(vals) > 1 and spread:
            return f"{statistics.fmean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"
        return f"{statistics.fmean(vals):.{digits}f}"

    # the headline metric gets its spread over seeds, the other one its mean only
    main = [(bleu, 2, "BLEU"), (loss, 3, "loss")] if scale == "paper" else \
        [(loss, 3, "loss"), (bleu, 1, "BLEU")]
    for i, (vals, digits, name) in enumerate(main):
        if vals:
            parts.append(f"{stat(vals, digits, i == 0)} {name}")
    text = ", ".join(parts) or "ok"
    notes = []
    if div:
        notes.append(f"{div}/{n} failed")
    if crashed:
        notes.append(f"{crashed}/{n} crashed")
    if unfinished:
        notes.append(f"{unfinished}/{n} unfinished")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def fmt_paper(v: Optional[tuple[float, Optional[float]]] | Optional[float], missing: str = "-") -> str:
    if v is None:
        return "failed"
    if isinstance(v, tuple):
        mean, std = v
        return f"{mean:.2f}" + (f" ± {std:.2f}" if std is not None else "")
    return f"{v:.2f}"


def _select(cells: Sequence[CellResult], **axes: str) -> list[CellResult]:
    return [c for c in cells if all(c.axes.get(k) == str(v) for k, v in axes.items())]


def _ints(cells: Sequence[CellResult], axis: str) -> list[int]:
    return sorted({int(c.axes[axis]) for c in cells if axis in c.axes})


def _failed_all(cells: Sequence[CellResult]) -> Optional[bool]:
    """Every cell diverged or stalled (None when there are no cells or some are unfinished)."""
    if not cells or any(c.status in UNFINISHED for c in cells):
        return None
    return all(c.status in UNTRAINED for c in cells)


def _trained(cells: Sequence[CellResult]) -> Optional[bool]:
    """Every cell trained to the end (None when there are none or some are unfinished)."""
    if not cells or any(c.status in UNFINISHED for c in cells):
        return None
    return all(c.status == "ok" for c in cells)


def _several(cells: Sequence[CellResult], statuses: Sequence[str]) -> Optional[bool]:
    """2 or more cells ended with one of `statuses` (None while that is still open)."""
    if sum(c.status in statuses for c in cells) >= 2:
        return True
    if not cells or any(c.status in UNFINISHED for c in cells):
        return None
    return False


def _all(values: Sequence[Optional[bool]]) -> Optional[bool]:
    """False if any is False, else None if any is unknown, else True."""
    if any(v is False for v in values):
        return False
    return None if not values or any(v is None for v in values) else True


def _status_line(all_cells: Sequence[CellResult]) -> str:
    n = {s: sum(c.status == s for c in all_cells) for s in STATUSES}
    return (f"{len(all_cells)} cells: {n['ok']} ok, {n['diverged']} diverged, {n['stalled']} stalled, "
            f"{n['failed']} crashed, "
            f"{sum(n[s] for s in UNFINISHED)} unfinished")


def _yes(b: Optional[bool]) -> str:
    return "n/a" if b is None else ("yes" if b else "no")


# ----------------------------------------------------------------------------- renderers
def render_table2(o: Outcome) -> str:
    metric = metric_for(o.scale)
    rows = []
    checks = []
    if o.scale == "paper":
        iwslt = o.cells.get("iwslt14", [])
        row = ["IWSLT'14 De-En, 6L-6L small (5 seeds)"]
        for m in METHODS:
            row += [fmt_paper(TABLE2_PAPER["IWSLT'14 De-En, 6L-6L small"][m]),
                    fmt_ours(_select(iwslt, method=m), o.scale)]
        rows.append(row)
        for setting in ("WMT'14 En-Fr, 6L-6L base", "WMT'14 En-Fr, 60L-12L base"):
            row = [setting]
            for m in METHODS:
                row += [fmt_paper(TABLE2_PAPER[setting][m]), "not run (no En-Fr recipe)"]
            rows.append(row)
        wmt = o.cells.get("wmt14", [])
    else:
        wmt = o.cells.get("", [])
    depths = _ints(wmt, "model.layers")
    for L in depths:
        paper_row = TABLE2_WMT_ROW.get(L)
        label = (paper_row if o.scale == "paper" else
                 f"toy {L}L-{L}L 64-128-2 (paper row: {paper_row or 'none'})")
        row = [label]
        for m in METHODS:
            row += [fmt_paper(TABLE2_PAPER[paper_row][m]) if paper_row else "-",
                    fmt_ours(_select(wmt, method=m, **{"model.layers": L}), o.scale)]
        rows.append(row)
    header = ["setting"] + [f"{name} {who}" for name in METHODS.values() for who in ("(paper)", "(ours)")]
    # the pattern the Admin paper's Table 2 shows: Post-LN fails deep, Pre-LN and Admin train at
    # every depth, Admin at least as good as Pre-LN
    deep = max(depths) if depths else None
    if deep is not None:
        checks.append((f"Post-LN fails at {deep} layers",
                       _failed_all(_select(wmt, method="post_ln", **{"model.layers": deep}))))
        for m in ("pre_ln", "admin"):
            checks.append((f"{METHODS[m]} trains at every depth",
                           _all([_trained(_select(wmt, method=m, **{"model.layers": L}))
                                 for L in depths])))
        wins = []
        for L in depths:
            a = summarize(_select(wmt, method="admin", **{"model.layers": L}), metric)
            p = summarize(_select(wmt, method="pre_ln", **{"model.layers": L}), metric)
            if a is not None and p is not None:
                wins.append(a == p or _better(metric, a, p))
        checks.append((f"Admin at least as good as Pre-LN ({metric}), at every depth both trained",
                       all(wins) if wins else None))
    return _page(o, markdown_table(header, rows), checks, metric)


def _grid_map(cells: Sequence[CellResult], metric: str) -> str:
    lrs = sorted({c.axes["optim.lr"] for c in cells}, key=float)
    b2s = sorted({c.axes["optim.beta2"] for c in cells}, key=float)
    rows = []
    for b in b2s:
        row = [f"beta2={b}"]
        for lr in lrs:
            sel = _select(cells, **{"optim.lr": lr, "optim.beta2": b})
            if sel and all(c.status in DIVERGED_OR_CRASHED for c in sel):
                row.append("failed")
            elif sel and all(c.status == "stalled" for c in sel):
                v = [c.get(metric) for c in sel if c.get(metric) is not None]
                row.append("stalled" + (f" {statistics.fmean(v):.3f}" if v and metric != "bleu" else ""))
            else:
                v = summarize(sel, metric)
                row.append(("-" if not sel else sel[0].status) if v is None else
                           f"{v:.2f}" if metric == "bleu" else f"{v:.3f}")
        rows.append(row)
    return markdown_table(["", *[f"lr={lr}" for lr in lrs]], rows)


def render_grid(o: Outcome) -> str:
    cells = o.cells.get("", [])
    metric = metric_for(o.scale)
    blocks, summary, checks = [], [], []
    pre = _select(cells, method="pre_ln")
    for m, name in METHODS.items():
        sel = _select(cells, method=m)
        if not sel:
            continue
        blocks += [f"### {name}: {metric} (beta2 x lr, \"failed\" = diverged, "
                   "\"stalled\" = ended at the unigram plateau)", "",
                   _grid_map(sel, metric), ""]
        div = sum(c.status in DIVERGED_OR_CRASHED for c in sel)
        stalled = sum(c.status == "stalled" for c in sel)
        conv = [c for c in sel if c.status == "ok"]
        beats = 0
        for c in conv:
            twin = [p for p in _select(pre, **{"optim.lr": c.axes["optim.lr"],
                                               "optim.beta2": c.axes["optim.beta2"]})
                    if p.status == "ok"]
            if m != "pre_ln" and twin and c.get(metric) is not None and \
                    twin[0].get(metric) is not None and _better(metric, c.get(metric), twin[0].get(metric)):
                beats += 1
        summary.append([name, f"{div}/{len(sel)}", f"{stalled}/{len(sel)}", f"{GRID_PAPER_DIVERGED[m]}/15",
                        "-" if m == "pre_ln" else f"{beats} of {len(conv)} converged",
                        GRID_PAPER_NOTE[m]])
    post = _select(cells, method="post_ln")
    checks = [
        ("Post-LN diverges in several cells (2 or more)", _several(post, DIVERGED_OR_CRASHED)),
        # At CPU scale Post-LN's failure is a stall at the unigram plateau rather than a
        # blow-up (docs/reproductions.md), so the paper's pattern is also checked on failures.
        ("Post-LN fails (diverges or stalls) in several cells (2 or more)",
         _several(post, UNTRAINED)),
        ("Pre-LN converges in every cell", _trained(pre)),
        ("Admin converges in every cell", _trained(_select(cells, method="admin"))),
    ]
    table = markdown_table(["method", "diverged (ours)", "stalled (ours)", "diverged (paper)",
                      f"better than Pre-LN, same cell ({metric})", "paper"], summary)
    images = sorted(p.name for p in o.sweep_dir.glob("heatmap*.png"))
    extra = "\n".join(blocks) + ("\n" + "\n".join(f"![{Path(p).stem}]({p})" for p in images) + "\n"
                                 if images else "")
    return _page(o, table + "\n\n" + extra, checks, metric)


def render_tfixup_depth(o: Outcome) -> str:
    cells = o.cells.get("", [])
    metric = metric_for(o.scale)
    rows = []
    for L in _ints(cells, "model.layers"):
        sel = _select(cells, **{"model.layers": L})
        upd = [c.result.get("updates") for c in sel if c.result.get("updates") is not None]
        rows.append([f"{L}L-{L}L", fmt_paper(TFIXUP_DEPTH_PAPER.get(L)) if L in TFIXUP_DEPTH_PAPER
                     else "-", fmt_ours(sel, o.scale), str(upd[0]) if upd else "-"])
    checks = [("T-Fixup trains at every depth", _trained(cells))]
    table = markdown_table(["layers (enc-dec)", "slides BLEU (50k updates)", "ours", "updates"], rows)
    return _page(o, table, checks, metric)


def render_lipschitz(o: Outcome) -> str:
    cells = o.cells.get("", [])
    metric = metric_for(o.scale)
    rows = []
    depths = _ints(cells, "model.layers")
    for L in depths:
        row = [f"{L}L-{L}L"]
        for order, init, _ in LIPSCHITZ_COLUMNS:
            row += [fmt_paper(LIPSCHITZ_PAPER[(order, init)].get(L)) if L in LIPSCHITZ_PAPER[(order, init)]
                    else "-", fmt_ours(_select(cells, reproduce=order, init=init,
                                               **{"model.layers": L}), o.scale)]
        rows.append(row)
    header = ["layers"] + [f"{label} {who}" for _, _, label in LIPSCHITZ_COLUMNS
                           for who in ("(paper)", "(ours)")]
    deep = [L for L in depths if L >= 12]

    def all_ok(order: str, init: str, Ls: Sequence[int]) -> Optional[bool]:
        return _trained([c for L in Ls for c in _select(cells, reproduce=order, init=init,
                                                        **{"model.layers": L})])

    v1_deep = [c for L in deep for c in _select(cells, reproduce="order_v1", init="xavier",
                                                **{"model.layers": L})]
    checks = [("v1 (Post-LN) without Lipschitz init fails at 12+ layers", _failed_all(v1_deep)),
              ("v1 with Lipschitz init trains at every depth", all_ok("order_v1", "lipschitz", depths)),
              ("v2 (Pre-LN) trains at every depth, with and without",
               _all([all_ok("order_v2", "xavier", depths), all_ok("order_v2", "lipschitz", depths)]))]
    return _page(o, markdown_table(header, rows), checks, metric)


def _page(o: Outcome, table: str, checks: Sequence[tuple[str, Optional[bool]]], metric: str) -> str:
    target = TARGETS[o.target]
    all_cells = [c for cells in o.cells.values() for c in cells]
    lines = [f"# {target.title}", "",
             f"Scale: {o.scale}; sweep folder `{o.sweep_dir}`; {_status_line(all_cells)}.", "",
             table, ""]
    if o.scale == "cpu":
        lines += ["Ours at CPU scale: best validation loss (label-smoothed, nats/token; lower is "
                  "better) and greedy BLEU of the last checkpoint on the toy test set. The paper's "
                  "numbers are BLEU at full scale: compare the pattern (which settings fail, which "
                  "method wins), not the values.", ""]
    else:
        lines += ["Ours: BLEU (tokenized, papers' protocol) of the averaged last checkpoints, "
                  "mean ± std over seeds where several; best validation loss beside it.", ""]
    if checks:
        lines += ["Pattern checks (the paper's claim -> reproduced here?):", ""]
        lines += [f"- {text}: {_yes(ok)}" for text, ok in checks] + [""]
    cell_s = sum(float(c.result.get("wall_s") or 0) for c in all_cells)
    lines += [f"Cells' own training time, summed: {format_duration(cell_s)}.", ""]
    return "\n".join(lines)


TARGETS: dict[str, Target] = {
    "table2": Target(
        "table2", "Admin paper, Table 2: Post-LN vs Pre-LN vs Admin by depth",
        {"cpu": (Part("reproduce_table2_cpu", **CPU_EVAL),),
         "real": (Part("reproduce_table2_real"),),
         "gpu": (Part("reproduce_table2_gpu"),),
         "paper": (Part("reproduce_table2_iwslt14", "iwslt14", "DEEPINIT_IWSLT14_DIR", ("de", "en"),
                        IWSLT_HINT, beam=5, lenpen=1.0, average_last=10),
                   Part("reproduce_table2_wmt14", "wmt14", "DEEPINIT_WMT14_DIR", ("en", "de"),
                        WMT_HINT, beam=4, lenpen=0.6, average_last=10))},
        render_table2),
    "grid": Target(
        "grid", "Admin paper, no-warmup grid: beta2 x lr for Post-LN, Pre-LN, Admin",
        {"cpu": (Part("reproduce_grid_cpu", **CPU_EVAL),),
         "real": (Part("reproduce_grid_real"),),
         "paper": (Part("reproduce_grid_paper", "", "DEEPINIT_IWSLT14_DIR", ("de", "en"),
                        IWSLT_HINT, beam=5, lenpen=1.0, average_last=10),)},
        render_grid),
    "tfixup-depth": Target(
        "tfixup-depth", "T-Fixup ultra-deep scan: 64-128-2, no LN, no warmup, 6 to 200 layers",
        {"cpu": (Part("reproduce_tfixup_depth_cpu", **CPU_EVAL),),
         "real": (Part("reproduce_tfixup_depth_real"),),
         "gpu": (Part("reproduce_tfixup_depth_gpu"),),
         "paper": (Part("reproduce_tfixup_depth_paper", "", "DEEPINIT_IWSLT14_DIR", ("de", "en"),
                        IWSLT_HINT, beam=4, lenpen=0.3, average_last=10),)},
        render_tfixup_depth),
    "lipschitz": Target(
        "lipschitz", "Lipschitz paper, Tables 1 and 3: v1/v2 with and without Lipschitz init",
        {"cpu": (Part("reproduce_lipschitz_cpu", **CPU_EVAL),),
         "real": (Part("reproduce_lipschitz_real"),),
         # Lipschitz paper Sec. 2.1: beam 4, the average of the last 5 checkpoints (saved every
         # 1,500 updates); no length penalty (its implementation's default, hfxunlp/transformer
         # cnfg/base.py length_penalty=0.0)
         "paper": (Part("reproduce_lipschitz_paper", "", "DEEPINIT_WMT14_DIR", ("en", "de"),
                        WMT_HINT, beam=4, lenpen=0.0, average_last=5),)},
        render_lipschitz),
    # Real-data tier only: every init scheme the tool offers, at table2's deep no-warmup setting.
    "schemes-postln": Target(
        "schemes-postln", "All schemes, deep, no warmup: Post-LN family and the papers' controls",
        {"real": (Part("reproduce_schemes_postln_real"),)}, None),
    "sgd-control": Target(
        "sgd-control", "T-Fixup Fig. 3c: Post-LN with SGD, deep, no warmup",
        {"real": (Part("reproduce_sgd_control_real"),)}, None),
    "schemes-other": Target(
        "schemes-other", "All schemes, deep, no warmup: ReZero, SkipInit, the alpha ramp, Lipschitz v1 and v2",
        {"real": (Part("reproduce_schemes_other_real"),)}, None),
    "schemes-norms": Target(
        "schemes-norms",
        "Methods since 2019, deep, no warmup: B2T, ResiDual, DyT, ScaleNorm+FixNorm, Mix-LN, Peri-LN, LN Scaling",
        {"real": (Part("reproduce_schemes_norms_real"),)}, None),
    "schemes-scaling": Target(
        "schemes-scaling", "Methods since 2019, deep, no warmup: QK-norm, sigma-reparam, LayerScale, depth-muP",
        {"real": (Part("reproduce_schemes_scaling_real"),)}, None),
    "schemes-norms-warmup": Target(
        "schemes-norms-warmup",
        "Methods since 2019, deep, with warmup: B2T, ResiDual, DyT, ScaleNorm+FixNorm, Mix-LN, Peri-LN, LN Scaling",
        {"real": (Part("reproduce_schemes_norms_warmup_real"),)}, None),
    "schemes-scaling-warmup": Target(
        "schemes-scaling-warmup",
        "Methods since 2019, deep, with warmup: QK-norm, sigma-reparam, LayerScale, depth-muP",
        {"real": (Part("reproduce_schemes_scaling_warmup_real"),)}, None),
    "mup-transfer": Target(
        "mup-transfer", "Depth-muP: does the best learning rate transfer from 6 to 12 layers?",
        {"real": (Part("reproduce_mup_transfer_real"),)}, None),
    "table2-converged": Target(
        "table2-converged", "Admin paper, Table 2 at 12+12, trained until the validation curve is flat",
        {"real": (Part("reproduce_table2_converged_real"),)}, None),
    "width": Target(
        "width", "Post-LN vs Pre-LN without warmup by width: does the stall become a blow-up?",
        {"real": (Part("reproduce_width_real"),)}, None),
}


# ----------------------------------------------------------------------------- the all-schemes table
@dataclass(frozen=True)
class TableSource:
    """The arms of one suite that belong in a section of the all-schemes table."""

    target: str
    select: dict = field(default_factory=dict)  # a claim-style selector on the arms ({}: every arm)
    note: str = ""  # how its rows differ from the common recipe, for the reader


ALL_SCHEMES = "all-schemes"
ALL_SCHEMES_TITLE = "Every scheme at the deep setting: real-data tier"
ALL_SCHEMES_INTRO = (
    "The arms of every suite that trains Table 2's deep real-tier recipe (Multi30k De->En, 64-128-2 "
    "at 12+12 layers, Adam (0.9, 0.98) lr 1e-3, 2,000 updates, seeds 1 to 3, tokenized BLEU with beam 5 "
    "of the last 5 checkpoints averaged), without warmup and with Table 2's 500 warmup updates: each "
    "method in its paper's placement, the rest of the recipe the same (a note says where a row's "
    "differs). Written from the records in results/ by `deepinit reproduce all-schemes` and after each "
    "cell of these suites.")
# The sections and their suites; tests/test_all_schemes.py composes every arm and checks that the
# recipe is the same but for the options the arm's `method=` sets (the SGD control's optimizer among
# them) and, between the sections, the warmup.
ALL_SCHEMES_SECTIONS: dict[str, tuple[TableSource, ...]] = {
    "Without warmup": (
        TableSource("table2", {"warmup.updates": "0"}),
        TableSource("schemes-postln"), TableSource("schemes-other"),
        TableSource("schemes-norms"), TableSource("schemes-scaling"),
        # T-Fixup paper, Fig. 3c: Post-LN trained with SGD instead of Adam, the control that shows
        # the no-warmup failure is Adam's
        TableSource("sgd-control", note="SGD with momentum 0.9 at lr 0.1 instead of Adam (T-Fixup's "
                    "Fig. 3c control)"),
    ),
    "With 500 warmup updates": (
        TableSource("table2", {"warmup.updates": "500"}),
        TableSource("schemes-norms-warmup"), TableSource("schemes-scaling-warmup"),
    ),
}


# every row is compared with Table 2's Pre-LN arm of its section, paired by seed
ALL_SCHEMES_BASELINE = ("table2", {"method": "pre_ln"})


ALL_SCHEMES_SEEDS = (1, 2, 3)  # every suite's seeds (Table 2 trains more for two of its arms)


def all_schemes_cells(source: TableSource) -> list:
    """The cells of `source`'s suite that it puts in the table (seeds 1 to 3), with their records."""
    return [c for c in real_suite(TARGETS[source.target]).cells
            if selector_matches(c.arm, source.select) and c.seed in ALL_SCHEMES_SEEDS]


def all_schemes_sections() -> list[tuple[str, list[suite.TableRows]]]:
    return [(heading, [suite.TableRows(source.target, all_schemes_cells(source), tuple(source.select), source.note)
                       for source in sources])
            for heading, sources in ALL_SCHEMES_SECTIONS.items()]


def write_all_schemes() -> Path:
    """results/all-schemes/real/report.md from the records of the suites it gathers."""
    return suite.write_combined(ALL_SCHEMES, ALL_SCHEMES_TITLE, ALL_SCHEMES_INTRO, all_schemes_sections(),
                                ALL_SCHEMES_BASELINE)


def feeds_all_schemes(target: str) -> bool:
    return any(source.target == target for sources in ALL_SCHEMES_SECTIONS.values() for source in sources)


def refresh_all_schemes() -> None:
    """Rewrite the all-schemes page after a cell of a suite that feeds it; a failure to write it
    is a warning, never a reason to lose the suite's own report."""
    try:
        write_all_schemes()
    except (OSError, ValueError, KeyError) as err:
        print(f"deepinit reproduce: could not rewrite the {ALL_SCHEMES} table ({err}); "
              f"`deepinit reproduce {ALL_SCHEMES}` writes it", file=sys.stderr)


# ----------------------------------------------------------------------------- paper-scale cost
# GPU-hours of SCALE=paper on one H100 (docs/reproductions.md), estimated from model FLOPs until a
# GPU has run the cells: per cell, max_updates x FLOPs per update / (peak x utilization). FLOPs
# per update = runner/bench train_flops per target token (3x the forward, attention included)
# x the tokens of an update, taken as data.max_tokens x update_freq x devices (max_tokens counts
# the longer side with padding, which a GPU computes too). Mean lengths and vocabularies: the
# fairseq-preprocess logs of the two corpora (eos included).
H100_PEAK_TFLOPS = CUDA_BF16_PEAK_TFLOPS["H100 SXM"]  # dense bf16/fp16, NVIDIA datasheet
ASSUMED_UTILIZATION = 0.40  # model FLOPs utilization assumed, not measured


@dataclass(frozen=True)
class CorpusShape:
    src_len: float  # mean tokens per training sentence, source side, eos included
    tgt_len: float
    joined_vocab: int  # data.joined_dictionary=true
    tgt_vocab: int  # separate dictionaries: the target side's


PAPER_CORPORA = {
    # IWSLT'14 De-En, joint 10k BPE: 160,239 pairs, 4,035,591 de and 3,949,114 en tokens; joined
    # dictionary 10,152 types, separate en 6,632
    "DEEPINIT_IWSLT14_DIR": CorpusShape(4_035_591 / 160_239, 3_949_114 / 160_239, 10_152, 6_632),
    # WMT'14 En-De, joint 32k BPE: 4,500,966 pairs, 132,886,171 en and 137,628,246 de tokens;
    # dictionary 32,768 types
    "DEEPINIT_WMT14_DIR": CorpusShape(132_886_171 / 4_500_966, 137_628_246 / 4_500_966,
                                      32_768, 32_768),
}
# Seconds per update on one H100, measured (a finished cell's result.json: wall_s / updates), by
# (preset, model.layers); a measured cell replaces the FLOPs estimate. None measured yet.
H100_SECONDS_PER_UPDATE: dict[tuple[str, int], float] = {}


def update_flops(cfg: Config, corpus: CorpusShape) -> float:
    """Model FLOPs of one training update of this config on a corpus of this shape."""
    m, t = cfg.model, cfg.trainer
    vocab = corpus.joined_vocab if cfg.data.joined_dictionary else corpus.tgt_vocab
    per_target_token = float(train_flops(m.dim, m.ffn_dim, m.num_encoder_layers,
                                         m.num_decoder_layers, vocab, np.array([corpus.src_len]),
                                         np.array([corpus.tgt_len]))) / corpus.tgt_len
    return per_target_token * cfg.data.max_tokens * t.update_freq * t.devices


@dataclass
class PaperCost:
    target: str
    cells: int
    updates: int  # summed over the cells
    flops: float  # model FLOPs, summed over the cells
    gpu_hours: float
    measured_cells: int  # cells costed from H100_SECONDS_PER_UPDATE rather than FLOPs
    parts: dict[str, tuple[int, float]]  # preset -> (cells, GPU-hours)


def paper_gpu_hours(target: str, compose: Callable[[list[str]], Config],
                    utilization: float = ASSUMED_UTILIZATION,
                    peak_tflops: float = H100_PEAK_TFLOPS) -> PaperCost:
    """One H100's GPU-hours for every cell of a target's paper-scale presets (training only, not
    scoring). `compose` turns overrides into a Config (runner/cli/compose.py)."""
    cost = PaperCost(target, 0, 0, 0.0, 0.0, 0, {})
    for part in TARGETS[target].parts.get("paper", ()):
        hours = 0.0
        cells, _ = plan_cells(part.preset)
        for cell in cells:
            cfg = compose([f"+sweep={part.preset}", *(f"{k}={v}" for k, v in cell.items())])
            updates = cfg.trainer.max_updates
            flops = updates * update_flops(cfg, PAPER_CORPORA[part.data_env])
            measured = H100_SECONDS_PER_UPDATE.get((part.preset, cfg.model.layers))
            seconds = (updates * measured if measured is not None
                       else flops / (peak_tflops * 1e12 * utilization))
            cost.measured_cells += measured is not None
            cost.cells += 1
            cost.updates += updates
            cost.flops += flops
            hours += seconds / 3600
        cost.parts[part.preset] = (len(cells), hours)
        cost.gpu_hours += hours
    return cost


# ----------------------------------------------------------------------------- running
def sweep_dir_for(out: Path, target: str, scale: str) -> Path:
    return out / f"{target}-{scale}"


def part_dir(sweep_dir: Path, part: Part) -> Path:
    return sweep_dir / part.sub if part.sub else sweep_dir


def gpu_visible() -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:  # a broken CUDA install counts as none
        return False


def paper_problems(target: Target, launcher: str) -> list[str]:
    """Why SCALE=paper cannot run here (prepared data, GPUs); empty when it can."""
    problems = []
    for part in target.parts["paper"]:
        if not part.data_env:
            continue
        d = os.environ.get(part.data_env)
        if not d:
            problems.append(f"{part.preset}: {part.data_env} is not set; it must name {part.data_hint}")
            continue
        missing = [f"train.{lang}" for lang in part.data_langs
                   if not any((Path(d) / f"train.{lang}{ext}").is_file() for ext in ("", ".gz"))]
        if missing:
            problems.append(f"{part.preset}: {part.data_env}={d} has no {', '.join(missing)}; "
                            f"it must hold {part.data_hint}")
    if launcher != "slurm" and not gpu_visible():
        problems.append("no GPU is visible here: SCALE=paper trains base/small models for 50k-500k "
                        "updates; run it on a GPU machine, or with LAUNCHER=slurm from a cluster's "
                        "login node (or use SCALE=cpu)")
    return problems


def launcher_overrides(launcher: str, scale: str, parallel: int) -> list[str]:
    if launcher == "basic":  # one cell at a time: give it every core
        return [f"trainer.threads={parallel}"] if scale == "cpu" else []
    if launcher == "local":
        return ["hydra/launcher=local"] + ([f"hydra.launcher.cpu_parallelism={parallel}"]
                                           if scale == "cpu" else [])
    return ["hydra/launcher=slurm"]


def deepinit_command(part: Part, pdir: Path, extra: Sequence[str], launch: Sequence[str]) -> list[str]:
    exe = Path(sys.executable).parent / "deepinit"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "runner.cli"]
    return [*base, "-m", f"+sweep={part.preset}", *extra, f"hydra.sweep.dir={pdir}", *launch]


def score_cells(cells: Sequence[CellResult], part: Part, device: str, echo=print) -> None:
    """BLEU for finished ok cells that have none yet (evaluate_run adds it to result.json)."""
    for c in cells:
        if c.status != "ok" or c.path is None or (c.result.get("eval") or {}).get("test"):
            continue
        try:
            rec = evaluate_run(c.path, split="test", beam=part.beam, lenpen=part.lenpen,
                               average_last=part.average_last, device=device, echo=echo)
            c.result["bleu"] = rec["bleu"]
            label = " ".join(f"{k}={v}" for k, v in c.axes.items())
            echo(f"  scored {label}: BLEU {rec['bleu']:.2f} ({rec['sentences']} sentences, "
                 f"{rec['decode_seconds']:.0f} s)")
        except Exception as exc:  # a table without one BLEU beats no table
            echo(f"  could not score {c.path}: {type(exc).__name__}: {exc}")


def write_outputs(outcome: Outcome, metric: str, echo=print) -> Path:
    """reproduction.md (and the sweep report's heatmaps for grids) in the sweep folder."""
    sweep_dir = outcome.sweep_dir
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if outcome.target == "grid":
        try:
            sweep = load_sweep(sweep_dir)
            if any(c.status in ENDED for c in sweep.cells):
                plot_heatmaps(sweep, metric, sweep_dir)
        except Exception as exc:  # plots are extra; the table is the result
            echo(f"note: heatmaps not drawn ({type(exc).__name__}: {exc})")
    text = TARGETS[outcome.target].render(outcome)
    path = sweep_dir / "reproduction.md"
    path.write_text(text)
    return path


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


def real_suite(target: Target, overrides: Sequence[str] = (), tier: str = "real",
               records_dir: Optional[Path] = None) -> RealSuite:
    """The suite's cells (with `overrides`) and the records they have in `records_dir`
    (default: results/<target>/<tier>/)."""
    part = target.parts[tier][0]
    cells = suite.plan(part.preset, list(overrides))
    records = Records.load(records_dir or suite.results_dir(target.name, tier))
    suite.attach_records(cells, records)
    key = "gpu_minutes_per_cell" if tier == "gpu" else "cpu_minutes_per_cell"
    minutes = float((load_preset(part.preset).get("sweep") or {}).get(key) or 0)
    return RealSuite(target, part, cells, records, minutes, tier)


def run_real(target: Target, args, tier: str = "real", compose: Optional[Callable[[list[str]], Config]] = None) -> int:
    """SCALE=real or gpu: the target's Multi30k suite, cell by cell on this machine, with records
    in results/<target>/<tier>/ (runner/tables/suite.py)."""
    gpu = tier == "gpu"
    # A plan or a report trains nothing: both work on a login node without a GPU.
    trains = not (args.dry_run or args.table_only)
    if (gpu and trains and not gpu_visible()
            and not any(norm_key(o).startswith("trainer.device=") for o in args.overrides)):
        print(f"deepinit reproduce: --scale gpu trains on CUDA, and no GPU is visible here "
              f"(torch {torch.__version__}); use --scale real on a CPU", file=sys.stderr)
        return 2
    parallel = args.parallel or (1 if gpu else os.cpu_count() or 1)
    work = sweep_dir_for(args.out.resolve(), target.name, tier)
    # Overrides that only pick among the preset's own cells (part of the suite) keep the suite's
    # records and report in results/, and the report stays the whole suite's. Overrides that make
    # other cells (another lr, other data) are a variant: its records and report go beside its
    # run folders, so results/ only ever holds the preset's own cells.
    whole = real_suite(target, (), tier)
    own = {cell_key(c.key) for c in whole.cells}
    variant = not all(cell_key(c.key) in own for c in suite.plan(whole.part.preset, list(args.overrides)))
    real = real_suite(target, args.overrides, tier, records_dir=work if variant else None)
    part, cells, records, todo, minutes = real.part, real.cells, real.records, real.todo, real.minutes
    shown = cells if variant else whole.cells
    print(f"reproduce-{target.name} (real data{', GPU' if gpu else ''}): {target.title}")
    where = (f"{work} (overrides that change the preset's cells: a variant, kept out of results/)"
             if variant else suite.results_dir(target.name, tier))
    print(f"preset sweeps/{part.preset}.yaml: {len(cells)} cells, {len(cells) - len(todo)} with a "
          f"record in {where}; run folders in {work}")
    for c in cells:
        print(f"  {c.label}   [{c.record['status'] if c.record else 'to train'}]")
    if minutes:
        wall = estimate_wall_s([minutes * 60] * len(todo), parallel)
        where = "of one GPU to itself" if gpu else "on one core of an idle 2-core machine"
        print(f"estimated wall time: ~{format_duration(wall)} for {cell_count(len(todo))}, {parallel} at a time "
              f"(~{minutes:.0f} min per cell {where})")
    if args.dry_run:
        return 0

    def report(_group: str = "") -> Path:
        suite.attach_records(shown, records)
        path = suite.write_report(target.name, target.title, part.preset, shown, tier,
                                  out=work if variant else None)
        if tier == "real" and not variant and feeds_all_schemes(target.name):
            refresh_all_schemes()
        return path

    # the report follows the records cell by cell, so an interrupted suite leaves both in step
    crashed = 0 if args.table_only else suite.run_cells(cells, work, records, parallel, report, compose=compose)
    path = report()
    print()
    print(path.read_text())
    print(f"wrote {path} and {records.path}")
    if crashed:
        print(f"{crashed} cell(s) failed: their train.log files in {work} say why", file=sys.stderr)
    return 1 if crashed else 0


# `deepinit reproduce all --scale real`: every real-tier suite through one pool of cells, in this
# order: Table 2 first, then the T-Fixup depth scan and the tables of the methods since 2019
# without warmup, then the other papers' tables, the grid, the with-warmup and transfer rows,
# and last the width scan and Table 2 trained flat (the longest cells).
REAL_SUITE_ORDER = ("table2", "tfixup-depth", "schemes-norms", "schemes-scaling", "lipschitz",
                    "schemes-postln", "sgd-control", "schemes-other", "grid", "schemes-norms-warmup",
                    "schemes-scaling-warmup", "mup-transfer", "width", "table2-converged")


def run_all_real(args, compose: Optional[Callable[[list[str]], Config]] = None) -> int:
    """Every real-tier suite's cells without a record (or those of `--suites`, in that order),
    `--parallel` at a time in one pool (a core freed at the end of one suite starts the next
    suite's first cell); a suite's report is rewritten after each of its cells, so the records
    and the report stay in step when the pool is stopped."""
    if args.overrides:
        print("deepinit reproduce all: overrides change one target's cells; run that target by itself",
              file=sys.stderr)
        return 2
    parallel = args.parallel or os.cpu_count() or 1
    names = list(dict.fromkeys(getattr(args, "suites", None) or REAL_SUITE_ORDER))  # once each, in order
    jobs, costs, plans = [], [], {}
    print(f"reproduce all (real data): {len(names)} suites, records in {results_root()}")
    for name in names:
        real = plans[name] = real_suite(TARGETS[name])
        todo, work = real.todo, sweep_dir_for(args.out.resolve(), name, "real")
        jobs += [suite.Job(cell, work, real.records, name) for cell in todo]
        costs += [real.minutes * 60] * len(todo)
        print(f"  {name:24s} {len(real.cells) - len(todo):3d} of {len(real.cells):3d} cells have a record; "
              f"{len(todo)} to train (~{real.minutes:.0f} min each)")
    print(f"estimated wall time: ~{format_duration(sum(costs) / parallel)} for {cell_count(len(jobs))}, "
          f"{parallel} at a time on an idle machine (each preset's cpu_minutes_per_cell)")
    if args.dry_run:
        return 0

    def report(name: str, with_all_schemes: bool = True) -> Path:
        real = plans[name]
        path = suite.write_report(name, real.target.title, real.part.preset, real.cells)
        if with_all_schemes and feeds_all_schemes(name):
            refresh_all_schemes()
        return path

    crashed = 0 if args.table_only else suite.run_jobs(jobs, parallel, report, compose=compose)
    for name in plans:  # every report, finished or not, from the records as they are now
        print(f"{name}: report written to {report(name, with_all_schemes=False)}")
    if any(feeds_all_schemes(name) for name in plans):
        refresh_all_schemes()
    if crashed:
        print(f"{crashed} cell(s) failed: their .out files under {args.out.resolve()} say why", file=sys.stderr)
    return 1 if crashed else 0


def real_tier_status(parallel: int) -> list[dict]:
    """Per target with a real tier (and, as "<target> (gpu)", per gpu tier): planned cells,
    records by status, verdicts by kind, and the estimated wall time of the cells without a
    record (`parallel` at a time on CPU, one at a time on a GPU; each preset's minutes per
    cell)."""
    rows = []
    tiers = [(t, tier) for tier in SUITE_TIERS for t in TARGETS.values() if tier in t.parts]
    for target, tier in tiers:
        real = real_suite(target, tier=tier)
        cells, minutes = real.cells, real.minutes
        done = [c.record for c in cells if c.record is not None]
        decoded = suite.suite_decodes(cells)
        todo = len(cells) - len(done)
        verdict_counts: dict[str, int] = {}
        for verdict in suite.verdicts(real.part.preset, cells):
            verdict_counts[verdict.verdict] = verdict_counts.get(verdict.verdict, 0) + 1
        rows.append({"target": target.name + (" (gpu)" if tier == "gpu" else ""), "tier": tier,
                     "cells": len(cells), "records": len(done),
                     # the rule book's outcomes ("ok": trained)
                     **{status: sum(suite.cell_outcome(r, decoded) == status for r in done)
                        for status in (OK, *NOT_TRAINED)},
                     "verdicts": verdict_counts,
                     "remaining_s": estimate_wall_s([minutes * 60] * todo, 1 if tier == "gpu" else parallel)
                     if minutes else None})
    return rows


def print_status(parallel: int) -> int:
    """`deepinit reproduce status`: how far every real-tier suite has got, from results/ alone."""
    from rich import box  # noqa: PLC0415 (only this view draws a table)
    from rich.table import Table  # noqa: PLC0415 (see above)

    from runner.console import console  # noqa: PLC0415 (see above)

    rows = real_tier_status(parallel)
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
        table.add_row(r["target"], f"{r['records']}/{r['cells']}", failed or "0", verdicts, remaining)
    total_left = sum(r["remaining_s"] or 0 for r in rows if r["tier"] == "real")
    gpu_left = sum(r["remaining_s"] or 0 for r in rows if r["tier"] == "gpu")
    console.print(table)
    console.print(f"cells: with a record / planned (a crashed cell gets no record and runs again); "
                  f"not trained: the cells that did not train, by the rule book (d diverged, c collapsed, "
                  f"s stalled, b below the BLEU bar); claims: verdicts so far; left: "
                  f"estimated wall time of the cells without a record, {parallel} at a time on an idle "
                  f"machine (each preset's cpu_minutes_per_cell); in all ~{format_duration(total_left)} of "
                  f"CPU suites, plus ~{format_duration(gpu_left)} of (gpu) suites, one cell at a time on one "
                  "GPU (estimated). `deepinit reproduce TARGET --scale real|gpu` runs a suite's missing "
                  "cells.")
    return 0


def run(args, compose: Optional[Callable[[list[str]], Config]] = None) -> int:
    """`deepinit reproduce` with parsed arguments and the CLI's composition, which the real and gpu
    tiers' cells are composed with (runner/cli/reproduce.py); the exit code."""
    if args.target == "list":
        width = max(len(name) for name in (*TARGETS, ALL_SCHEMES))
        for t in TARGETS.values():
            print(f"{t.name:{width}s}  {t.title} (scales: {', '.join(t.parts)})")
        print(f"{ALL_SCHEMES:{width}s}  {ALL_SCHEMES_TITLE.split(':')[0]}: one table from the real-tier "
              "suites' records (trains nothing)")
        return 0
    if args.target == "status":
        return print_status(args.parallel or os.cpu_count() or 1)
    if getattr(args, "suites", None) and args.target != "all":
        print(f"deepinit reproduce {args.target}: --suites chooses the suites of 'all'; leave it out or "
              "run 'deepinit reproduce all --suites ...'", file=sys.stderr)
        return 2
    if args.target == ALL_SCHEMES:
        if args.scale not in (None, "real") or args.overrides:
            print(f"deepinit reproduce {ALL_SCHEMES}: a table of the real-tier suites' records; it "
                  "takes no --scale but real and no overrides", file=sys.stderr)
            return 2
        if args.dry_run:  # the page as it would be written; nothing is written
            print(suite.render_combined(ALL_SCHEMES_TITLE, ALL_SCHEMES_INTRO, all_schemes_sections(),
                                        ALL_SCHEMES_BASELINE))
            return 0
        path = write_all_schemes()
        print(path.read_text())
        print(f"wrote {path}; `deepinit reproduce all --scale real` trains the cells that have no record")
        return 0
    if args.target == "all":
        if args.scale not in (None, "real"):
            print("deepinit reproduce all: only --scale real (every real-tier suite)", file=sys.stderr)
            return 2
        return run_all_real(args, compose)
    t0 = time.perf_counter()
    target = TARGETS[args.target]
    scale = args.scale or next(s for s in (("paper", "cpu", "real") if gpu_visible() else
                                           ("cpu", "paper", "real")) if s in target.parts)
    if scale not in target.parts:
        print(f"deepinit reproduce: {target.name} has no {scale} tier yet; it has "
              f"{', '.join(target.parts)}", file=sys.stderr)
        return 2
    if scale in SUITE_TIERS:
        return run_real(target, args, scale, compose)
    launcher = args.launcher or "local"
    parallel = args.parallel or os.cpu_count() or 1
    sweep_dir = sweep_dir_for(args.out.resolve(), target.name, scale)
    extra = list(args.overrides)
    launch = launcher_overrides(launcher, scale, parallel)

    print(f"reproduce-{target.name}: {target.title}")
    print(f"scale {scale}, launcher {launcher}, sweep folder {sweep_dir}")
    problems = paper_problems(target, launcher) if scale == "paper" else []
    outcome = Outcome(target.name, scale, {}, sweep_dir)
    costs = []
    for part in target.parts[scale]:
        pdir = part_dir(sweep_dir, part)
        cells = collect(part, pdir, extra)
        outcome.cells[part.sub] = cells
        _, fixed = plan_cells(part.preset, extra)
        todo = [c for c in cells if c.status not in FINISHED]
        print(f"\n[{part.preset}] {len(cells)} cells, {len(cells) - len(todo)} finished "
              f"(sweeps/{part.preset}.yaml{'; ' + ' '.join(fixed) if fixed else ''})")
        for c in cells:
            line = "  " + " ".join(f"{k}={v}" for k, v in c.axes.items())
            if scale == "cpu":
                est = estimate_cell_s(part.preset, c.axes, fixed)
                costs.append(0.0 if c.status in FINISHED else est)
                line += f"   ~{format_duration(est)}"
            print(line + f"   [{c.status}]")
        cmd = deepinit_command(part, pdir, extra, launch)
        print("  command: " + " ".join(cmd))
    if scale == "cpu":
        slots = parallel if launcher == "local" else 1
        print(f"\nestimated wall time of the unfinished cells: "
              f"~{format_duration(estimate_wall_s(costs, slots))} on {slots} core(s) of an idle machine "
              f"({SEC_PER_LAYER_UPDATE} s per layer-update of {TOY_MAX_TOKENS} tokens, "
              f"{CELL_OVERHEAD_S:.0f} s per cell), "
              "plus greedy scoring")
    if problems:
        print("\nSCALE=paper cannot run here:", file=sys.stderr)
        for prob in problems:
            print(f"  - {prob}", file=sys.stderr)
        if not args.dry_run:
            return 2
    if args.dry_run:
        return 0

    rc = 0
    env = dict(os.environ)
    if scale == "cpu":  # local: one thread per cell, cells side by side on the cores
        threads = str(parallel if launcher == "basic" else 1)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    for part in target.parts[scale]:
        pdir = part_dir(sweep_dir, part)
        cells = outcome.cells[part.sub]
        if not args.table_only and any(c.status not in FINISHED for c in cells):
            pdir.mkdir(parents=True, exist_ok=True)
            cmd = deepinit_command(part, pdir, extra, launch)
            print(f"\nrunning {sum(c.status not in FINISHED for c in cells)} unfinished cells of "
                  f"{part.preset} ...", flush=True)
            proc = subprocess.Popen(cmd, env=env, cwd=os.getcwd())
            try:
                wait_interruptibly(proc)
            except BaseException as exc:  # stop the sweep's launcher, which stops its cells
                # A Ctrl-C in the terminal reached the launcher too, and it is already stopping
                # them (within its stop_grace_s of 10 s); a SIGTERM (`kill PID`) reached only
                # this process, so the launcher is told at once.
                ctrl_c = isinstance(exc, KeyboardInterrupt) and signal_of(exc) == signal.SIGINT
                suite.stop_cells([proc], settle_s=15.0 if ctrl_c else 0.0)
                raise
            if proc.returncode:
                print(f"deepinit -m exited with {proc.returncode} (cells' train.log files say why)",
                      file=sys.stderr)
                rc = proc.returncode
            cells = collect(part, pdir, extra)
            outcome.cells[part.sub] = cells
        if not args.no_eval and not args.table_only:
            score_cells(cells, part, "cpu" if scale == "cpu" else "auto")
            outcome.cells[part.sub] = collect(part, pdir, extra)
    path = write_outputs(outcome, metric_for(scale))
    print()
    print(path.read_text())
    print(f"wrote {path}")
    print(f"total wall time of this call: {format_duration(time.perf_counter() - t0)}")
    return rc

