"""deepinit bench: training and decoding throughput, memory and MFU; depth scaling; fairseq side by side.

Every measurement trains with the real train loop (runner/train/loop.py) in a fresh child process
(clean peak memory, no state carried between entries) on the peer's training stream: the
IWSLT'14 de-en BPE sentences (the staged `iwslt14-de-en-fairseq` folder under the data root)
that the fairseq peer script trains on (valid + test lines 501.., decoding on test lines
1..500), with the peer's vocabularies (all types, or the 1000 most frequent per side). Without
that data, Zipf text with IWSLT-like lengths is used.

    deepinit bench                          presets tiny, small, ci (+ base on CUDA) and depth scaling
    deepinit bench --quick                  a few updates of the ci preset and one 2+2-layer depth entry (smoke test)
    deepinit bench --peer --peer-tools DIR  deepinit and fairseq alternating, with ratios (make bench-peer)
    deepinit bench --reference              each preset also in plain PyTorch (torch.nn.Transformer), alternating
    deepinit bench --compile both           each preset eager and compiled

Throughput counts target tokens (eos included, padding not) per second of wall clock between
log records, after the warm-up updates, as fairseq's wps meter does.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

# loaded now, not on first use: numpy imports it lazily, and a SIGINT that lands inside that
# first import (its Cython module init) is lost, so a bench stopped then would run on
import numpy.random  # noqa: F401
import torch
from rich.table import Table

from runner.bench.profile import OperatorProfile
from runner.bench.reference import train_reference
from runner.config import Config, config_from_dict
from runner.console import console, fmt, log
from runner.data.corpus import default_corpus_dir
from runner.data.dataset import TokenizedSplit
from runner.decode.search import decode_throughput
from runner.run.build import build_run
from runner.run.folder import cpu_name, wait_interruptibly, write_json
from runner.train.loop import Callback, Trainer

REPO = Path(__file__).resolve().parent.parent.parent  # runner/bench/__init__.py -> the repository
DECODE_SENTENCES = 500  # the peer decodes test lines 1..500

# The fairseq IWSLT'14 recipe the peer trains with (peer_train_bench.sh COMMON): Adam
# (0.9, 0.98), lr 5e-4, inverse_sqrt with 4000 warm-up updates, dropout 0.3, weight decay 1e-4,
# no clipping, label smoothing 0.1, decoder input/output embeddings shared, separate
# dictionaries. Only the model shape and batch size differ between entries.
RECIPE = ["optim=adam", "optim.lr=5e-4", "optim.beta1=0.9", "optim.beta2=0.98",
          "optim.weight_decay=0.0001", "optim.clip_norm=0", "trainer.label_smoothing=0.1",
          "schedule=inverse_sqrt", "model.dropout=0.3", "model.attention_dropout=0",
          "model.activation_dropout=0", "model.share_embeddings=decoder_io",
          "data.joined_dictionary=false"]

# name -> (model overrides, vocabulary per side (None: every type), max tokens per batch)
PRESETS: dict[str, tuple[list[str], Optional[int], int]] = {
    "tiny": (["model=tiny"], 1000, 2048),
    "small": (["model=small"], None, 4096),  # fairseq transformer_iwslt_de_en
    "ci": (["model=ci"], 1000, 2048),
    # CUDA only: the WMT base shape with GPU-sized batches
    "base": (["model=base"], None, 16384),
    # CUDA only, as base: transformer big (1024-4096-16, 6+6) and base at 18+18 layers
    "big": (["model=big"], None, 16384),
    "base-18": (["model=base", "model.layers=18"], None, 16384),
}
# The peer's two configurations (peer_train_bench.sh `config`): deepinit name -> peer name.
PEER_CONFIGS = {"small": "iwslt", "tiny-peer": "tiny"}
PRESETS["tiny-peer"] = (["model=tiny", "model.dim=128", "model.ffn_dim=256", "model.heads=4",
                         "model.layers=2"], 1000, 2048)
# Updates: warm-up, per timed window, windows. The peer's runs: iwslt 3 + 15, tiny 20 + 150.
SCHEDULE = {"small": (3, 5, 3), "base": (30, 20, 3), "big": (30, 20, 3), "base-18": (30, 20, 3),
            "tiny-peer": (20, 50, 3)}
PEER_SCHEDULE = {"small": (3, 15, 1), "tiny-peer": (20, 150, 1)}
DEFAULT_SCHEDULE = (10, 20, 3)
# The peer's fairseq-generate call: --max-tokens 4096 --batch-size 128 (peer_train_bench.sh)
PEER_DECODE_MAX_TOKENS, PEER_DECODE_BATCH_SIZE = 4096, 128

# --reference: the speed-up over the plain-PyTorch step (deepinit / reference tokens/s) that the
# GPU benchmark's goal asks for ("at least 1.2x the plain reference", docs/performance.md)
REFERENCE_TARGET = 1.2

# bf16 dense tensor-core peaks from NVIDIA's datasheets, TFLOP/s (no sparsity).
CUDA_BF16_PEAK_TFLOPS = {"H100 SXM": 989.4, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.4,
                         "H200 NVL": 835.0, "H200": 989.4, "GH200": 989.4, "A100": 312.0,
                         "L40S": 362.0, "L40": 181.0, "L4": 121.0, "A10": 125.0}


# ----------------------------------------------------------------------------- entries
@dataclass
class Entry:
    """One measurement, run in its own process."""

    name: str
    group: str  # preset | depth | peer
    overrides: list[str]
    vocab: Optional[int]
    max_tokens: int
    warmup: int
    steps: int  # updates per timed window
    windows: int
    decode: int = 0  # test sentences to decode (beam 5 and greedy); 0 = none
    threads: int = 0
    device: str = "auto"
    compile: bool = False
    layers: Optional[int] = None
    checkpointing: Optional[bool] = None
    profile: int = 0  # updates profiled after the timed windows (runner/bench/profile.py)
    profile_stem: str = ""  # path prefix of the profile's table and trace
    extra: dict = field(default_factory=dict)


def preset_entry(name: str, args, peer: bool = False) -> Entry:
    model, vocab, max_tokens = PRESETS[name]
    warmup, steps, windows = (PEER_SCHEDULE if peer else SCHEDULE).get(name, DEFAULT_SCHEDULE)
    if args.quick:
        warmup, steps, windows = 2, 2, 2
    if args.warmup is not None:
        warmup = args.warmup
    if args.steps is not None:
        steps = args.steps
    if args.windows is not None:
        windows = args.windows
    return Entry(name, "peer" if peer else "preset", RECIPE + model + list(args.override), vocab,
                 max_tokens, warmup, steps, windows,
                 decode=0 if args.no_decode else args.decode_sentences,
                 threads=args.threads, device=args.device, compile=args.compile_on,
                 profile=getattr(args, "profile", 0))


def preset_entries(name: str, args) -> list[Entry]:
    """A preset's entries: one, or with --compile both an eager and a compiled one."""
    entry = preset_entry(name, args)
    if args.compile != "both":
        return [entry]
    return [replace(entry, name=f"{name}-eager", compile=False),
            replace(entry, name=f"{name}-compiled", compile=True)]


