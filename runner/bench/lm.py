"""The task=lm entry of `deepinit bench`: deepinit's LM training step (runner/train/lm_loop.py) and,
with --reference, a plain nanoGPT-style GPT written in PyTorch for this benchmark, of the same
shape, on the same blocks, with the same optimizer, schedule and clipping.

The reference is what a PyTorch user would write for the preset's model (karpathy/nanoGPT
model.py's structure, written anew): token and learned position embeddings, Pre-LN blocks of
causal self-attention (one fused q/k/v projection, `F.scaled_dot_product_attention` with
is_causal) and a GELU MLP of 4x the width, a final LayerNorm, the output projection tied to the
token table, `F.cross_entropy` on the logits, and fused AdamW. It reads deepinit's blocks
(runner/data/lm.py training_batch), so both sides train on exactly the same tokens.
"""
from __future__ import annotations

import math
import resource
import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from runner.bench.entries import Entry, entry_schedule, uses_cuda
from runner.bench.machine import LoadProbe, rss_mb
from runner.bench.profile import OperatorProfile
from runner.config import Config
from runner.data import build_lm_data
from runner.data.corpus import CorpusError
from runner.data.lm import shakespeare_file, text_files, training_batch
from runner.model.flops import lm_train_flops
from runner.run.build import build_run, check_config, resolve_device
from runner.train.lm_loop import LMTrainer
from runner.train.loop import Callback
from runner.train.optim import set_lr
from runner.train.schedule import lr_at


