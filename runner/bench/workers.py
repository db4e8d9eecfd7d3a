"""One bench entry in a fresh child process (`python -m runner.bench SPEC.json OUT.json`), so peak
memory and allocator state are its own: deepinit's real train loop (run_entry) or the same step in
plain PyTorch (run_reference_entry), with the throughput, work and FLOPs of the timed windows."""
from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from runner.bench.corpus import fairseq_generate_batches
from runner.bench.entries import (
    PEER_DECODE_BATCH_SIZE,
    PEER_DECODE_MAX_TOKENS,
    Entry,
    entry_overrides,
    entry_schedule,
    uses_cuda,
)
from runner.bench.lm import run_lm_entry, run_lm_reference_entry
from runner.bench.machine import LoadProbe, rss_mb
from runner.bench.profile import OperatorProfile
from runner.bench.reference import train_reference
from runner.config import Config, config_from_dict
from runner.console import log
from runner.data.dataset import TokenizedSplit
from runner.decode.search import decode_throughput
from runner.init import options_class
from runner.model.flops import train_flops
from runner.model.sublayer import norm_options_class
from runner.run.allocator import host_allocator
from runner.run.build import build_run
from runner.run.folder import signals_held, wait_interruptibly, write_json
from runner.train.loop import Callback, Trainer

REPO = Path(__file__).resolve().parents[2]  # runner/bench/workers.py -> the repository


class RecordCollector(Callback):
    """The train loop's records, kept in memory (the bench writes no run folder)."""

    def __init__(self):
        self.records: list[dict] = []

    def on_record(self, trainer: Trainer, record: dict) -> None:
        self.records.append(record)


def window_figures(updates: int, tokens: int, seconds: float, cpu_seconds: float) -> dict:
    """One timed window: `updates` updates that trained `tokens` target tokens."""
    return {"updates": updates, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "ms_per_update": 1e3 * seconds / updates,
            "cpu_seconds": cpu_seconds, "tokens_per_cpu_s": tokens / max(cpu_seconds, 1e-9)}


def timed_figures(windows: list[dict], split: TokenizedSplit, timed: list[np.ndarray], updates: int,
                  cfg: Config, tgt_vocab: int) -> dict:
    """Throughput over the timed windows, and the work of the `updates` timed updates, whose
    batches (sentence indices into `split`) are `timed`: what a deepinit entry and its
    plain-PyTorch reference both report, computed one way."""
    src_lengths, tgt_lengths = split.src_lengths, split.tgt_lengths
    src = np.concatenate([src_lengths[b] for b in timed])
    tgt = np.concatenate([tgt_lengths[b] for b in timed])
    cells = sum(len(b) * (int(src_lengths[b].max()) + int(tgt_lengths[b].max())) for b in timed)
    m = cfg.model
    flops = train_flops(m.dim, m.ffn_dim, m.num_encoder_layers, m.num_decoder_layers, tgt_vocab, src, tgt)
    tps = [w["tokens_per_s"] for w in windows]
    return {
        "tokens_per_s": statistics.median(tps), "tokens_per_s_min": min(tps),
        "tokens_per_s_max": max(tps),
        "tokens_per_cpu_s": statistics.median(w["tokens_per_cpu_s"] for w in windows),
        "ms_per_update": statistics.median(w["ms_per_update"] for w in windows),
        "tokens_per_update": float(tgt.sum()) / updates,
        "padding_fraction": 1.0 - float(src.sum() + tgt.sum()) / cells,
        "flops_per_target_token": flops / float(tgt.sum()),
    }


def dynamo_counts() -> dict:
    """What torch.compile made of the entry: graphs compiled, graph breaks, and frames it gave up
    on, from dynamo's counters. A compile that fails runs eagerly without a word
    (trainer.compile), so a compiled entry with 0 graphs timed the eager model, and one with
    failed frames (an error, or the recompile limit) timed those frames eagerly."""
    from torch._dynamo.utils import counters  # noqa: PLC0415 (the compiler stack: compiled entries only)

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            # convert_frame counts every frame it tries ("total") and those it compiled ("ok")
            "frames_failed": int(counters["frames"]["total"] - counters["frames"]["ok"])}


def eager_fallback(compiled: dict) -> Optional[str]:
    """What of a compiled entry ran eagerly, in words (None when all of it compiled), from
    dynamo_counts(); reports written before frames_failed was counted lack that key."""
    if compiled["graphs"] == 0:
        return "torch.compile made no graph: these are eager figures"
    if compiled.get("frames_failed"):
        return f"torch.compile gave up on {compiled['frames_failed']} frame(s), which ran eagerly"
    return None