def depth_entry(layers: int, checkpointing: bool, args) -> Entry:
    # T-Fixup's ultra-deep width without any norm (Huang et al. 2020, Sec. 4.2: norm=none, no warmup).
    model = ["model=ultradeep", f"model.layers={layers}", "norm=none", "init=tfixup",
             "warmup=none", f"model.activation_checkpointing={str(checkpointing).lower()}"]
    warmup, steps = (1, 1) if args.quick else (1, 3)
    return Entry(f"depth-{layers}{'-ckpt' if checkpointing else ''}", "depth",
                 RECIPE + model + list(args.override), 1000, args.depth_max_tokens, warmup,
                 steps, 1, threads=args.threads, device=args.device, layers=layers,
                 checkpointing=checkpointing, profile=getattr(args, "profile", 0))


# ----------------------------------------------------------------------------- data
def _read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _synthetic_text(seed: int = 1234) -> dict[str, tuple[list[str], list[str]]]:
    """Zipf(1) words over 8000 types per side, lognormal lengths with IWSLT'14's mean (~23
    BPE tokens), the target a word-by-word map of the source: a stand-in when the IWSLT text
    is absent (the sizes of the peer's training split and test set)."""
    rng = np.random.default_rng(seed)
    types = 8000
    p = 1.0 / np.arange(1, types + 1)
    p /= p.sum()
    mapping = rng.permutation(types)
    out = {}
    for split, n in (("train", 13533), ("test", 500)):
        lengths = np.clip(np.rint(rng.lognormal(2.95, 0.62, n)), 1, 175).astype(int)
        src, tgt = [], []
        for length in lengths:
            words = rng.choice(types, size=length, p=p)
            src.append(" ".join(f"s{w}" for w in words))
            tgt.append(" ".join(f"t{w}" for w in mapping[words]))
        out[split] = (src, tgt)
    return out


def _top_types(lines: list[str], n: int) -> set[str]:
    counts = Counter(tok for line in lines for tok in line.split())
    # the order Dictionary.build (and fairseq's finalize) ranks types in: count, then symbol
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {tok for tok, _ in ranked[:n]}


def iwslt_dir() -> Path:
    """The staged IWSLT'14 de-en BPE text under the data root ($DEEPINIT_DATA_ROOT)."""
    return default_corpus_dir("iwslt14")