# ----------------------------------------------------------------------------- the reference GPT
class Block(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)): a Pre-LN GPT block."""

    def __init__(self, dim: int, heads: int, ffn: int, eps: float):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.fc = nn.Linear(dim, ffn)
        self.out = nn.Linear(ffn, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ReferenceGPT(nn.Module):
    """A decoder-only GPT: (B, T) token ids -> (B, T, V) next-token logits."""

    def __init__(self, vocab: int, block: int, dim: int, heads: int, ffn: int, layers: int, eps: float):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(block, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ffn, eps) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=eps)
        for name, p in self.named_parameters():  # GPT-2's init, as nanoGPT's
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tokens.weight)  # tied output projection


def unsupported(cfg: Config) -> list[str]:
    """The settings the reference GPT cannot express (it would train a different model)."""
    m, n, problems = cfg.model, cfg.norm, []
    if n.placement != "pre" or n.kind != "layernorm" or n.final_norm is False:
        problems.append("norm=pre with LayerNorm and its final norm only")
    if n.embedding_norm or n.layernorm_scaling or m.qk_norm != "none" or m.sigma_reparam or m.fixnorm:
        problems.append("norm.embedding_norm / layernorm_scaling / model.qk_norm / sigma_reparam / fixnorm")
    if m.positions != "learned" or m.embed_scale or m.embed_scale_learned or m.share_embeddings == "none":
        problems.append("model.positions=learned, embed_scale=false (fixed or learned) and a tied output only")
    if m.activation != "gelu" or m.dropout or m.attention_dropout or m.activation_dropout:
        problems.append("model.activation=gelu and no dropout only")
    if m.attention != "standard" or m.parameterization != "standard" or m.activation_checkpointing:
        problems.append("model.attention / parameterization / activation_checkpointing")
    if cfg.optim.name != "adam" or cfg.trainer.update_freq != 1 or cfg.trainer.label_smoothing:
        problems.append("optim=adam, trainer.update_freq=1, no label smoothing only")
    return problems


def corpus_problem(cfg: Config) -> Optional[str]:
    """The one-line error of a task=lm entry whose corpus is not there (checked before any entry
    runs, so that a missing tinyshakespeare is not a failed entry's traceback), or None."""
    try:
        if cfg.data.name == "shakespeare_char":
            shakespeare_file(cfg.data.dir)
        elif cfg.data.name == "text":
            text_files(cfg.data.dir)
    except CorpusError as exc:
        return str(exc)
    return None


# ----------------------------------------------------------------------------- timing
class StepClock(Callback):
    """perf_counter and process CPU time after every update (the Trainer's on_step_end), after a
    device sync on CUDA."""

    def __init__(self, cuda: bool = False):
        self.cuda = cuda
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def mark(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def on_step_end(self, trainer, out) -> None:
        self.mark()


def windows_of(clock: StepClock, warmup: int, steps: int, windows: int, tokens_per_update: int) -> list[dict]:
    """The timed windows from marks after each update: window w spans updates
    (warmup + w*steps, warmup + (w+1)*steps]; mark i is after update i+1."""
    out = []
    for w in range(windows):
        first, last = warmup + w * steps - 1, warmup + (w + 1) * steps - 1
        seconds, cpu = clock.wall[last] - clock.wall[first], clock.cpu[last] - clock.cpu[first]
        tokens = tokens_per_update * steps
        out.append({"updates": steps, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                    "ms_per_update": 1e3 * seconds / steps, "cpu_seconds": cpu,
                    "tokens_per_cpu_s": tokens / max(cpu, 1e-9)})
    return out


def figures(entry: Entry, cfg: Config, windows: list[dict], vocab: int) -> dict:
    m, d = cfg.model, cfg.data
    tps = [w["tokens_per_s"] for w in windows]
    lengths = np.full(d.batch_size, d.block_size)
    return {
        **{k: v for k, v in asdict(entry).items() if k not in ("overrides", "extra", "decode", "windows")},
        "model": f"{m.dim}-{m.ffn_dim}-{m.heads}, {m.num_decoder_layers} layers decoder-only",
        "tokens_per_s": statistics.median(tps), "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
        "tokens_per_cpu_s": statistics.median(w["tokens_per_cpu_s"] for w in windows),
        "ms_per_update": statistics.median(w["ms_per_update"] for w in windows),
        "tokens_per_update": float(d.batch_size * d.block_size), "padding_fraction": 0.0,
        "flops_per_target_token": lm_train_flops(m.dim, m.ffn_dim, m.num_decoder_layers, vocab, lengths)
        / float(lengths.sum()),
        "src_vocab": vocab, "tgt_vocab": vocab, "threads": torch.get_num_threads(), "windows": windows,
    }


def peak_memory(cuda: bool) -> tuple[float, str]:
    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2 ** 20, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "max_rss"  # KiB on Linux


def run_lm_entry(entry: Entry, cfg: Config, overrides: list[str]) -> dict:
    """deepinit's task=lm train loop (LMTrainer) for warm-up + timed updates."""
    if entry.threads:
        torch.set_num_threads(entry.threads)
    cuda = uses_cuda(entry)
    _, warmup, updates = entry_schedule(entry)
    rss_start = rss_mb()
    parts = build_run(cfg)
    clock = StepClock(cuda)
    profiler = (OperatorProfile(updates, entry.profile, Path(entry.profile_stem), cuda) if entry.profile else None)
    trainer = LMTrainer(parts, [clock] + ([profiler] if profiler else []))
    with LoadProbe() as probe, profiler or nullcontext():
        outcome = trainer.run()
    peak, kind = peak_memory(cuda)
    windows = windows_of(clock, warmup, entry.steps, entry.windows, cfg.data.batch_size * cfg.data.block_size)
    out: dict[str, Any] = {
        **figures(entry, cfg, windows, len(parts.data)), "overrides": overrides,
        "parameters": parts.parameters,
        "trainable_parameters": sum(p.numel() for p in parts.model.parameters() if p.requires_grad),
        "status": outcome.status, "train_loss": trainer.state.last_train_loss,
        "device": str(parts.device), "precision": parts.precision, "peak_memory_mb": peak,
        "memory_kind": kind, "rss_before_trainer_mb": rss_start, "load_train": probe.as_dict()}
    if profiler is not None:
        out["profile"] = profiler.summary
    return out


def train_reference_gpt(cfg: Config, warmup: int, steps: int, windows: int) -> dict:
    """The reference GPT for warm-up + timed updates on the blocks deepinit's update u reads."""
    t, d, m, o = cfg.trainer, cfg.data, cfg.model, cfg.optim
    check_config(cfg)  # the rules deepinit's side builds under
    problems = unsupported(cfg)
    if problems:
        raise ValueError("the plain-PyTorch GPT reference does not support " + "; ".join(problems))
    device = resolve_device(t.device)
    data = build_lm_data(d)
    train = data.splits[d.train_split]
    torch.manual_seed(t.seed)
    model = ReferenceGPT(len(data), m.max_positions, m.dim, m.heads, m.ffn_dim, m.num_decoder_layers,
                         cfg.norm.eps).to(device)
    # deepinit's rule for fused kernels (runner/train/optim.py), so both sides run the same AdamW
    fused = device.type in ("cuda", "cpu") if o.fused is None else o.fused
    optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                  weight_decay=o.weight_decay, fused=fused or None)
    forward = torch.compile(model) if t.compile else model
    amp = {"bf16": torch.bfloat16}.get(t.precision if t.precision != "auto" else
                                       ("bf16" if device.type == "cuda" else "fp32"))
    clock = StepClock(device.type == "cuda")
    model.train()
    last_loss = torch.zeros((), device=device)
    for step in range(warmup + steps * windows):
        set_lr(optimizer, lr_at(step, cfg))
        x, y = training_batch(train, d.block_size, d.batch_size, t.seed, step)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            logits = forward(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if o.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        last_loss = loss.detach()
        clock.mark()
    return {"clock": clock, "train_loss": float(last_loss), "vocab": len(data), "device": str(device),
            "precision": "bf16" if amp is not None else "fp32",
            "parameters": sum(p.numel() for p in model.parameters())}


def run_lm_reference_entry(entry: Entry, cfg: Config, overrides: list[str]) -> dict:
    """The entry's step in the plain-PyTorch GPT, reported with run_lm_entry's keys."""
    if entry.threads:
        torch.set_num_threads(entry.threads)
    _, warmup, _ = entry_schedule(entry)
    rss_start = rss_mb()
    with LoadProbe() as probe:
        run = train_reference_gpt(cfg, warmup, entry.steps, entry.windows)
    peak, kind = peak_memory(uses_cuda(entry))
    windows = windows_of(run["clock"], warmup, entry.steps, entry.windows,
                         cfg.data.batch_size * cfg.data.block_size)
    return {
        **figures(entry, cfg, windows, run["vocab"]), "kind": "reference", "overrides": overrides,
        "parameters": run["parameters"], "trainable_parameters": run["parameters"],
        "status": "ok" if math.isfinite(run["train_loss"]) else "diverged", "train_loss": run["train_loss"],
        "device": run["device"], "precision": run["precision"], "peak_memory_mb": peak, "memory_kind": kind,
        "rss_before_trainer_mb": rss_start, "load_train": probe.as_dict()}
