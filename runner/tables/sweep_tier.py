"""The cpu and paper scales: a target's sweep presets run through `deepinit -m` into
`<out>/<target>-<scale>/` (a fixed folder, so a second call only runs the cells that have not
finished: the trainer skips finished ones). Finished cells are then scored (the same scoring as
`deepinit eval`), and the table (runner/tables/render.py) is printed and written to
`reproduction.md` in the sweep folder."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from runner.console import format_duration
from runner.run.attempt import signal_of
from runner.run.evaluate import evaluate_run
from runner.run.folder import wait_interruptibly
from runner.run.hardware import gpu_visible, usable_cores
from runner.run.status import FINISHED
from runner.sweep.plan import plan_cells
from runner.tables.plan import (
    CELL_OVERHEAD_S,
    SEC_PER_LAYER_UPDATE,
    TOY_MAX_TOKENS,
    CellResult,
    Outcome,
    Request,
    collect,
    estimate_cell_s,
    part_dir,
    sweep_dir_for,
)
from runner.tables.pool import estimate_wall_s, stop_cells
from runner.tables.render import metric_for, write_outputs
from runner.tables.targets import Part, Target


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


def run_sweeps(target: Target, scale: str, request: Request, started: float) -> int:
    """SCALE=cpu or paper: the target's presets through `deepinit -m`, then scoring and the table;
    the exit code. `started` is when the call began (time.perf_counter), for its total wall time."""
    launcher = request.launcher or "local"
    parallel = request.parallel or usable_cores()
    sweep_dir = sweep_dir_for(request.out.resolve(), target.name, scale)
    extra = list(request.overrides)
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
        if not request.dry_run:
            return 2
    if request.dry_run:
        return 0

    rc = 0
    env = dict(os.environ)
    if scale == "cpu":  # local: one thread per cell, cells side by side on the cores
        threads = str(parallel if launcher == "basic" else 1)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    for part in target.parts[scale]:
        pdir = part_dir(sweep_dir, part)
        cells = outcome.cells[part.sub]
        if not request.table_only and any(c.status not in FINISHED for c in cells):
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
                stop_cells([proc], settle_s=15.0 if ctrl_c else 0.0)
                raise
            if proc.returncode:
                print(f"deepinit -m exited with {proc.returncode} (cells' train.log files say why)",
                      file=sys.stderr)
                rc = proc.returncode
            cells = collect(part, pdir, extra)
            outcome.cells[part.sub] = cells
        if not request.no_eval and not request.table_only:
            score_cells(cells, part, "cpu" if scale == "cpu" else "auto")
            outcome.cells[part.sub] = collect(part, pdir, extra)
    path = write_outputs(outcome, metric_for(scale))
    print()
    print(path.read_text())
    print(f"wrote {path}")
    print(f"total wall time of this call: {format_duration(time.perf_counter() - started)}")
    return rc