def write_corpus(root: Path, vocab: Optional[int], source: Optional[Path] = None) -> Path:
    """A data=custom folder with the peer's stream: train = IWSLT'14 valid + test lines 501..,
    valid = test = test lines 1..500. vocab=N keeps the N-4 most frequent types per side and
    writes the rest as <unk> (fairseq-preprocess --nwordssrc/--nwordstgt N). `source` defaults
    to the staged IWSLT'14 folder under the data root; without it, synthetic text."""
    source = iwslt_dir() if source is None else source
    name = f"{'iwslt' if (source / 'valid.de.gz').is_file() else 'synthetic'}-{vocab or 'all'}"
    out = root / name
    if (out / ".done").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    if (source / "valid.de.gz").is_file():
        text = {}
        test = {lang: _read_gz(source / f"test.{lang}.gz") for lang in ("de", "en")}
        valid = {lang: _read_gz(source / f"valid.{lang}.gz") for lang in ("de", "en")}
        text["train"] = (valid["de"] + test["de"][500:], valid["en"] + test["en"][500:])
        text["test"] = (test["de"][:500], test["en"][:500])
    else:
        text = _synthetic_text()
    if vocab is not None:
        keep = [_top_types(text["train"][side], vocab - 4) for side in (0, 1)]
        text = {split: tuple([" ".join(t if t in keep[side] else "<unk>" for t in line.split())
                              for line in lines] for side, lines in enumerate(pair))
                for split, pair in text.items()}
    text["valid"] = text["test"]
    for split, (src, tgt) in text.items():
        (out / f"{split}.de").write_text("\n".join(src) + "\n", encoding="utf-8")
        (out / f"{split}.en").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    (out / ".done").write_text("")
    return out


def fairseq_generate_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int,
                             max_sentences: int, multiple: int = 8) -> list[np.ndarray]:
    """The batches fairseq-generate decodes, so that the decoding benchmark does the peer's work.

    fairseq 0.12 orders sentences by source length (ties by target length), counts a
    sentence as max(source, target) tokens, and grows each batch while rows x its longest
    sentence <= max_tokens and rows <= max_sentences, committing sizes that are multiples of
    `multiple` (--required-batch-size-multiple, 8 by default); a tail that overflows on its own
    is cut off as a batch of its own (fairseq/data/data_utils_fast.pyx, batch_by_size_vec).
    Then it drops the last batch when its size is not such a multiple (data_utils.batch_by_size;
    fairseq issue #5036): on the peer's 500 test sentences the 4 longest are never decoded, and
    fairseq-generate reports 496 sentences."""
    order = np.argsort(tgt_lengths, kind="stable")
    order = order[np.argsort(src_lengths[order], kind="stable")]
    tokens = np.maximum(src_lengths, tgt_lengths)[order]
    ends = [0]  # ends[i]: where batch i ends (so far); ends[-1] belongs to the running batch
    start, batch_max, tail_max = 0, 0, 0
    for pos in range(len(order)):
        tail_max = max(tail_max, int(tokens[pos]))
        rows = pos + 1 - start
        longest = max(batch_max, tail_max)
        if rows > max_sentences or rows * longest > max_tokens:
            if tail_max * (pos + 1 - ends[-1]) > max_tokens:  # the tail alone is too big: cut it
                ends.append(pos)
                tail_max = int(tokens[pos])
            start = ends[-1]
            ends.append(ends[-1])  # a new batch opens at the committed end
            longest = tail_max
            commit = True
        else:
            commit = rows < multiple or rows % multiple == 0
        if commit:
            ends[-1] = pos + 1
            batch_max, tail_max = longest, 0
    if ends[-1] != len(order):
        ends.append(len(order))
    bounds = [0] + ends
    batches = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    if multiple > 1 and batches and len(batches[-1]) % multiple:
        batches = batches[:-1]
    return batches


# ----------------------------------------------------------------------------- FLOPs, peaks
def train_flops(dim: int, ffn: int, enc_layers: int, dec_layers: int, tgt_vocab: int,
                src_len: np.ndarray, tgt_len: np.ndarray) -> float:
    """Model FLOPs of one training pass over sentences with these lengths: 3x the forward
    (backward = 2x forward), 2 FLOPs per weight per token for every matmul weight, and the
    attention score/value products over full (not causally halved) matrices, as in PaLM's MFU
    (Chowdhery et al. 2022, appendix B). Recomputation by checkpointing is not model FLOPs."""
    s, t = src_len.astype(np.float64), tgt_len.astype(np.float64)
    per_src = enc_layers * (4 * dim * dim + 2 * dim * ffn) + dec_layers * 2 * dim * dim  # + cross k/v
    per_tgt = dec_layers * (6 * dim * dim + 2 * dim * ffn) + dim * tgt_vocab  # + output projection
    dense = 2 * (per_src * s.sum() + per_tgt * t.sum())
    attn = 4 * dim * (enc_layers * (s * s).sum() + dec_layers * ((t * t).sum() + (s * t).sum()))
    return 3 * (dense + attn)


def cpu_matmul_peak(threads: int, seconds: float = 1.5) -> dict:
    """The machine's fp32 matmul GFLOP/s (median over repeats, best of a few square sizes)
    with the benchmark's thread count: the denominator of CPU MFU."""
    if threads:
        torch.set_num_threads(threads)
    sizes = {}
    for n in (1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        c = torch.empty(n, n)
        for _ in range(2):
            torch.matmul(a, b, out=c)
        times = []
        end = time.perf_counter() + seconds
        while len(times) < 3 or time.perf_counter() < end:
            t0 = time.perf_counter()
            torch.matmul(a, b, out=c)
            times.append(time.perf_counter() - t0)
        sizes[str(n)] = 2 * n ** 3 / statistics.median(times) / 1e9
    return {"gflops": max(sizes.values()), "by_size": sizes, "dtype": "fp32",
            "threads": torch.get_num_threads(), "source": "measured"}


def cuda_bf16_peak(name: str) -> dict:
    # the longest key that is a whole word of the name: "L40" is not the L4, nor "A10G" the A10
    for key in sorted(CUDA_BF16_PEAK_TFLOPS, key=len, reverse=True):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name):
            return {"gflops": CUDA_BF16_PEAK_TFLOPS[key] * 1e3, "dtype": "bf16",
                    "source": f"datasheet ({key})"}

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    return {"gflops": 20 * 2 * 8192 ** 3 / (time.perf_counter() - t0) / 1e9, "dtype": "bf16",
            "source": "measured (GPU not in the datasheet table)"}


