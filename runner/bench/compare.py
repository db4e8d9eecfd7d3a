"""Side-by-side comparisons, run by run in alternation so that a shared machine's load falls on
both sides alike: deepinit against fairseq (--peer, the peer's scripts) and against the same
training step in plain PyTorch (--reference)."""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from runner.bench import workers
from runner.bench.entries import PEER_CONFIGS, Entry, preset_entry
from runner.bench.machine import LoadProbe
from runner.config import Config
from runner.console import console
from runner.run.folder import wait_interruptibly
from runner.run.hardware import mfu

# --reference: the speed-up over the plain-PyTorch step (deepinit / reference tokens/s) that the
# GPU benchmark's goal asks for ("at least 1.2x the plain reference", docs/performance.md)
REFERENCE_TARGET = 1.2
# task=lm: "at least as fast as a plain PyTorch GPT of the same shape" (the LM task's issue)
LM_REFERENCE_TARGET = 1.0
# what each task's plain-PyTorch side is (the tables name it)
REFERENCE_NAMES = {"translation": "torch.nn.Transformer", "lm": "a hand-written GPT"}


# ----------------------------------------------------------------------------- the peer
def run_peer(config: str, args, decode: bool) -> dict:
    """One fairseq run of peer_train_bench.sh (REPS=1) and its printed medians."""
    env = {**os.environ, "REPS": "1", "THREADS": str(args.threads or 2),
           "DECODE": "1" if decode else "0", "QUIET_WAIT": str(args.quiet_wait),
           "RETRIES": "0"}
    t0 = time.perf_counter()
    with LoadProbe() as probe:
        with subprocess.Popen(["bash", str(args.peer_tools / "peer_train_bench.sh"), config], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
            try:
                stdout, stderr = wait_interruptibly(child)
            except BaseException:
                child.kill()
                raise
    out: dict[str, Any] = {"config": config, "returncode": child.returncode,
                           "wall_s": time.perf_counter() - t0, "load": probe.as_dict(),
                           "stderr_tail": stderr.strip().splitlines()[-6:]}
    # "<name>_decode_beam5: runs sentences/s = ..; generated tokens/s median X; N tokens; ..."
    for line in stderr.splitlines():
        m = re.search(r"_decode_beam(\d): .*generated tokens/s median ([\d.]+); (\d+) tokens", line)
        if m:
            key = "beam5" if m.group(1) == "5" else "greedy"
            out[f"{key}_tokens_per_s"] = float(m.group(2))
            out[f"{key}_tokens"] = int(m.group(3))
    for line in stdout.splitlines():
        name, _, value = line.partition(" ")
        key, _, number = value.partition("=")
        try:
            number_f = float(number)
        except ValueError:
            continue
        if name.endswith("_decode_beam5"):
            out["beam5_sentences_per_s"] = number_f
        elif name.endswith("_decode_beam1"):
            out["greedy_sentences_per_s"] = number_f
        elif key == "tokens_per_s":
            out["tokens_per_s"] = number_f
    return out


def peer_ready(args) -> Optional[str]:
    if args.peer_tools is None:
        return "--peer needs --peer-tools DIR (the folder of peer_train_bench.sh)"
    script = args.peer_tools / "peer_train_bench.sh"
    if not script.is_file():
        return f"no peer tooling at {args.peer_tools} (set --peer-tools)"
    peer_dir = Path(os.environ.get("PEER_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "peer-helper")))
    if not (peer_dir / "venv" / "bin" / "fairseq-train").exists():
        return f"fairseq is not set up in {peer_dir}: run bash {args.peer_tools}/peer_setup.sh"
    return None


# the speed-up over fairseq (deepinit / fairseq) that deepinit aims for (docs/performance.md)
PEER_TARGETS = {"tokens_per_s": 1.3, "beam5_sentences_per_s": 1.5}


def peer_comparison(args, work: Path, peak: dict, compose: Callable[[list[str]], Config]) -> dict:
    """deepinit and fairseq alternating, run by run, on the peer's configurations."""
    comparison: dict[str, Any] = {}
    for name in args.peer_configs:
        peer_name = PEER_CONFIGS[name]
        ours_runs, peer_runs = [], []
        for rep in range(args.reps):
            decode = rep < args.decode_reps and not args.no_decode
            console.print(f"[bold]bench-peer[/] {name}: run {rep + 1}/{args.reps}: fairseq "
                          f"({peer_name}{', decoding' if decode else ''}) ...")
            peer_runs.append(run_peer(peer_name, args, decode))
            entry = preset_entry(name, args, peer=True)
            entry.decode = entry.decode if decode else 0
            console.print(f"[bold]bench-peer[/] {name}: run {rep + 1}/{args.reps}: deepinit ...")
            ours_runs.append(workers.run_isolated(entry, work, compose))
        comparison[name] = summarize_pair(name, peer_name, ours_runs, peer_runs, peak)
    return comparison


def _median(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize_pair(name: str, peer_name: str, ours: list[dict], peer: list[dict], peak: dict) -> dict:
    row: dict[str, Any] = {"peer_config": peer_name, "deepinit_runs": ours, "fairseq_runs": peer}
    flops = _median([r.get("flops_per_target_token") for r in ours])
    for key in ("tokens_per_s", "beam5_sentences_per_s", "greedy_sentences_per_s"):
        if key == "tokens_per_s":
            mine = [r.get("tokens_per_s") for r in ours]
        else:
            mine = [(r.get(key.split("_")[0]) or {}).get("sentences_per_s") for r in ours]
        theirs = [r.get(key) for r in peer]
        m, t = _median(mine), _median(theirs)
        row[key] = {"deepinit": m, "fairseq": t, "deepinit_runs": mine, "fairseq_runs": theirs,
                    "ratio": m / t if m and t else None, "target": PEER_TARGETS.get(key)}
    # Decoding work: output tokens per sentence on each side. An untrained model may end beams
    # early on one side; equal lengths mean equal work.
    for key in ("beam5", "greedy"):
        mine = [(r.get(key) or {}) for r in ours]
        mine_tps = _median([d.get("tokens_per_s") for d in mine])
        mine_len = _median([d["tokens_per_s"] * d["seconds"] / d["sentences"] for d in mine
                            if d.get("tokens_per_s") and d.get("seconds") and d.get("sentences")])
        # one run per peer call: tokens/s over sentences/s is its output tokens per sentence
        theirs_len = _median([r[f"{key}_tokens_per_s"] / r[f"{key}_sentences_per_s"] for r in peer
                              if r.get(f"{key}_tokens_per_s") and r.get(f"{key}_sentences_per_s")])
        theirs_tps = _median([r.get(f"{key}_tokens_per_s") for r in peer])
        row[f"{key}_output_tokens_per_sentence"] = {"deepinit": mine_len, "fairseq": theirs_len}
        row[f"{key}_output_tokens_per_s"] = {
            "deepinit": mine_tps, "fairseq": theirs_tps,
            "ratio": mine_tps / theirs_tps if mine_tps and theirs_tps else None}
    if flops and peak.get("gflops"):
        for side in ("deepinit", "fairseq"):
            tps = row["tokens_per_s"][side]
            row.setdefault("mfu", {})[side] = mfu(tps, flops, peak["gflops"]) if tps else None
    return row


# ----------------------------------------------------------------------------- the reference
def reference_comparison(entry: Entry, args, work: Path, compose: Callable[[list[str]], Config],
                         after_each: Callable[[list[dict], list[dict]], None] = lambda ours, refs: None,
                         ) -> tuple[list[dict], list[dict]]:
    """args.reps pairs of child processes, deepinit's entry then the plain-PyTorch reference of
    it, alternating (ours, reference, ours, reference, ...). Only the first deepinit run decodes
    (the reference does not): decoding comes after training and does not touch its timing.
    after_each(ours, refs) sees the runs so far after every run, so a call cut short keeps them."""
    ours: list[dict] = []
    refs: list[dict] = []
    for rep in range(args.reps):
        run = replace(entry, decode=entry.decode if rep == 0 else 0)
        console.print(f"[bold]bench-reference[/] {entry.name}: run {rep + 1}/{args.reps}: deepinit "
                      f"({entry.warmup} warm-up + {entry.windows} x {entry.steps} timed updates) ...")
        ours.append(workers.run_isolated(run, work, compose))
        after_each(ours, refs)
        console.print(f"[bold]bench-reference[/] {entry.name}: run {rep + 1}/{args.reps}: plain PyTorch ...")
        refs.append(workers.run_isolated(run, work, compose, kind="reference"))
        after_each(ours, refs)
    return ours, refs


def summarize_reference(ours: list[dict], refs: list[dict], peak: dict) -> dict:
    """Medians per side of alternating runs, deepinit / reference ratios, and MFU per side."""
    row: dict[str, Any] = {"deepinit_runs": ours, "reference_runs": refs}
    for key in ("tokens_per_s", "ms_per_update", "peak_memory_mb", "flops_per_target_token"):
        mine = [r.get(key) for r in ours]
        theirs = [r.get(key) for r in refs]
        m, t = _median(mine), _median(theirs)
        row[key] = {"deepinit": m, "reference": t, "deepinit_runs": mine, "reference_runs": theirs,
                    "ratio": m / t if m and t else None}
    first = next((r for r in ours + refs if r.get("status") != "failed"), {})
    task = first.get("task", "translation")
    row["task"], row["reference_model"] = task, REFERENCE_NAMES[task]
    row["tokens_per_s"]["target"] = LM_REFERENCE_TARGET if task == "lm" else REFERENCE_TARGET
    if peak.get("gflops"):
        row["mfu"] = {}
        for side in ("deepinit", "reference"):
            tps, flops = row["tokens_per_s"][side], row["flops_per_target_token"][side]
            row["mfu"][side] = mfu(tps, flops, peak["gflops"]) if tps and flops else None
    row["model"] = f"{first.get('model', '?')} {first.get('precision', '')}".strip()
    row["compile"] = first.get("compile")
    return row

