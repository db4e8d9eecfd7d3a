"""`deepinit report SWEEP_DIR`: tables and plots of a sweep, from its run folders."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from runner.sweep.report import METRICS, default_metric, load_sweep, print_rich, write_report


def _axes_arg(s: Optional[str]) -> Optional[list[str]]:
    return None if s is None else [a for a in s.split(",") if a]


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="deepinit report",
                                description="Tables and plots of a sweep, from its run folders.")
    p.add_argument("sweep_dir", type=Path)
    p.add_argument("--metric", default="auto", choices=["auto", *sorted(METRICS)],
                   help="what the isolation table and heatmap rank by; auto: BLEU when every "
                        "finished ok cell has one (the papers' metric), else best_valid_loss")
    p.add_argument("--scientific", help="comma list of axes to compare (default: the preset's)")
    p.add_argument("--nuisance", help="comma list of axes to optimize over (default: the preset's)")
    p.add_argument("--out", type=Path, help="where report.md/csv and plots go (default: SWEEP_DIR)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(list(argv))
    try:
        sweep = load_sweep(args.sweep_dir, _axes_arg(args.scientific), _axes_arg(args.nuisance))
    except FileNotFoundError as e:
        print(f"deepinit report: {e}")
        return 2
    if not sweep.cells:
        print(f"deepinit report: no run folders or multirun.yaml under {args.sweep_dir}")
        return 2
    metric = default_metric(sweep) if args.metric == "auto" else args.metric
    print_rich(sweep, metric)
    out = write_report(sweep, metric, args.out, plots=not args.no_plots)
    print(f"wrote {out['markdown']}, {out['csv']}" +
          "".join(f", {p}" for p in out["images"]))
    return 0