# ----------------------------------------------------------------------------- load
def busy_cpu_seconds() -> float:
    """CPU seconds every process on the machine has used (user+nice+system+irq+softirq+steal)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


class LoadProbe:
    """Cores used by other processes while a block ran (the machine may be shared)."""

    @staticmethod
    def _own_cpu() -> float:  # this process and its waited-for children (the peer's scripts)
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def __enter__(self):
        self.busy, self.cpu, self.t0 = busy_cpu_seconds(), self._own_cpu(), time.perf_counter()
        self.loadavg_before = os.getloadavg()[0]
        return self

    def __exit__(self, *exc):
        wall = max(time.perf_counter() - self.t0, 1e-9)
        own = self._own_cpu() - self.cpu
        self.other_cores = max(0.0, (busy_cpu_seconds() - self.busy - own) / wall)
        self.loadavg_after = os.getloadavg()[0]

    def as_dict(self) -> dict:
        return {"other_cores": round(self.other_cores, 3),
                "loadavg_1min": [round(self.loadavg_before, 2), round(self.loadavg_after, 2)]}


def rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# ----------------------------------------------------------------------------- the worker
class RecordCollector(Callback):
    """The train loop's records, kept in memory (the bench writes no run folder)."""

    def __init__(self):
        self.records: list[dict] = []

    def on_record(self, trainer: Trainer, record: dict) -> None:
        self.records.append(record)


def _uses_cuda(entry: Entry) -> bool:
    return entry.device == "cuda" or (entry.device == "auto" and torch.cuda.is_available())


