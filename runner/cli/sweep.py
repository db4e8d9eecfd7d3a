"""`deepinit sweep status SWEEP_DIR`: where every cell of a sweep stands, at any time.

Reads the cells' run folders (result.json, interrupted.json, error.txt), the cells multirun.yaml
expects, and the launchers' job log (SWEEP_DIR/.submitit/jobs.jsonl) with the jobs' states from
squeue/sacct, so it follows a SLURM sweep submitted with `hydra.launcher.wait=false`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

from runner.sweep.status import counts, render, sweep_states

STATUS_HELP = """statuses: ok, stalled, diverged (finished; a rerun skips them), failed (a crash or a
rejected config: the cell's error.txt says why), interrupted (stopped before it finished),
queued, running (a job is waiting or working on it), pending (not started). A rerun of the
sweep's command runs the failed, interrupted and pending cells and resumes from checkpoints."""


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="deepinit sweep", description="Follow a sweep.",
                                epilog=STATUS_HELP)
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="every cell's status (queued, running, ok, diverged, "
                                       "failed, interrupted, ...)", epilog=STATUS_HELP)
    st.add_argument("sweep_dir", type=Path)
    st.add_argument("--json", action="store_true", help="one JSON object per cell instead of a table")
    args = p.parse_args(list(argv))

    if not args.sweep_dir.is_dir():
        print(f"deepinit sweep status: {args.sweep_dir}: not a directory")
        return 2
    states = sweep_states(args.sweep_dir)
    if not states:
        print(f"deepinit sweep status: no run folders or multirun.yaml under {args.sweep_dir}")
        return 2
    if args.json:
        for s in states:
            print(json.dumps(s.as_dict(args.sweep_dir)))
        return 0
    render(states, args.sweep_dir)
    n = counts(states)
    if n["failed"] or n["interrupted"] or n["pending"]:
        print("rerun the sweep's command to run the failed, interrupted and pending cells")
    return 0