def run_entry(entry: Entry, cfg: Config, overrides: list[str]) -> dict:
    """Train `entry` (composed into `cfg` from `overrides`) for warm-up + timed updates with the
    real train loop, then decode."""
    if entry.threads:
        torch.set_num_threads(entry.threads)
    cuda = uses_cuda(entry)
    _, warmup, updates = entry_schedule(entry)
    rss_start = rss_mb()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if entry.compile:
        from torch._dynamo.utils import counters  # noqa: PLC0415
        counters.clear()  # this entry's compiles only
    parts = build_run(cfg)
    collector = RecordCollector()
    profiler = (OperatorProfile(updates, entry.profile, Path(entry.profile_stem), cuda)
                if entry.profile else None)
    trainer = Trainer(parts, [collector] + ([profiler] if profiler else []))
    # Record which sentences each update trains on (lengths, padding, FLOPs); the stream is
    # the trainer's own batch order, read on the host, so no device sync is added.
    # The process CPU time at each request (= the start of an update) gives CPU seconds per
    # update, a figure other processes on a shared machine barely disturb (one thread).
    taken: list[np.ndarray] = []
    cpu_marks: list[float] = []

    def recorded(stream):
        for indices in stream:
            taken.append(indices)
            cpu_marks.append(time.process_time())
            yield indices

    trainer.stream = recorded(trainer.stream)
    with LoadProbe() as probe, profiler or nullcontext():
        outcome = trainer.run()
    if cuda:
        torch.cuda.synchronize()
        peak_mb = torch.cuda.max_memory_allocated() / 2 ** 20
    else:  # Linux reports ru_maxrss in KiB
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    train = [r for r in collector.records if r["split"] == "train"]
    split = parts.train_split
    tgt_lengths = split.tgt_lengths
    wall = {r["step"]: r["wall_s"] for r in train}
    # the stream gives micro-batches: trainer.update_freq of them per update (one process)
    per_update = cfg.trainer.update_freq
    windows = []
    for w in range(entry.windows):
        first, last = warmup + w * entry.steps, warmup + (w + 1) * entry.steps  # updates (first, last]
        batches = taken[first * per_update:last * per_update]
        tokens = int(sum(tgt_lengths[b].sum() for b in batches))
        windows.append(window_figures(entry.steps, tokens, wall[last] - wall[first],
                                      cpu_marks[last * per_update] - cpu_marks[first * per_update]))
    timed = taken[warmup * per_update:updates * per_update]
    m = cfg.model
    out: dict[str, Any] = {
        **{k: v for k, v in asdict(entry).items() if k not in ("overrides", "extra")},
        "overrides": overrides,
        "model": f"{m.dim}-{m.ffn_dim}-{m.heads}, {m.num_encoder_layers}+{m.num_decoder_layers}",
        "parameters": parts.parameters, "status": outcome.status,
        "train_loss": trainer.state.last_train_loss, "device": str(parts.device),
        "precision": parts.precision, "threads": torch.get_num_threads(),
        "src_vocab": len(parts.data.src_dict), "tgt_vocab": len(parts.data.tgt_dict),
        **timed_figures(windows, split, timed, updates - warmup, cfg, len(parts.data.tgt_dict)),
        "peak_memory_mb": peak_mb, "memory_kind": "cuda_max_allocated" if cuda else "max_rss",
        "rss_before_trainer_mb": rss_start, "windows": windows, "load_train": probe.as_dict(),
    }
    if profiler is not None:
        out["profile"] = profiler.summary
    if entry.compile:
        out["compiled"] = dynamo_counts()
        fallback = eager_fallback(out["compiled"])
        if fallback:
            log.warning("%s: %s", entry.name, fallback)
    if entry.decode:
        full_length_decoding(parts.model, parts.eos)
        test = parts.data.splits[cfg.data.test_split]
        n = min(entry.decode, len(test))
        test = test.subset(np.arange(n)) if n < len(test) else test
        batches = fairseq_generate_batches(test.src_lengths, test.tgt_lengths,
                                           PEER_DECODE_MAX_TOKENS, PEER_DECODE_BATCH_SIZE)
        if not batches:  # fewer than 8 sentences (--decode-sentences): no batch survives
            batches = fairseq_generate_batches(test.src_lengths, test.tgt_lengths,
                                               PEER_DECODE_MAX_TOKENS, PEER_DECODE_BATCH_SIZE, 1)
        for beam, key in ((5, "beam5"), (1, "greedy")):
            with trainer.autocast(), LoadProbe() as dprobe:
                d = decode_throughput(parts.model, test, beam=beam, device=parts.device,
                                      max_tokens=PEER_DECODE_MAX_TOKENS,
                                      batch_size=PEER_DECODE_BATCH_SIZE, batches=batches)
            out[key] = {**d, "load": dprobe.as_dict()}
    return out


def full_length_decoding(model, eos: int) -> None:
    """Make an untrained model decode up to the length cap, as fairseq's untrained model does
    by itself (its 500 test outputs are exactly the cap long): eos logits are lowered by 1e4, so
    eos comes only where the search forces it. Without this, an untrained deepinit model ends
    beam-5 hypotheses after a few tokens, and fewer steps would be compared with more."""
    base = type(model)

    class FullLength(base):
        def decode(self, *args, **kwargs):
            logits = base.decode(self, *args, **kwargs)
            logits[..., eos] -= 1e4
            return logits

    model.__class__ = FullLength


