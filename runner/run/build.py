"""The one place that builds a run from a config: validate, then data, model, init scheme,
optimizer and schedule, on the right device. Every verb (train, eval, analyze, bench,
reproduce) builds through here, so a model is never wired two ways."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from runner import init as init_schemes
from runner.config import Config, ConfigError, is_resolved, resolve_warmup, validate
from runner.console import log
from runner.data import build_data, build_lm_data
from runner.data import lm as lm_data
from runner.data.batching import Batch, collate, filter_by_length, make_batches
from runner.data.dataset import TokenizedSplit, TranslationData, unigram_nll
from runner.data.lm import LMData
from runner.model.lm import DecoderOnlyLM
from runner.model.seq2seq import Seq2Seq, build_model
from runner.model.sublayer import check_placement_options, mix_without_post_ln
from runner.run.allocator import keep_freed_memory
from runner.train.optim import build_optimizer


def resolve_config(cfg: Config) -> Optional[str]:
    """Fill in (in place) what the config leaves to the run: warmup=auto's warmup.updates, the
    init scheme's warmup (runner/config/resolve.py). Returns the line saying what the scheme
    chose, or None when nothing was left or the default applied."""
    if is_resolved(cfg):
        return None
    return resolve_warmup(cfg, init_schemes.get_scheme(cfg.init.name).warmup_updates)


def check_config(cfg: Config) -> None:
    """Every rule a config must satisfy before data loads: the field rules, the norm placements'
    options and the init scheme's requirements (both stacks' norm placements included). What the config leaves to
    the run is filled in first (`resolve_config`; the line saying what the scheme chose is
    logged)."""
    note = resolve_config(cfg)
    if note:
        log.info(note)
    validate(cfg)
    check_placement_options(cfg.norm)
    init_schemes.check_requirements(cfg)
    m = cfg.model
    stacks = ({"decoder": m.num_decoder_layers} if cfg.task == "lm"
              else {"encoder": m.num_encoder_layers, "decoder": m.num_decoder_layers})
    for line in mix_without_post_ln(cfg.norm, stacks):
        log.warning(line)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is visible: use trainer.device=cpu or auto")
    return torch.device(name)


def resolve_precision(name: str, device: torch.device) -> str:
    if name == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if name == "fp16" and device.type != "cuda":
        raise ConfigError("trainer.precision=fp16 needs CUDA: use bf16 or fp32 on CPU")
    return name


def model_for(cfg: Config, src_vocab: int, tgt_vocab: int, pad_index: int) -> Seq2Seq:
    """The model with the residual scales the init scheme trains (weights not yet initialized)."""
    return build_model(cfg, src_vocab, tgt_vocab, pad_index, init_schemes.residual_spec(cfg))


def lm_model_for(cfg: Config, vocab: int) -> DecoderOnlyLM:
    """task=lm's model with the residual scales the init scheme trains (weights not yet initialized)."""
    return DecoderOnlyLM(cfg.model, cfg.norm, vocab, init_schemes.residual_spec(cfg))


def training_batches(cfg: Config, split: TokenizedSplit) -> tuple[list[np.ndarray], int]:
    """The token-bucketed training batches (length-filtered) and how many pairs were filtered."""
    keep = filter_by_length(split, cfg.data.max_source_positions, cfg.data.max_target_positions)
    return make_batches(split, cfg.data.max_tokens, keep, seed=cfg.trainer.seed), len(split) - len(keep)


def first_batch(cfg: Config, data: TranslationData) -> Batch:
    """The first training batch (in build order), which the init scheme may profile."""
    split = data.splits[cfg.data.train_split]
    batches, _ = training_batches(cfg, split)
    return collate(split, batches[0], data.tgt_dict.pad_index, data.tgt_dict.eos_index)


