"""The plain-PyTorch reference of deepinit's training step, for `deepinit bench --reference`.

The same model shape, recipe, precision and batches as a bench entry, written the way a PyTorch
user would write it: `torch.nn.Transformer` (batch-first, Post-LN or Pre-LN), token embeddings
scaled by sqrt(dim) with fixed sinusoidal positions, the output projection tied to the target
embedding, `F.cross_entropy` with label smoothing on float32 logits over the padded batch, and
fused AdamW. None of deepinit's model, attention kernels, loss or unpadded training is used;
only its data pipeline (`build_run`), so that both sides train on exactly the same batches in
the same order.
"""
from __future__ import annotations

import gc
import math
import resource
import time
import warnings
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from runner.config import Config
from runner.data.batching import Batch
from runner.data.dataset import TokenizedSplit
from runner.run.build import RunParts, build_run
from runner.train.loop import DataPosition, batch_stream, next_update
from runner.train.optim import set_lr
from runner.train.schedule import lr_at


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """(num_positions, dim): sines in the first half, cosines in the second, over geometric
    frequencies (fairseq's SinusoidalPositionalEmbedding.get_embedding layout)."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(num_positions, dtype=torch.float32)[:, None] * freq[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(num_positions, 1)], dim=1)
    return table


def unsupported(cfg: Config) -> list[str]:
    """The config settings the reference cannot express (it would train a different model)."""
    m, n = cfg.model, cfg.norm
    problems = []
    if n.placement not in ("post", "pre"):
        problems.append(f"norm.placement={n.placement} (post or pre only)")
    for side in ("encoder_placement", "decoder_placement"):
        if getattr(n, side) not in (None, n.placement):
            problems.append(f"norm.{side}={getattr(n, side)} (one placement for both stacks)")
    if n.kind != "layernorm":
        problems.append(f"norm.kind={n.kind} (layernorm only)")
    if n.embedding_norm or n.layernorm_scaling:
        problems.append("norm.embedding_norm / norm.layernorm_scaling")
    if m.qk_norm != "none" or m.sigma_reparam or m.fixnorm or m.attention != "standard":
        problems.append("model.qk_norm / sigma_reparam / fixnorm / attention=t5")
    if m.embed_scale_learned:
        problems.append("model.embed_scale_learned")
    if m.parameterization != "standard" or m.activation_checkpointing:
        problems.append("model.parameterization=ntk / activation_checkpointing")
    if cfg.optim.name != "adam":
        problems.append(f"optim={cfg.optim.name} (adam only)")
    return problems


class ReferenceSeq2Seq(nn.Module):
    """An encoder-decoder on `torch.nn.Transformer`: logits (B, T, V) of right-padded batches."""

    def __init__(self, cfg: Config, src_vocab: int, tgt_vocab: int, pad: int):
        super().__init__()
        problems = unsupported(cfg)
        if problems:
            raise ValueError("the plain-PyTorch reference does not support " + "; ".join(problems))
        m, n = cfg.model, cfg.norm
        self.pad, self.dim = pad, m.dim
        self.scale = math.sqrt(m.dim) if m.embed_scale else 1.0
        pre = n.placement == "pre"
        with warnings.catch_warnings():
            # Pre-LN: torch warns that its inference-only nested-tensor fast path is off
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.transformer = nn.Transformer(
                d_model=m.dim, nhead=m.heads, num_encoder_layers=m.num_encoder_layers,
                num_decoder_layers=m.num_decoder_layers, dim_feedforward=m.ffn_dim,
                dropout=m.dropout, activation=m.activation, layer_norm_eps=n.eps,
                batch_first=True, norm_first=pre)
        # nn.Transformer's `dropout` is every dropout; the recipe's attention and activation
        # dropouts differ from the residual one (fairseq --attention-dropout, --activation-dropout)
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.dropout.p = m.activation_dropout  # between the two FFN matmuls
            for attn in (getattr(layer, "self_attn", None), getattr(layer, "multihead_attn", None)):
                if attn is not None:
                    attn.dropout = m.attention_dropout
        # nn.Transformer always ends each stack with a LayerNorm; Post-LN has none (fairseq,
        # deepinit's norm.final_norm default: on for pre, off for post)
        if not (pre if n.final_norm is None else n.final_norm):
            self.transformer.encoder.norm = None
            self.transformer.decoder.norm = None
        self.src_embed = nn.Embedding(src_vocab, m.dim, padding_idx=pad)
        if m.share_embeddings == "all":
            if src_vocab != tgt_vocab:
                raise ValueError("share_embeddings=all needs one joined vocabulary")
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(tgt_vocab, m.dim, padding_idx=pad)
        # tied to the target embedding unless share_embeddings=none
        self.output = (nn.Parameter(torch.empty(tgt_vocab, m.dim))
                       if m.share_embeddings == "none" else None)
        for weight in (self.src_embed.weight, self.tgt_embed.weight, self.output):
            if weight is not None:  # fairseq's Embedding init: N(0, dim^-1/2), zero padding row
                nn.init.normal_(weight, 0.0, m.dim ** -0.5)
        with torch.no_grad():
            self.src_embed.weight[pad].zero_()
            self.tgt_embed.weight[pad].zero_()
        self.embed_dropout = nn.Dropout(m.dropout)
        self.register_buffer("positions", sinusoidal_positions(m.max_positions, m.dim), persistent=False)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.tgt_embed.weight if self.output is None else self.output

    def embed(self, table: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        x = table(tokens) * self.scale + self.positions[:tokens.shape[1]]
        return self.embed_dropout(x)

    def forward(self, src_tokens: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        src_pad = src_tokens.eq(self.pad)
        tgt_pad = prev_tokens.eq(self.pad)
        t = prev_tokens.shape[1]
        # boolean like the padding masks (True = may not attend), so torch merges them as is
        causal = torch.ones(t, t, dtype=torch.bool, device=prev_tokens.device).triu_(1)
        h = self.transformer(self.embed(self.src_embed, src_tokens), self.embed(self.tgt_embed, prev_tokens),
                             tgt_mask=causal, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                             memory_key_padding_mask=src_pad, tgt_is_causal=True)
        return F.linear(h, self.output_weight)


def reference_loss(logits: torch.Tensor, target: torch.Tensor, pad: int, label_smoothing: float) -> torch.Tensor:
    """Label-smoothed cross entropy summed over the real target tokens, on float32 logits.
    torch's smoothing, (1 - eps) NLL + eps/V sum_v -log p_v, is the form deepinit trains with
    (runner/model/loss.py)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=pad, label_smoothing=label_smoothing, reduction="sum")


