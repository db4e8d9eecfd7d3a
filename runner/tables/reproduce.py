"""One command per published table: `make reproduce-<target>` (`deepinit reproduce`).

    deepinit reproduce TARGET [--scale cpu|real|gpu|paper] [--launcher basic|local|slurm]
                              [--dry-run] [--no-eval] [--out DIR] [overrides ...]

TARGET is table2 | grid | tfixup-depth | lipschitz | ... (`list` prints them; runner/tables/targets.py).
SCALE=real (CPU) and SCALE=gpu run the target's Multi30k suite cell by cell with records in
results/ (runner/tables/real_tier.py); the other scales are one or more sweep presets
(`sweeps/reproduce_<target>_<scale|dataset>.yaml`) run through `deepinit -m` into
`outputs/reproduce/<target>-<scale>/` (runner/tables/sweep_tier.py), whose table is printed in the
paper's layout with the paper's numbers beside ours (runner/tables/render.py). `all` trains every
real-tier suite's missing cells in one pool; `all-schemes` writes one table from their records
(runner/tables/all_schemes.py); `status` says how far each real-tier suite has got.

Extra overrides apply to every cell; one that names a swept axis replaces its values (e.g.
`model.layers=6,20,50` caps the depth scan).

The modules of runner/tables import one way (an import-linter contract, pyproject.toml): this one
on top, then the tiers (real_tier, sweep_tier), the tables they write (all_schemes, cost, render),
planning (plan), a suite's pool of cells and the combined table (pool, combined), a suite's report
(report) and plots (plots), its cells and verdicts (suite), and at the bottom the evidence, the
records and the targets (evidence, records, targets) and the rule book (rulebook).
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional

from runner.config import Config
from runner.run.hardware import gpu_visible, usable_cores
from runner.tables.all_schemes import (
    ALL_SCHEMES,
    ALL_SCHEMES_BASELINE,
    ALL_SCHEMES_INTRO,
    ALL_SCHEMES_TITLE,
    LM_ALL_SCHEMES,
    all_schemes_sections,
    render_lm_all_schemes,
    write_all_schemes,
)
from runner.tables.combined import render_combined
from runner.tables.plan import Request
from runner.tables.real_tier import print_status, run_all_real, run_real
from runner.tables.suite import results_dir
from runner.tables.sweep_tier import run_sweeps
from runner.tables.targets import SUITE_TIERS, TARGETS


def run(request: Request, compose: Optional[Callable[[list[str]], Config]] = None) -> int:
    """`deepinit reproduce` as `request` asks, with the CLI's composition, which the real and gpu
    tiers' cells are composed with (runner/cli/reproduce.py builds both); the exit code."""
    if request.target == "list":
        width = max(len(name) for name in (*TARGETS, ALL_SCHEMES))
        for t in TARGETS.values():
            print(f"{t.name:{width}s}  {t.title} (scales: {', '.join(t.parts)})")
        print(f"{ALL_SCHEMES:{width}s}  {ALL_SCHEMES_TITLE.split(':')[0]}: one table from the real-tier "
              "suites' records (trains nothing)")
        return 0
    if request.target == "status":
        return print_status(request.parallel or usable_cores(), request.out, compose)
    if request.suites and request.target != "all":
        print(f"deepinit reproduce {request.target}: --suites chooses the suites of 'all'; leave it out or "
              "run 'deepinit reproduce all --suites ...'", file=sys.stderr)
        return 2
    if request.target == ALL_SCHEMES:
        if request.scale not in (None, "real") or request.overrides:
            print(f"deepinit reproduce {ALL_SCHEMES}: a table of the real-tier suites' records; it "
                  "takes no --scale but real and no overrides", file=sys.stderr)
            return 2
        if request.dry_run:  # the pages as they would be written; nothing is written
            print(render_combined(ALL_SCHEMES_TITLE, ALL_SCHEMES_INTRO, all_schemes_sections(),
                                  ALL_SCHEMES_BASELINE))
            print(render_lm_all_schemes())
            return 0
        path = write_all_schemes()
        lm_path = results_dir(LM_ALL_SCHEMES) / "report.md"
        print(path.read_text())
        print(f"wrote {path} and, for the language-model task beside it, {lm_path}; `deepinit "
              "reproduce all --scale real` trains the cells that have no record")
        return 0
    if request.target == "all":
        if request.scale not in (None, "real"):
            print("deepinit reproduce all: only --scale real (every real-tier suite)", file=sys.stderr)
            return 2
        if request.probe or request.bundle is not None or request.start_unfinished:
            print("deepinit reproduce all: --parallel auto, --bundle and --start-unfinished work on one "
                  "target's suite; give all a number of cells at once", file=sys.stderr)
            return 2
        return run_all_real(request, compose)
    t0 = time.perf_counter()
    target = TARGETS[request.target]
    scale = request.scale or next(s for s in (("paper", "cpu", "real") if gpu_visible() else
                                              ("cpu", "paper", "real")) if s in target.parts)
    if scale not in target.parts:
        print(f"deepinit reproduce: {target.name} has no {scale} tier yet; it has "
              f"{', '.join(target.parts)}", file=sys.stderr)
        return 2
    if scale in SUITE_TIERS:
        return run_real(target, request, scale, compose)
    if request.probe or request.deadline_s is not None or request.bundle is not None or request.start_unfinished:
        print(f"deepinit reproduce: --parallel auto, --deadline and --bundle are for the real and gpu "
              f"tiers; {target.name} at --scale {scale} takes --parallel N", file=sys.stderr)
        return 2
    return run_sweeps(target, scale, request, started=t0)
