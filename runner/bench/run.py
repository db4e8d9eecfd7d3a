"""`deepinit bench` with parsed arguments: the peak, then every planned entry in turn (or the
peer comparison), the JSON report written after each, and its tables."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from runner.bench import workers
from runner.bench.compare import peer_comparison, peer_ready, reference_comparison, summarize_reference
from runner.bench.entries import entry_overrides, plan_entries, resolve_args
from runner.bench.lm import corpus_problem
from runner.bench.machine import LoadProbe, machine_info
from runner.bench.tables import markdown_tables, print_tables
from runner.config import Config
from runner.console import console
from runner.run.folder import write_json
from runner.run.hardware import cpu_matmul_peak, cuda_bf16_peak


def run_bench(args, argv: list[str], compose: Callable[[list[str]], Config]) -> int:
    """`deepinit bench` with parsed arguments (runner/cli/bench.py); the exit code. `compose`
    makes a Config from overrides (the CLI's composition)."""
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.device == "cuda" and not torch.cuda.is_available():
        print("deepinit: error: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    problem = resolve_args(args, cuda)
    if problem:
        print(f"deepinit: error: {problem}", file=sys.stderr)
        return 2
    if args.peer:
        problem = peer_ready(args)
        if problem:
            print(f"deepinit: error: {problem}", file=sys.stderr)
            return 2
    if not args.peer:  # a task=lm entry's corpus: one line now, not a failed entry later
        for entry in plan_entries(args):
            if entry.task == "lm":
                problem = corpus_problem(compose(entry_overrides(entry, args.work.resolve())))
                if problem:
                    print(f"deepinit: error: {entry.name}: {problem}", file=sys.stderr)
                    return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_path = args.out or Path("outputs/bench") / f"bench{'-peer' if args.peer else ''}-{stamp}.json"
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)

    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict[str, Any] = {"command": ["deepinit", "bench", *argv], "time": stamp,
                              "machine": machine_info(args.device, args.threads), "entries": []}
    with LoadProbe() as probe:
        if args.peak_gflops:
            report["peak"] = {"gflops": args.peak_gflops, "dtype": "bf16" if cuda else "fp32",
                              "source": "given (--peak-gflops)"}
        elif cuda:
            report["peak"] = cuda_bf16_peak(torch.cuda.get_device_name())
        else:  # --quick is a smoke test: a rougher peak, ~0.5 s instead of ~4
            report["peak"] = cpu_matmul_peak(args.threads, seconds=0.2 if args.quick else 1.5)
    report["peak"]["load"] = probe.as_dict()
    console.print(f"peak: {report['peak']['gflops']:,.0f} GFLOP/s {report['peak']['dtype']} "
                  f"({report['peak']['source']}); load average {os.getloadavg()[0]:.2f}")

    interrupted = False
    try:
        if args.peer:
            report["peer"] = peer_comparison(args, work, report["peak"], compose)
        else:
            run_entries(args, report, out_path, work, compose)
    except KeyboardInterrupt:  # Ctrl-C or a time limit's SIGINT: keep the entries that finished
        interrupted = True
        report["interrupted"] = True
    report["machine"]["loadavg_end"] = os.getloadavg()
    write_report(out_path, report)
    print_tables(report)
    console.print(f"JSON: {out_path} (Markdown tables: {out_path.with_suffix('.md')})")
    if interrupted:
        sys.stderr.write(f"deepinit bench: interrupted; the {len(report['entries'])} finished "
                         f"entries are in {out_path}\n")
        return 130
    failed = [e["name"] for e in report["entries"] if e["status"] == "failed"]
    for row in (report.get("peer") or {}).values():
        failed += [f"deepinit {row['peer_config']}" for r in row["deepinit_runs"] if r["status"] == "failed"]
        failed += [f"fairseq {row['peer_config']}" for r in row["fairseq_runs"] if r["returncode"] != 0]
    for name, row in (report.get("reference") or {}).items():
        failed += [f"{name} {r.get('kind', 'deepinit')}" for r in row["deepinit_runs"][1:] + row["reference_runs"]
                   if r["status"] == "failed"]
    return 1 if failed else 0


def run_entries(args, report: dict, out_path: Path, work: Path,
                compose: Callable[[list[str]], Config]) -> None:
    """Every planned entry in turn, into report["entries"] (and report["reference"]); the report
    is written after each entry, so a call cut short keeps the entries that finished."""
    for entry in plan_entries(args):
        if entry.profile:  # next to the JSON: <stem>.<entry>.profile.txt and .trace.json
            entry = replace(entry, profile_stem=str(out_path.resolve().with_suffix("")) + f".{entry.name}")
        if args.reference and entry.group == "preset":
            def keep(ours: list[dict], refs: list[dict], name: str = entry.name) -> None:
                """The runs so far into the report, written at once: a time limit's SIGINT during
                a later run keeps them (the preset table's entry is the first deepinit run)."""
                report.setdefault("reference", {})[name] = summarize_reference(ours, refs, report["peak"])
                if len(ours) == 1 and not refs:
                    report["entries"].append(ours[0])
                write_report(out_path, report)

            ours, refs = reference_comparison(entry, args, work, compose, keep)
            for run in ours[1:] + refs:
                if run["status"] == "failed":
                    console.print(f"[red]{entry.name} ({run.get('kind', 'deepinit')}) failed[/]:\n{run['error']}")
            if ours[0]["status"] == "failed":
                console.print(f"[red]{entry.name} failed[/]:\n{ours[0]['error']}")
            continue  # its entry went into the report with its first run
        console.print(f"[bold]bench[/] {entry.name}: {entry.warmup} warm-up + "
                      f"{entry.windows} x {entry.steps} timed updates ...")
        result = workers.run_isolated(entry, work, compose)
        if result["status"] == "failed":
            console.print(f"[red]{entry.name} failed[/]:\n{result['error']}")
        report["entries"].append(result)
        write_report(out_path, report)


def write_report(out_path: Path, report: dict) -> None:
    """The JSON and its Markdown tables beside it."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(out_path, report, indent=1)
    out_path.with_suffix(".md").write_text(markdown_tables(report) + "\n")