def update_batches(parts: RunParts) -> Iterator[tuple[list[np.ndarray], list[Batch], int]]:
    """deepinit's updates in deepinit's order, one process (the Trainer's `next_update`): for
    every update, its micro-batches' sentence indices, the collated batches on the device, and
    the update's target tokens."""
    cfg = parts.cfg
    stream = batch_stream(parts.batches, cfg.trainer.seed, DataPosition())
    while True:
        yield next_update(stream, parts.train_split, cfg.trainer.update_freq, 1, 0, parts.pad, parts.eos,
                          parts.device)


@dataclass
class ReferenceRun:
    """What the timed reference run saw: batches, clock marks, memory; bench turns it into the
    same figures as a deepinit entry."""

    split: TokenizedSplit
    taken: list[list[np.ndarray]]  # per update, its micro-batches' sentence indices
    wall: list[float]  # perf_counter after the warm-up and after every timed window
    cpu: list[float]  # process CPU time at the same marks
    train_loss: Optional[float]  # label-smoothed loss per target token, last window
    peak_memory_mb: float
    memory_kind: str
    parameters: int
    device: str
    precision: str
    src_vocab: int
    tgt_vocab: int


def _drop_deepinit(parts: RunParts) -> None:
    """Free deepinit's model and optimizer: only its data pipeline is used."""
    parts.model = parts.forward = parts.optimizer = None
    gc.collect()
    if parts.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def train_reference(cfg: Config, warmup: int, steps: int, windows: int) -> ReferenceRun:
    """Train the reference for `warmup` untimed then `windows` x `steps` timed updates on
    deepinit's batches for `cfg`, marking the clock (after a device sync) at window bounds."""
    parts = build_run(cfg, keep_host_memory=False)  # plain PyTorch keeps glibc's defaults
    if parts.world > 1:
        raise ValueError("the reference runs in one process")
    _drop_deepinit(parts)
    device, t = parts.device, cfg.trainer
    cuda = device.type == "cuda"
    torch.manual_seed(t.seed)
    model = ReferenceSeq2Seq(cfg, len(parts.data.src_dict), len(parts.data.tgt_dict), parts.pad).to(device)
    o = cfg.optim
    # fairseq's adam decays decoupled, i.e. AdamW (runner/train/optim.py); fused kernels under
    # the rule deepinit applies (optim.fused null: fused on CUDA and CPU), so that both sides
    # run the same optimizer kernels and the comparison is of the model step
    fused = device.type in ("cuda", "cpu") if o.fused is None else o.fused
    optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                  weight_decay=o.weight_decay, fused=fused or None)
    forward = torch.compile(model) if t.compile else model
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(parts.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=parts.precision == "fp16")
    params = [p for p in model.parameters() if p.requires_grad]

    def sync():
        if cuda:
            torch.cuda.synchronize()

    model.train()
    stream = update_batches(parts)
    taken: list[list[np.ndarray]] = []
    wall, cpu = [], []
    window_loss, window_tokens = torch.zeros((), device=device), 0
    last_window = None  # (loss sum, target tokens) of the last timed window
    for step in range(warmup + steps * windows):
        if step == warmup:
            sync()
            wall.append(time.perf_counter()); cpu.append(time.process_time())
            window_loss, window_tokens = torch.zeros((), device=device), 0
        set_lr(optimizer, lr_at(step, cfg))
        group, batches, ntokens = next(stream)
        taken.append(group)
        for batch in batches:
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                logits = forward(batch.src_tokens, batch.prev_tokens)
            loss = reference_loss(logits, batch.target, parts.pad, t.label_smoothing)
            scaler.scale(loss / ntokens).backward()
            window_loss += loss.detach()
        if o.clip_norm > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, o.clip_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        window_tokens += ntokens
        done = step + 1 - warmup
        if done > 0 and done % steps == 0:
            sync()
            wall.append(time.perf_counter()); cpu.append(time.process_time())
            # the loss is read after the run: no host sync inside the timed windows
            last_window = (window_loss, window_tokens)
            window_loss, window_tokens = torch.zeros((), device=device), 0
    train_loss = float(last_window[0]) / max(last_window[1], 1) if last_window else None
    if cuda:
        sync()
        peak, kind = torch.cuda.max_memory_allocated() / 2 ** 20, "cuda_max_allocated"
    else:  # Linux reports ru_maxrss in KiB
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "max_rss"
    return ReferenceRun(
        split=parts.train_split, taken=taken, wall=wall, cpu=cpu, train_loss=train_loss,
        peak_memory_mb=peak, memory_kind=kind, parameters=sum(p.numel() for p in model.parameters()),
        device=str(device), precision=parts.precision, src_vocab=len(parts.data.src_dict),
        tgt_vocab=len(parts.data.tgt_dict))
