"""`deepinit reproduce TARGET`: a published table (what `make reproduce-TARGET` runs;
runner/tables/reproduce.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from runner.cli.compose import compose_run
from runner.cli.train import method_groups_replaced
from runner.config import Config, ConfigError
from runner.console import log
from runner.run import attempt
from runner.tables import last_checkpoint, reproduce
from runner.tables.all_schemes import ALL_SCHEMES
from runner.tables.plan import Request, sweep_dir_for
from runner.tables.targets import LAUNCHERS, REAL_SUITE_ORDER, SCALES, TARGETS


def compose_cell(overrides: list[str]) -> Config:
    """A suite cell's config, composed as `deepinit train` composes it (the cell then runs as
    `python -m runner.run`); a method whose groups a preset or override replaced is named, as
    `deepinit train` names it."""
    cfg, choices, _ = compose_run(overrides)
    line = method_groups_replaced(choices)
    if line:
        log.warning("%s: %s", " ".join(overrides), line)
    return cfg


def last_checkpoint_bleu(args) -> int:
    """`deepinit reproduce TARGET --last-checkpoint-bleu [RUN_FOLDERS]` (runner/tables/last_checkpoint.py)."""
    target = TARGETS.get(args.target)
    if target is None or "real" not in target.parts or args.scale not in (None, "real") or args.overrides:
        sys.stderr.write("deepinit reproduce: --last-checkpoint-bleu measures a target's real-tier cells: "
                         "deepinit reproduce TARGET --last-checkpoint-bleu [RUN_FOLDERS], TARGET one with a "
                         "real tier, no --scale but real, no overrides\n")
        return 2
    suite_dir = (sweep_dir_for(args.out.resolve(), target.name, "real")
                 if args.last_checkpoint_bleu is True else args.last_checkpoint_bleu)
    if not suite_dir.is_dir():
        sys.stderr.write(f"deepinit reproduce: {suite_dir}: no such folder of run folders\n")
        return 2
    last_checkpoint.measure(target.name, suite_dir)
    return 0


AUTO = -1  # --parallel auto


def _parallel(text: str) -> int:
    """--parallel's value: a positive count, or auto (AUTO)."""
    if text == "auto":
        return AUTO
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of cells or auto, not {text!r}")
    return value


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="deepinit reproduce",
                                description="Reproduce a published table (docs/reproductions.md).")
    p.add_argument("target", choices=[*TARGETS, "all", ALL_SCHEMES, "list", "status"],
                   help="a target; all: every real-tier suite in one pool of cells (--scale real); "
                        f"{ALL_SCHEMES}: one table of every scheme at the deep setting, from "
                        "the real-tier suites' records (trains nothing); list: the targets; status: how "
                        "far each real-tier suite has got (records, verdicts, estimated time left)")
    p.add_argument("overrides", nargs="*", help="extra overrides for every cell; an override of a "
                   "swept axis replaces its values (e.g. model.layers=6,20,50); at the real and gpu "
                   "tiers, overrides that change the preset's cells (a variant) keep their records "
                   "beside the run folders, not in results/")
    p.add_argument("--scale", choices=SCALES,
                   help="cpu: the toy smoke tier (minutes); real: Multi30k on this CPU with "
                   "seeds, CIs and verdicts, records in results/ (hours); gpu: the same on one GPU at "
                   "the papers' model size (table2, tfixup-depth, width); paper: the papers' recipes "
                   "(GPU). Default: paper when a GPU is visible, else cpu; real for targets that "
                   "have only a real tier")
    p.add_argument("--launcher", choices=LAUNCHERS,
                   help="default: local (cells in parallel: one per GPU, or --parallel on CPU); the "
                        "real tier runs its cells itself and ignores it")
    p.add_argument("--parallel", type=_parallel, default=0, metavar="N|auto",
                   help="cells at once: at CPU scale with the local launcher, at the real tier, and "
                        "for status's estimate of the time left (default: CPU count; at the real "
                        "and gpu tiers each CPU cell gets CPU count / N threads, every core for "
                        "--parallel 1); at the gpu tier, cells sharing the GPU (default 1). auto "
                        "(real and gpu tiers): a short probe trains the cell with the fewest layers 30 "
                        "updates (200 on a GPU) alone and 2, 4, 8, 16 at once (up to the CPU count) and "
                        "takes the number with the most cells per hour (with --deadline: the most cells "
                        "finished by then; no probe where the records say no cell would fit after it)")
    p.add_argument("--out", type=Path, default=Path("outputs/reproduce"),
                   help="parent of the sweep folder <target>-<scale> (default outputs/reproduce); with "
                        "status, where it finds the cells started and not finished")
    p.add_argument("--suites", nargs="+", metavar="SUITE", choices=REAL_SUITE_ORDER,
                   help="with 'all': only these real-tier suites, in this order (default: every one, "
                        f"in the order {', '.join(REAL_SUITE_ORDER)})")
    p.add_argument("--dry-run", action="store_true", help="print the cells and commands, run nothing")
    p.add_argument("--no-eval", action="store_true", help="do not decode/score finished cells")
    p.add_argument("--last-checkpoint-bleu", nargs="?", const=True, default=None, type=Path,
                   metavar="RUN_FOLDERS",
                   help="measure the BLEU of each real-tier cell's last checkpoint beside the average "
                        "its record scores, on the suite's run folders (default <out>/TARGET-real), "
                        "into results/TARGET/real/last-checkpoint-bleu.jsonl and .md (trains nothing)")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="real and gpu tiers: be done this many seconds from now: start a cell only "
                        "when it is expected to finish in time (the records of its arm, model shape or width, else "
                        "the suite's median record scaled by layers, else the preset's minutes per cell), "
                        "and stop the cells still running "
                        "at the deadline (interrupted: the same command resumes them)")
    p.add_argument("--start-unfinished", action="store_true",
                   help="one target's real or gpu tier, with --deadline, on a machine that keeps its run "
                        "folders between calls: once no cell left can finish in time, the cheapest cells "
                        "left take the free slots anyway; they stop at the deadline with a checkpoint, and "
                        "the next call resumes them, expecting only their updates left")
    p.add_argument("--bundle", type=Path, default=None, metavar="FILE.tgz",
                   help="real and gpu tiers: afterwards, pack the suite's records, report and plots, "
                        "each cell's log and a summary (cells trained, not started, stopped) into one "
                        "file, for a machine that hands back only a few files")
    p.add_argument("--table-only", action="store_true",
                   help="only (re)print the table: from the run folders, or at the real tier from the "
                        "records in results/ (trains nothing)")
    args = p.parse_intermixed_args(argv)
    if args.last_checkpoint_bleu is not None:
        return last_checkpoint_bleu(args)
    request = Request(target=args.target, overrides=tuple(args.overrides), scale=args.scale,
                      launcher=args.launcher, parallel=max(0, args.parallel), probe=args.parallel == AUTO,
                      out=args.out,
                      suites=tuple(args.suites or ()), dry_run=args.dry_run, no_eval=args.no_eval,
                      table_only=args.table_only, deadline_s=args.deadline,
                      start_unfinished=args.start_unfinished, bundle=args.bundle)
    if args.deadline is not None and not args.deadline > 0:
        sys.stderr.write(f"deepinit reproduce: --deadline {args.deadline:g}: expected a positive number "
                         "of seconds\n")
        return 2
    if args.start_unfinished and args.deadline is None:
        sys.stderr.write("deepinit reproduce: --start-unfinished: expected with --deadline SECONDS (without "
                         "one every cell starts anyway)\n")
        return 2
    with attempt.sigterm_raises():  # `kill PID` stops the running cells like Ctrl-C does
        try:
            return reproduce.run(request, compose_cell)
        except ConfigError as err:  # an override the cells cannot be composed with, or a preset
            # that disagrees with the rule book
            sys.stderr.write(f"deepinit: error: {err}\n")
            return 2
        except KeyboardInterrupt as exc:
            signum = attempt.signal_of(exc)
            sys.stderr.write(f"deepinit: interrupted ({attempt.signal_name(signum)}); the running cells "
                             "are marked interrupted and the same command resumes them\n")
            return 128 + signum
