"""What `deepinit bench` measures: the fairseq recipe, the model presets and their schedules, and
the entries (one measurement each, run in its own process by runner/bench/workers.py) of a call."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import torch

from runner.bench.corpus import write_corpus

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
# task=lm presets: name -> overrides. lm-nanogpt-cpu is the preset of nanoGPT's CPU run
# (sweeps/lm_nanogpt_cpu.yaml: 4 layers, 128 wide, 4 heads, block 64, batch 12, Pre-LN) on
# data=shakespeare_char; with --reference its plain-PyTorch side is a hand-written GPT
# (runner/bench/lm.py).
LM_PRESETS: dict[str, list[str]] = {"lm-nanogpt-cpu": ["+sweep=lm_nanogpt_cpu"]}
# The peer's two configurations (peer_train_bench.sh `config`): deepinit name -> peer name.
PEER_CONFIGS = {"small": "iwslt", "tiny-peer": "tiny"}
PRESETS["tiny-peer"] = (["model=tiny", "model.dim=128", "model.ffn_dim=256", "model.heads=4",
                         "model.layers=2"], 1000, 2048)
# Updates: warm-up, per timed window, windows. The peer's runs: iwslt 3 + 15, tiny 20 + 150.
SCHEDULE = {"small": (3, 5, 3), "base": (30, 20, 3), "big": (30, 20, 3), "base-18": (30, 20, 3),
            "tiny-peer": (20, 50, 3), "lm-nanogpt-cpu": (25, 25, 4)}
PEER_SCHEDULE = {"small": (3, 15, 1), "tiny-peer": (20, 150, 1)}
DEFAULT_SCHEDULE = (10, 20, 3)
# On CUDA an update takes milliseconds and the first ones meet new batch shapes (kernel choice and
# loading, the allocator growing), so the CPU's short schedules time start-up: `small` with 5 warm-up
# updates and windows of 5 measured 372-756 ms/update on an H200. A 6,000-update table2 cell of the
# same model on the same machine took 45 s for its first 100 updates and 34 ms an update after its
# 500th (results/performance/gpu-h200-2026-11-28). On CUDA every preset entry warms up at least
# this many updates and times windows at least this long.
CUDA_MIN_WARMUP, CUDA_MIN_STEPS = 100, 20
# The peer's fairseq-generate call: --max-tokens 4096 --batch-size 128 (peer_train_bench.sh)
PEER_DECODE_MAX_TOKENS, PEER_DECODE_BATCH_SIZE = 4096, 128


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
    task: str = "translation"  # or "lm": runner/bench/lm.py times it


def preset_entry(name: str, args, peer: bool = False) -> Entry:
    if name in LM_PRESETS:
        model, vocab, max_tokens = LM_PRESETS[name], None, 0
    else:
        model, vocab, max_tokens = PRESETS[name]
    warmup, steps, windows = (PEER_SCHEDULE if peer else SCHEDULE).get(name, DEFAULT_SCHEDULE)
    if args.quick:
        warmup, steps, windows = 2, 2, 2
    elif uses_cuda_device(args.device):
        warmup, steps = max(warmup, CUDA_MIN_WARMUP), max(steps, CUDA_MIN_STEPS)
    if args.warmup is not None:
        warmup = args.warmup
    if args.steps is not None:
        steps = args.steps
    if args.windows is not None:
        windows = args.windows
    lm = name in LM_PRESETS
    return Entry(name, "peer" if peer else "preset", (model if lm else RECIPE + model) + list(args.override),
                 vocab, max_tokens, warmup, steps, windows,
                 decode=0 if args.no_decode or lm else args.decode_sentences,
                 threads=args.threads, device=args.device, compile=args.compile_on,
                 profile=getattr(args, "profile", 0), task="lm" if lm else "translation")


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
    # the depth's own settings come after the user's overrides: a `model.layers=12` meant for the
    # presets must not turn the 200+200 entry into a 12+12 one that the table calls 200+200
    return Entry(f"depth-{layers}{'-ckpt' if checkpointing else ''}", "depth",
                 RECIPE + list(args.override) + model, 1000, args.depth_max_tokens, warmup,
                 steps, 1, threads=args.threads, device=args.device, layers=layers,
                 checkpointing=checkpointing, profile=getattr(args, "profile", 0))


def resolve_args(args, cuda: bool) -> Optional[str]:
    """Fill in the defaults that depend on the device (presets, compile) and move key=value
    words from --presets and --depths to the overrides; an error message, or None."""
    if args.peer and (args.reference or args.compile == "both"):
        return "--peer is its own comparison: leave out --reference and --compile both"
    if args.profile < 0:
        return f"--profile expects a number of updates >= 0, got {args.profile}"
    if args.peak_gflops is not None and not (math.isfinite(args.peak_gflops) and args.peak_gflops > 0):
        return f"--peak-gflops expects GFLOP/s > 0, got {args.peak_gflops}"
    if args.profile and (args.peer or args.reference):
        return "--profile profiles a plain bench run: leave out --peer and --reference"
    # --compile both: preset_entries makes each entry's two settings
    args.compile_on = args.compile == "on" or (args.compile == "auto" and cuda)
    if args.presets:  # "--presets tiny key=value": argparse gives the override to --presets
        args.override += [p for p in args.presets if "=" in p]
        args.presets = [p for p in args.presets if "=" not in p]
    words = [str(d) for d in args.depths if "=" not in str(d)]
    args.override += [str(d) for d in args.depths if "=" in str(d)]
    if not all(d.isdigit() and int(d) >= 1 for d in words):
        return f"--depths expects layer counts (whole numbers >= 1), got {' '.join(words)}"
    args.depths = [int(d) for d in words]
    if args.presets is None:
        args.presets = ["ci"] if args.quick else ["tiny", "small", "ci"] + (["base"] if cuda else [])
    unknown = [p for p in args.presets if p not in PRESETS and p not in LM_PRESETS]
    if unknown:
        return f"unknown preset(s) {', '.join(unknown)}; expected {', '.join([*PRESETS, *LM_PRESETS])}"
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


def uses_cuda_device(device: str) -> bool:
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def uses_cuda(entry: Entry) -> bool:
    return uses_cuda_device(entry.device)


def entry_schedule(entry: Entry) -> tuple[int, int, int]:
    """(log interval, untimed warm-up updates, warm-up + timed updates)."""
    # CPU: a record per update (no cost without a device to sync); CUDA: one per window, so
    # the only host syncs are the trainer's own logging steps. task=lm times each update itself
    # (runner/bench/lm.py) and logs once per window, as its preset logs every 50 updates.
    log_interval = entry.steps if uses_cuda(entry) or entry.task == "lm" else 1
    warmup = -(-entry.warmup // log_interval) * log_interval
    return log_interval, warmup, warmup + entry.steps * entry.windows


def entry_overrides(entry: Entry, work: Path) -> list[str]:
    """The config overrides of one entry (writes its corpus folder first)."""
    log_interval, _, updates = entry_schedule(entry)
    # one more untimed update: its batch request closes the last timed update's CPU time (and
    # it warms up the profiler, which then records entry.profile more)
    total_updates = updates + 1 + entry.profile
    run = [f"trainer.max_updates={total_updates}", f"trainer.log_interval={log_interval}",
           "trainer.valid_interval=0", "trainer.save_interval=0", "trainer.keep_checkpoints=0",
           "trainer.valid_max_batches=1", "trainer.tensorboard=false", "trainer.progress=false",
           "trainer.resume=false", f"trainer.device={entry.device}",
           f"trainer.compile={str(entry.compile).lower()}", f"trainer.threads={entry.threads}"]
    if uses_cuda(entry):
        # the divergence check reads the loss (a host sync): only on the window's last update,
        # so a timed window has one sync, as the reference's does
        run.append(f"trainer.divergence.check_interval={log_interval}")
    if entry.task == "lm":  # the preset's own corpus and schedule
        if not any(o.startswith("warmup") for o in entry.overrides):
            # the preset's 100 warm-up updates (sweeps/lm_nanogpt_cpu.yaml), fewer than the
            # updates run: the cosine schedule decays after them
            run.append(f"warmup.updates={min(100, total_updates - 1)}")
        return entry.overrides + run
    corpus = write_corpus(work / "data", entry.vocab)
    overrides = entry.overrides + [
        "data=custom", f"data.dir={corpus}", "data.bpe=none", f"data.cache_dir={work / 'cache'}",
        f"data.max_tokens={entry.max_tokens}", *run]
    if not any(o.startswith("warmup") for o in entry.overrides):
        overrides.append(f"warmup.updates={min(4000, total_updates)}")  # the recipe's 4000, capped
    return overrides