def run_reference_entry(entry: Entry, cfg: Config, overrides: list[str]) -> dict:
    """The entry's training step in plain PyTorch (runner/bench/reference.py) on the entry's own
    batches and schedule, reported with run_entry's keys where they apply (no decoding)."""
    if entry.threads:
        torch.set_num_threads(entry.threads)
    _, warmup, updates = entry_schedule(entry)
    rss_start = rss_mb()
    with LoadProbe() as probe:
        run = train_reference(cfg, warmup, entry.steps, entry.windows)
    per_update = [int(sum(run.split.tgt_lengths[g].sum() for g in group)) for group in run.taken]
    windows = []
    for w in range(entry.windows):
        first, last = warmup + w * entry.steps, warmup + (w + 1) * entry.steps
        windows.append(window_figures(entry.steps, sum(per_update[first:last]),
                                      run.wall[w + 1] - run.wall[w], run.cpu[w + 1] - run.cpu[w]))
    timed = [b for group in run.taken[warmup:updates] for b in group]
    m = cfg.model
    return {
        **{k: v for k, v in asdict(entry).items() if k not in ("overrides", "extra", "decode")},
        "kind": "reference", "overrides": overrides,
        "model": f"{m.dim}-{m.ffn_dim}-{m.heads}, {m.num_encoder_layers}+{m.num_decoder_layers}",
        "parameters": run.parameters,
        "status": "ok" if run.train_loss is not None and math.isfinite(run.train_loss) else "diverged",
        "train_loss": run.train_loss, "device": run.device, "precision": run.precision,
        "threads": torch.get_num_threads(), "src_vocab": run.src_vocab, "tgt_vocab": run.tgt_vocab,
        **timed_figures(windows, run.split, timed, updates - warmup, cfg, run.tgt_vocab),
        "peak_memory_mb": run.peak_memory_mb, "memory_kind": run.memory_kind,
        "rss_before_trainer_mb": rss_start, "windows": windows, "load_train": probe.as_dict(),
    }


# which step a child process times, per task: deepinit's train loop, or the plain-PyTorch reference
WORKERS = {"translation": {"deepinit": run_entry, "reference": run_reference_entry},
           "lm": {"deepinit": run_lm_entry, "reference": run_lm_reference_entry}}


def worker_main(argv: list[str]) -> int:
    """python -m runner.bench SPEC.json OUT.json: one entry with its composed config."""
    spec = json.loads(Path(argv[0]).read_text())
    entry = Entry(**spec["entry"])
    worker = WORKERS[entry.task][spec.get("kind", "deepinit")]
    out = worker(entry, config_from_dict(spec["config"], options_class, norm_options_class), spec["overrides"])
    out["host_allocator"] = host_allocator()  # deepinit's CPU entries keep freed memory, references not
    write_json(Path(argv[1]), out, indent=1)
    return 0


def run_isolated(entry: Entry, work: Path, compose: Callable[[list[str]], Config],
                 kind: str = "deepinit") -> dict:
    """run_entry (kind "reference": run_reference_entry) in a fresh interpreter, so peak memory
    and allocator state are the entry's own. `compose` makes the entry's Config from its
    overrides (the CLI's composition)."""
    work.mkdir(parents=True, exist_ok=True)
    stem = entry.name if kind == "deepinit" else f"{entry.name}.{kind}"
    spec = work / f"{stem}.entry.json"
    out = work / f"{stem}.result.json"
    overrides = entry_overrides(entry, work)
    write_json(spec, {"kind": kind, "entry": asdict(entry), "overrides": overrides,
                      "config": asdict(compose(overrides))})
    out.unlink(missing_ok=True)
    env = dict(os.environ)
    if entry.threads:
        env.update(OMP_NUM_THREADS=str(entry.threads), MKL_NUM_THREADS=str(entry.threads))
    t0 = time.perf_counter()
    child: Optional[subprocess.Popen] = None
    try:
        # a stop that lands while the child starts is held until `child` is set: it then kills
        # the child below (raised inside Popen, it left the entry training unowned; raised
        # between Popen and the wait, Popen's context exit waited for the whole entry)
        with signals_held():
            child = subprocess.Popen([sys.executable, "-m", "runner.bench", str(spec), str(out)], cwd=REPO,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = wait_interruptibly(child)
    except BaseException:  # Ctrl-C, a time limit: the entry's process goes with this one
        if child is not None:
            child.kill()
            child.communicate()
        raise
    if child.returncode != 0 or not out.is_file():
        tail = "\n".join((stderr or stdout).strip().splitlines()[-15:])
        failed = {"name": entry.name, "group": entry.group, "status": "failed", "error": tail}
        return failed if kind == "deepinit" else {**failed, "kind": kind}
    result = json.loads(out.read_text())
    result["process_wall_s"] = time.perf_counter() - t0
    return result