def entry_schedule(entry: Entry) -> tuple[int, int, int]:
    """(log interval, untimed warm-up updates, warm-up + timed updates)."""
    # CPU: a record per update (no cost without a device to sync); CUDA: one per window, so
    # the only host syncs are the trainer's own logging steps.
    log_interval = entry.steps if _uses_cuda(entry) else 1
    warmup = -(-entry.warmup // log_interval) * log_interval
    return log_interval, warmup, warmup + entry.steps * entry.windows


def entry_overrides(entry: Entry, work: Path) -> list[str]:
    """The config overrides of one entry (writes its corpus folder first)."""
    log_interval, _, updates = entry_schedule(entry)
    # one more untimed update: its batch request closes the last timed update's CPU time (and
    # it warms up the profiler, which then records entry.profile more)
    total_updates = updates + 1 + entry.profile
    corpus = write_corpus(work / "data", entry.vocab)
    overrides = entry.overrides + [
        "data=custom", f"data.dir={corpus}", "data.bpe=none", f"data.cache_dir={work / 'cache'}",
        f"data.max_tokens={entry.max_tokens}", f"trainer.max_updates={total_updates}",
        f"trainer.log_interval={log_interval}", "trainer.valid_interval=0",
        "trainer.save_interval=0", "trainer.keep_checkpoints=0", "trainer.valid_max_batches=1",
        "trainer.tensorboard=false", "trainer.progress=false", "trainer.resume=false",
        f"trainer.device={entry.device}", f"trainer.compile={str(entry.compile).lower()}",
        f"trainer.threads={entry.threads}"]
    if not any(o.startswith("warmup") for o in entry.overrides):
        overrides.append(f"warmup.updates={min(4000, total_updates)}")  # the recipe's 4000, capped
    if _uses_cuda(entry):
        # the divergence check reads the loss (a host sync): only on the window's last update,
        # so a timed window has one sync, as the reference's does
        overrides.append(f"trainer.divergence.check_interval={log_interval}")
    return overrides


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
    cuda = _uses_cuda(entry)
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


# which step a child process times: deepinit's train loop, or the plain-PyTorch reference
WORKERS = {"deepinit": run_entry, "reference": run_reference_entry}


def worker_main(argv: list[str]) -> int:
    """python -m runner.bench SPEC.json OUT.json: one entry with its composed config."""
    spec = json.loads(Path(argv[0]).read_text())
    worker = WORKERS[spec.get("kind", "deepinit")]
    out = worker(Entry(**spec["entry"]), config_from_dict(spec["config"]), spec["overrides"])
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
    with subprocess.Popen([sys.executable, "-m", "runner.bench", str(spec), str(out)], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            stdout, stderr = wait_interruptibly(child)
        except BaseException:  # Ctrl-C, a time limit: the entry's process goes with this one
            child.kill()
            raise
    if child.returncode != 0 or not out.is_file():
        tail = "\n".join((stderr or stdout).strip().splitlines()[-15:])
        failed = {"name": entry.name, "group": entry.group, "status": "failed", "error": tail}
        return failed if kind == "deepinit" else {**failed, "kind": kind}
    result = json.loads(out.read_text())
    result["process_wall_s"] = time.perf_counter() - t0
    return result


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
TARGETS = {"tokens_per_s": 1.3, "beam5_sentences_per_s": 1.5}


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
            ours_runs.append(run_isolated(entry, work, compose))
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
                    "ratio": m / t if m and t else None, "target": TARGETS.get(key)}
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
            row.setdefault("mfu", {})[side] = tps * flops / 1e9 / peak["gflops"] if tps else None
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
        ours.append(run_isolated(run, work, compose))
        after_each(ours, refs)
        console.print(f"[bold]bench-reference[/] {entry.name}: run {rep + 1}/{args.reps}: plain PyTorch ...")
        refs.append(run_isolated(run, work, compose, kind="reference"))
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
    row["tokens_per_s"]["target"] = REFERENCE_TARGET
    if peak.get("gflops"):
        row["mfu"] = {}
        for side in ("deepinit", "reference"):
            tps, flops = row["tokens_per_s"][side], row["flops_per_target_token"][side]
            row["mfu"][side] = tps * flops / 1e9 / peak["gflops"] if tps and flops else None
    first = next((r for r in ours + refs if r.get("status") != "failed"), {})
    row["model"] = f"{first.get('model', '?')} {first.get('precision', '')}".strip()
    row["compile"] = first.get("compile")
    return row


# ----------------------------------------------------------------------------- output
_fmt = partial(fmt, show_nan=False)  # a NaN (a probe that could not measure) reads "-", like a missing value


def _pct(fraction: Optional[float]) -> str:
    return _fmt(None if fraction is None else 100 * fraction, ".1f") + ("" if fraction is None else "%")


def _reference_model(row: dict) -> str:
    return row["model"] + (" compiled" if row.get("compile") else "")


def print_tables(report: dict) -> None:

    peak = report["peak"]
    entries = [e for e in report["entries"] if e["group"] == "preset"]
    machine = report["machine"]
    if entries:
        t = Table(title=f"deepinit bench: training and decoding on {machine['device_name']} "
                        f"({machine['threads']} threads)", title_justify="left")
        for col in ("preset", "model", "tok/s (min-max)", "ms/upd", "peak MB", "pad", "MFU",
                    "beam5/s", "greedy/s", "load"):
            t.add_column(col, justify="left" if col in ("preset", "model") else "right")
        for e in entries:
            if e["status"] == "failed":
                t.add_row(e["name"], "[red]failed[/]", *["-"] * 8)
                continue
            mfu = e["tokens_per_s"] * e["flops_per_target_token"] / 1e9 / peak["gflops"]
            t.add_row(e["name"], f"{e['model']} {e['precision']}",
                      f"{e['tokens_per_s']:,.0f} ({e['tokens_per_s_min']:,.0f}-{e['tokens_per_s_max']:,.0f})",
                      f"{e['ms_per_update']:,.0f}", f"{e['peak_memory_mb']:,.0f}",
                      f"{100 * e['padding_fraction']:.0f}%", f"{100 * mfu:.1f}%",
                      _fmt((e.get("beam5") or {}).get("sentences_per_s"), ".1f"),
                      _fmt((e.get("greedy") or {}).get("sentences_per_s"), ".1f"),
                      f"{e['load_train']['other_cores']:.2f}")
        console.print(t)
        for e in entries:
            if e.get("compiled") is not None:
                c = e["compiled"]
                fallback = eager_fallback(c)
                console.print(f"{e['name']}: torch.compile made {c['graphs']} graph(s) with "
                              f"{c['graph_breaks']} graph break(s)"
                              + (f"; [red]{fallback}[/]" if fallback else ""))
        timed = next((len(e["windows"]) for e in entries if e["status"] != "failed"), 0)
        console.print(f"tok/s: target tokens per second, median of {timed} timed "
                      f"windows; MFU: model FLOPs per target token x tok/s / peak ({peak['gflops']:,.0f} "
                      f"GFLOP/s {peak['dtype']}, {peak['source']}); load: cores other processes used.")
    depth = [e for e in report["entries"] if e["group"] == "depth"]
    if depth:
        t = Table(title="depth scaling: 64-128-2, T-Fixup, norm=none", title_justify="left")
        for col in ("layers", "ckpt", "ms/update", "ms/upd/layer", "peak MB", "MB/added layer",
                    "loss", "status"):
            t.add_column(col, justify="right")
        for e in depth:
            if e["status"] == "failed":
                t.add_row(f"{e.get('layers')}", "-", "-", "-", "-", "-", "-", "[red]failed[/]")
                continue
            base = next((b for b in depth if b.get("checkpointing") == e["checkpointing"]
                         and b.get("status") != "failed"), e)
            layers = 2 * e["layers"]
            per_layer_mem = ((e["peak_memory_mb"] - base["peak_memory_mb"]) / (layers - 2 * base["layers"])
                             if e is not base else None)
            t.add_row(f"{e['layers']}+{e['layers']}", "yes" if e["checkpointing"] else "no",
                      f"{e['ms_per_update']:,.0f}", f"{e['ms_per_update'] / layers:.2f}",
                      f"{e['peak_memory_mb']:,.0f}", _fmt(per_layer_mem, ".2f"),
                      _fmt(e["train_loss"], ".3f"), e["status"])
        console.print(t)
        console.print("MB/added layer: peak memory growth over the shallowest entry with the "
                      "same checkpointing setting, per added layer.")
    for name, row in (report.get("peer") or {}).items():
        t = Table(title=f"deepinit vs fairseq: {name} (peer config {row['peer_config']}), medians of "
                        "alternating runs", title_justify="left")
        for col in ("measure", "deepinit", "fairseq", "ratio", "target", "deepinit runs", "fairseq runs"):
            t.add_column(col, justify="right")
        labels = {"tokens_per_s": "train tok/s", "beam5_sentences_per_s": "beam5 sent/s",
                  "greedy_sentences_per_s": "greedy sent/s"}
        for key, label in labels.items():
            r = row[key]
            ok = r["ratio"] is not None and r["target"] is not None and r["ratio"] >= r["target"]
            ratio = _fmt(r["ratio"], ".2f")
            if r["target"] is not None and r["ratio"] is not None:
                ratio = f"[{'green' if ok else 'red'}]{ratio}[/]"
            t.add_row(label, _fmt(r["deepinit"], ",.1f"), _fmt(r["fairseq"], ",.1f"), ratio,
                      _fmt(r["target"], ".1f"), ", ".join(_fmt(v, ",.1f") for v in r["deepinit_runs"]),
                      ", ".join(_fmt(v, ",.1f") for v in r["fairseq_runs"]))
        for key in ("beam5", "greedy"):
            lengths = row.get(f"{key}_output_tokens_per_sentence") or {}
            speed = row.get(f"{key}_output_tokens_per_s") or {}
            if lengths.get("deepinit") or lengths.get("fairseq"):
                t.add_row(f"{key} out tok/sent", _fmt(lengths.get("deepinit"), ".1f"),
                          _fmt(lengths.get("fairseq"), ".1f"), "", "", "", "")
                t.add_row(f"{key} out tok/s", _fmt(speed.get("deepinit"), ",.0f"),
                          _fmt(speed.get("fairseq"), ",.0f"), _fmt(speed.get("ratio"), ".2f"), "", "", "")
        if row.get("mfu"):
            t.add_row("MFU", _fmt(100 * (row["mfu"]["deepinit"] or 0), ".1f") + "%",
                      _fmt(100 * (row["mfu"]["fairseq"] or 0), ".1f") + "%", "", "", "", "")
        console.print(t)
    reference = report.get("reference") or {}
    if reference:
        reps = max(len(row["reference_runs"]) for row in reference.values())
        t = Table(title=f"deepinit vs plain PyTorch (torch.nn.Transformer), the same training step: "
                        f"medians of {reps} alternating runs per side", title_justify="left")
        for col in ("preset", "model", "deepinit tok/s", "PyTorch tok/s", "ratio", "deepinit MFU",
                    "PyTorch MFU", "deepinit MB", "PyTorch MB"):
            t.add_column(col, justify="left" if col in ("preset", "model") else "right")
        for name, row in reference.items():
            r, mfu, mem = row["tokens_per_s"], row.get("mfu") or {}, row["peak_memory_mb"]
            ratio = _fmt(r["ratio"], ".2f")
            if r["ratio"] is not None:
                ratio = f"[{'green' if r['ratio'] >= r['target'] else 'red'}]{ratio}[/]"
            t.add_row(name, _reference_model(row), _fmt(r["deepinit"], ",.0f"), _fmt(r["reference"], ",.0f"),
                      ratio, _pct(mfu.get("deepinit")), _pct(mfu.get("reference")),
                      _fmt(mem["deepinit"], ",.0f"), _fmt(mem["reference"], ",.0f"))
        console.print(t)
        memory = "max allocated" if machine["device"] == "cuda" else "max RSS"
        console.print(f"ratio: deepinit's median tok/s over the plain-PyTorch reference's, both trained on "
                      f"the same batches (target {REFERENCE_TARGET}x: green when met); MFU against the same "
                      f"peak as above; MB: peak memory ({memory}).")
    profiled = _profile_rows(report)
    if profiled:
        t = Table(title="where an update's time goes (torch.profiler, --profile)", title_justify="left")
        for col in ("entry", "operator", "self ms/update", "share", "calls/update"):
            t.add_column(col, justify="left" if col in ("entry", "operator") else "right")
        for row in profiled:
            t.add_row(*row)
        console.print(t)
        console.print("self time: in the operator itself, not in the operators it calls (on CUDA: the "
                      "GPU time of the kernels it launched); share: of all operators' self time (on "
                      "CUDA: of the GPU's busy time)." + _gpu_busy_line(report) + " Full tables and traces: "
                      + ", ".join(e["profile"]["table"] for e in report["entries"] if e.get("profile")))


def _gpu_busy_line(report: dict) -> str:
    """' GPU busy X of Y ms per profiled update (entry)' for the entries profiled on CUDA."""
    parts = [f"{e['name']}: {p['device_busy_ms_per_update']:,.1f} of {p['step_ms_per_update']:,.1f} ms"
             for e in report["entries"] if (p := e.get("profile") or {}).get("step_ms_per_update")]
    return (" GPU busy per profiled update (profiler overhead included in the span): "
            + "; ".join(parts) + ".") if parts else ""


PROFILE_ROWS = 5  # operators per profiled entry in the printed and Markdown tables


def _profile_rows(report: dict) -> list[tuple[str, ...]]:
    rows = []
    for e in report["entries"]:
        for op in ((e.get("profile") or {}).get("top") or [])[:PROFILE_ROWS]:
            rows.append((e["name"], op["name"], f"{op['self_ms_per_update']:,.2f}",
                         _pct(op["share"]), f"{op['calls_per_update']:,.0f}"))
    return rows


def markdown_tables(report: dict) -> str:
    """The report's tables as Markdown (written next to the JSON, for docs/performance.md)."""
    peak, m = report["peak"], report["machine"]
    lines = [f"Machine: {m['device_name']}, {m['cpus']} CPUs, {m['threads']} threads, torch {m['torch']}; "
             f"peak {peak['gflops']:,.0f} GFLOP/s {peak['dtype']} ({peak['source']}); load average "
             f"{m['loadavg_start'][0]:.2f} at the start, {m.get('loadavg_end', [float('nan')])[0]:.2f} at the end. "
             f"Command: `{' '.join(report['command'])}`.", ""]
    entries = [e for e in report["entries"] if e["group"] == "preset" and e["status"] != "failed"]
    if entries:
        lines += ["| preset | model | tok/s median (min-max) | tok/CPU-s | ms/update | tok/update | peak MB "
                  "| padding | MFU | beam5 sent/s | greedy sent/s | other load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for e in entries:
            mfu = e["tokens_per_s"] * e["flops_per_target_token"] / 1e9 / peak["gflops"]
            lines.append(
                f"| {e['name']} | {e['model']} {e['precision']} | {e['tokens_per_s']:,.0f} "
                f"({e['tokens_per_s_min']:,.0f}-{e['tokens_per_s_max']:,.0f}) | {e['tokens_per_cpu_s']:,.0f} "
                f"| {e['ms_per_update']:,.0f} | {e['tokens_per_update']:,.0f} | {e['peak_memory_mb']:,.0f} "
                f"| {100 * e['padding_fraction']:.1f}% | {100 * mfu:.1f}% "
                f"| {_fmt((e.get('beam5') or {}).get('sentences_per_s'), '.1f')} "
                f"| {_fmt((e.get('greedy') or {}).get('sentences_per_s'), '.1f')} "
                f"| {e['load_train']['other_cores']:.2f} |")
        lines.append("")
    depth = [e for e in report["entries"] if e["group"] == "depth" and e["status"] != "failed"]
    if depth:
        lines += ["| layers | checkpointing | ms/update | ms/update/layer | peak MB | loss | other load |",
                  "|---|---|---|---|---|---|---|"]
        for e in depth:
            lines.append(f"| {e['layers']}+{e['layers']} | {'yes' if e['checkpointing'] else 'no'} "
                         f"| {e['ms_per_update']:,.0f} | {e['ms_per_update'] / (2 * e['layers']):.2f} "
                         f"| {e['peak_memory_mb']:,.0f} | {_fmt(e['train_loss'], '.3f')} "
                         f"| {e['load_train']['other_cores']:.2f} |")
        lines.append("")
    for name, row in (report.get("peer") or {}).items():
        lines += [f"{name} (fairseq config `{row['peer_config']}`), medians of alternating runs:", "",
                  "| measure | deepinit | fairseq | ratio | target | deepinit runs | fairseq runs |",
                  "|---|---|---|---|---|---|---|"]
        for key, label in (("tokens_per_s", "train tok/s"), ("beam5_sentences_per_s", "beam-5 sent/s"),
                           ("greedy_sentences_per_s", "greedy sent/s")):
            r = row[key]
            lines.append(f"| {label} | {_fmt(r['deepinit'], ',.1f')} | {_fmt(r['fairseq'], ',.1f')} "
                         f"| {_fmt(r['ratio'], '.2f')} | {_fmt(r['target'], '.1f')} "
                         f"| {', '.join(_fmt(v, ',.1f') for v in r['deepinit_runs'])} "
                         f"| {', '.join(_fmt(v, ',.1f') for v in r['fairseq_runs'])} |")
        for key in ("beam5", "greedy"):
            lengths = row.get(f"{key}_output_tokens_per_sentence") or {}
            if lengths.get("deepinit") or lengths.get("fairseq"):
                lines.append(f"| {key} output tok/sentence | {_fmt(lengths.get('deepinit'), '.1f')} "
                             f"| {_fmt(lengths.get('fairseq'), '.1f')} | | | | |")
        if row.get("mfu"):
            lines.append(f"| MFU | {_fmt(100 * (row['mfu']['deepinit'] or 0), '.1f')}% "
                         f"| {_fmt(100 * (row['mfu']['fairseq'] or 0), '.1f')}% | | | | |")
        loads = [r["load_train"]["other_cores"] for r in row["deepinit_runs"] if r.get("load_train")]
        peer_loads = [r["load"]["other_cores"] for r in row["fairseq_runs"] if r.get("load")]
        lines += ["", f"Other processes' load (cores): deepinit runs {', '.join(f'{x:.2f}' for x in loads)}; "
                      f"fairseq runs {', '.join(f'{x:.2f}' for x in peer_loads)}.", ""]
    reference = report.get("reference") or {}
    if reference:
        reps = max(len(row["reference_runs"]) for row in reference.values())
        lines += [f"deepinit against plain PyTorch (`torch.nn.Transformer`, runner/bench/reference.py) on the "
                  f"same batches, medians of {reps} alternating runs per side; ratio = deepinit / PyTorch "
                  f"tok/s, target {REFERENCE_TARGET}:", "",
                  "| preset | model | deepinit tok/s | PyTorch tok/s | ratio | target | deepinit MFU | PyTorch MFU "
                  "| deepinit peak MB | PyTorch peak MB | deepinit runs tok/s | PyTorch runs tok/s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, row in reference.items():
            r, mfu, mem = row["tokens_per_s"], row.get("mfu") or {}, row["peak_memory_mb"]
            lines.append(f"| {name} | {_reference_model(row)} | {_fmt(r['deepinit'], ',.0f')} "
                         f"| {_fmt(r['reference'], ',.0f')} | {_fmt(r['ratio'], '.2f')} | {r['target']:.1f} "
                         f"| {_pct(mfu.get('deepinit'))} | {_pct(mfu.get('reference'))} "
                         f"| {_fmt(mem['deepinit'], ',.0f')} | {_fmt(mem['reference'], ',.0f')} "
                         f"| {', '.join(_fmt(v, ',.0f') for v in r['deepinit_runs'])} "
                         f"| {', '.join(_fmt(v, ',.0f') for v in r['reference_runs'])} |")
        lines.append("")
    profiled = _profile_rows(report)
    if profiled:
        lines += ["| entry | operator (torch.profiler) | self ms/update | share | calls/update |",
                  "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in profiled]
        lines.append("")
    return "\n".join(lines)


def machine_info(device: str, threads: int) -> dict:
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    name = torch.cuda.get_device_name() if cuda else (cpu_name() or platform.machine())
    return {"device": "cuda" if cuda else "cpu", "device_name": name, "torch": torch.__version__,
            "cpus": os.cpu_count(), "threads": threads or torch.get_num_threads(),
            "hostname": platform.node(), "python": platform.python_version(),
            "loadavg_start": os.getloadavg()}


# ----------------------------------------------------------------------------- main
def resolve_args(args, cuda: bool) -> Optional[str]:
    """Fill in the defaults that depend on the device (presets, compile) and move key=value
    words from --presets to the overrides; an error message, or None."""
    if args.peer and (args.reference or args.compile == "both"):
        return "--peer is its own comparison: leave out --reference and --compile both"
    if args.profile < 0:
        return f"--profile expects a number of updates >= 0, got {args.profile}"
    if args.profile and (args.peer or args.reference):
        return "--profile profiles a plain bench run: leave out --peer and --reference"
    # --compile both: preset_entries makes each entry's two settings
    args.compile_on = args.compile == "on" or (args.compile == "auto" and cuda)
    if args.presets:  # "--presets tiny key=value": argparse gives the override to --presets
        args.override += [p for p in args.presets if "=" in p]
        args.presets = [p for p in args.presets if "=" not in p]
    if args.presets is None:
        args.presets = ["ci"] if args.quick else ["tiny", "small", "ci"] + (["base"] if cuda else [])
    unknown = [p for p in args.presets if p not in PRESETS]
    if unknown:
        return f"unknown preset(s) {', '.join(unknown)}; expected {', '.join(PRESETS)}"
    if args.quick and args.depths == [6, 50, 100, 200]:
        args.depths = [2]
    return None


def plan_entries(args) -> list[Entry]:
    """The entries of a `deepinit bench` call (not --peer), in order: presets, then depths."""
    plan = [entry for name in args.presets for entry in preset_entries(name, args)]
    # --quick: checkpointing only (the path with more to go wrong)
    plan += [depth_entry(layers, ckpt, args) for layers in args.depths
             for ckpt in ((True,) if args.quick else (False, True))]
    return plan


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
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_path = args.out or Path("outputs/bench") / f"bench{'-peer' if args.peer else ''}-{stamp}.json"
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)

    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict[str, Any] = {"command": ["deepinit", "bench", *argv], "time": stamp,
                              "machine": machine_info(args.device, args.threads), "entries": []}
    with LoadProbe() as probe:
        report["peak"] = (cuda_bf16_peak(torch.cuda.get_device_name()) if cuda
                          else cpu_matmul_peak(args.threads))
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
        result = run_isolated(entry, work, compose)
        if result["status"] == "failed":
            console.print(f"[red]{entry.name} failed[/]:\n{result['error']}")
        report["entries"].append(result)
        write_report(out_path, report)


def write_report(out_path: Path, report: dict) -> None:
    """The JSON and its Markdown tables beside it."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(out_path, report, indent=1)
    out_path.with_suffix(".md").write_text(markdown_tables(report) + "\n")