def fresh_model(cfg: Config, data: TranslationData, batch: Optional[Batch] = None,
                initialize: bool = True) -> tuple[Seq2Seq, Optional[dict]]:
    """The model a run starts from and the init report: seed, build, then the init scheme on the
    first training batch (`batch`, when the caller has it). Every model a run trains or a
    diagnostic studies is made here, so the same config gives the same weights everywhere.
    initialize=False leaves the weights to a checkpoint (report None)."""
    torch.manual_seed(cfg.trainer.seed)
    model = model_for(cfg, len(data.src_dict), len(data.tgt_dict), data.tgt_dict.pad_index)
    if not initialize:
        return model, None
    return model, init_schemes.apply(model, cfg, first_batch(cfg, data) if batch is None else batch)


@dataclass
class RunParts:
    """Everything a training run needs, built and wired."""

    cfg: Config
    device: torch.device
    precision: str
    world: int  # DDP processes
    rank: int
    data: TranslationData
    train_split: TokenizedSplit
    batches: list[np.ndarray]
    valid_split: TokenizedSplit
    valid_batches: list[np.ndarray]
    valid_unigram_nll: float
    data_stats: dict[str, Any]
    model: Seq2Seq
    forward: nn.Module  # the model, or its DDP / compiled wrapper (what training calls)
    optimizer: torch.optim.Optimizer
    unpad: bool
    update_hook: Optional[Callable[[nn.Module, int], None]]
    started: float  # time.time() before the init scheme / checkpoint load (wall time counts from it)
    init_report: Optional[dict] = None  # None when the weights come from a checkpoint

    @property
    def task(self) -> str:
        return self.cfg.task

    @property
    def src_mask_always(self) -> bool:
        """Compiled training passes a source mask even for a batch without padding: the padding
        flag is a Python bool, and each of its values would compile a graph of its own."""
        return self.cfg.trainer.compile

    @property
    def pad(self) -> Optional[int]:
        """The padding id (None for task=lm: blocks of running text have none)."""
        return None if isinstance(self.data, LMData) else self.data.tgt_dict.pad_index

    @property
    def eos(self) -> Optional[int]:
        return None if isinstance(self.data, LMData) else self.data.tgt_dict.eos_index

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def init_distributed(device: torch.device) -> tuple[torch.device, int, int]:
    """(device, world size, rank) from the environment torchrun / submitit / spawn_ddp set; joins
    the process group (NCCL on CUDA, gloo on CPU) when there are several processes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device, world, rank


def build_run(cfg: Config, initialize: bool = True,
              data: Optional[TranslationData] = None, keep_host_memory: bool = True) -> RunParts:
    """Build a training run. initialize=False leaves the weights to a checkpoint (resume);
    `data` reuses corpora already built from cfg.data; keep_host_memory=False leaves the host
    allocator as it is on the CPU (the bench's plain-PyTorch reference, which only reads the
    run's data, trains with glibc's defaults)."""
    check_config(cfg)
    t = cfg.trainer
    if t.threads:
        torch.set_num_threads(t.threads)
    device, world, rank = init_distributed(resolve_device(t.device))
    if device.type == "cpu" and keep_host_memory:
        keep_freed_memory()  # no page faults per update (runner/run/allocator.py)
    precision = resolve_precision(t.precision, device)
    if cfg.task == "lm":
        return build_lm_run(cfg, initialize, device, world, rank, precision)

    data = build_data(cfg.data) if data is None else data
    train = data.splits[cfg.data.train_split]
    batches, filtered = training_batches(cfg, train)
    valid = data.splits[cfg.data.valid_split]
    valid_batches = make_batches(valid, cfg.data.max_tokens, shuffle=False)
    if t.valid_max_batches:
        valid_batches = valid_batches[:t.valid_max_batches]
    stats = {
        "train_pairs": len(train), "train_filtered": int(filtered),
        "valid_pairs": len(valid), "batches_per_epoch": len(batches),
        "src_vocab": len(data.src_dict), "tgt_vocab": len(data.tgt_dict), **data.stats,
    }
    pad, eos = data.tgt_dict.pad_index, data.tgt_dict.eos_index
    started = time.time()
    # on the CPU model (Admin profiles the first batch), before moving it
    model, report = fresh_model(cfg, data, collate(train, batches[0], pad, eos), initialize)
    optimizer, forward = on_device(model, cfg, device, world)
    return RunParts(
        cfg=cfg, device=device, precision=precision, world=world, rank=rank, data=data,
        train_split=train, batches=batches, valid_split=valid, valid_batches=valid_batches,
        valid_unigram_nll=unigram_nll(train, valid, len(data.tgt_dict)), data_stats=stats,
        model=model, forward=forward, optimizer=optimizer,
        unpad=t.unpad if t.unpad is not None else device.type == "cpu",
        update_hook=init_schemes.update_hook(cfg), started=started, init_report=report)


def on_device(model: nn.Module, cfg: Config, device: torch.device,
              world: int) -> tuple[torch.optim.Optimizer, nn.Module]:
    """The initialized model on `device` with its kernels, its optimizer (with the scheme's lr/eps
    multipliers per parameter group, Depth-muP's; None = one group) and what training calls:
    the model, or its DDP / compiled wrapper."""
    model.to(device).select_kernels(device.type)
    optimizer = build_optimizer(model.parameters(), cfg, device.type,
                                init_schemes.param_groups(model, cfg))
    forward: nn.Module = model
    if world > 1:
        forward = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.trainer.compile:
        # Translation batches vary in both dimensions (tokens per batch, not sentences), so its
        # graphs are compiled with dynamic shapes from the first call: left to dynamo, the first
        # graph is specialized to the first batch's shape and thrown away at the second batch's
        # (automatic dynamic shapes), a whole compile wasted. The LM's blocks have one shape.
        dynamic = True if cfg.task == "translation" else None
        if cfg.trainer.compile_scope == "layers":
            # Regional compilation (as torchtitan compiles each transformer block): the layers of
            # a stack run one code, which dynamo compiles once for all of them (their parameters
            # are graph inputs), so an 18-layer stack compiles as fast as a 6-layer one.
            model.compile_layers(lambda layer: compiled(layer, dynamic=dynamic))
        else:
            forward = compiled(forward, dynamic=dynamic)
    return optimizer, forward


def build_lm_run(cfg: Config, initialize: bool, device: torch.device, world: int, rank: int,
                 precision: str) -> RunParts:
    """task=lm: the text corpus, the decoder-only model and the init scheme on update 0's blocks."""
    t, d = cfg.trainer, cfg.data
    data = build_lm_data(d)
    train, valid = data.splits[d.train_split], data.splits[d.valid_split]
    valid_batches = lm_data.validation_batches(valid, d.block_size, d.batch_size, t.valid_max_batches)
    stats = {**data.stats, "block_size": d.block_size, "batch_size": d.batch_size,
             "valid_blocks": sum(len(x) for x, _ in valid_batches)}
    started = time.time()
    torch.manual_seed(t.seed)
    model = lm_model_for(cfg, len(data))
    report = None
    if initialize:
        first = lm_data.training_batch(train, d.block_size, d.batch_size, t.seed, 0)
        report = init_schemes.apply(model, cfg, first)
    optimizer, forward = on_device(model, cfg, device, world)
    return RunParts(
        cfg=cfg, device=device, precision=precision, world=world, rank=rank, data=data,
        train_split=train, batches=[], valid_split=valid, valid_batches=valid_batches,
        valid_unigram_nll=lm_data.unigram_nll(train, valid, len(data)), data_stats=stats,
        model=model, forward=forward, optimizer=optimizer, unpad=False,
        update_hook=init_schemes.update_hook(cfg), started=started, init_report=report)


def compiled(module: nn.Module, dynamic: Optional[bool] = None) -> nn.Module:
    """torch.compile is an optimisation: a graph that fails to compile runs eagerly. `dynamic`
    is torch.compile's (None: specialize, then go dynamic at the first new shape)."""
    import torch._dynamo  # noqa: PLC0415 (loads the compiler stack; only with trainer.compile=true)

    torch._dynamo.config.suppress_errors = True
    try:
        return torch.compile(module, dynamic=dynamic)
    except Exception as exc:
        log.warning("torch.compile failed (%s); running eagerly", exc)
        return module
