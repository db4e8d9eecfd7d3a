"""train(cfg, run_dir) -> result: one training run, as a plain function tests can call.

The run folder ends up holding .hydra/ (Hydra), train.log, metrics.jsonl, init.json, env.json,
checkpoint_last.pt (+ numbered checkpoints when kept), TensorBoard events and result.json,
which is written last. A run whose result.json says ok or diverged is finished and skipped;
otherwise a checkpoint_last.pt is resumed exactly (model, optimizer, data position, RNG).
"""
from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch

from runner import checkpoint as ckpt
from runner import init as init_schemes
from runner.config import ConfigError, validate
from runner.console import console, log, progress_bar, summary_table
from runner.data import build_data
from runner.data.batching import Batch, collate, epoch_order, filter_by_length, make_batches
from runner.data.dataset import unigram_nll
from runner.loss import label_smoothed_nll
from runner.model.seq2seq import build_model
from runner.optim import build_optimizer, set_lr
from runner.schedule import lr_at

FINISHED = ("ok", "diverged")


# ----------------------------------------------------------------------------- environment
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


def git_commit() -> Optional[str]:
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device, precision: str) -> dict[str, Any]:
    import platform
    import socket

    import hydra
    import omegaconf

    import runner

    env = {
        "deepinit": runner.__version__, "python": platform.python_version(),
        "torch": torch.__version__, "hydra": hydra.__version__, "omegaconf": omegaconf.__version__,
        "cuda": torch.version.cuda, "device": str(device), "precision": precision,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "hostname": socket.gethostname(),
        "git_commit": git_commit(), "platform": platform.platform(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    return env


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_result(run_dir: Path) -> Optional[dict]:
    path = Path(run_dir) / "result.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def truncate_metrics(path: Path, step: int) -> None:
    """Drop lines a killed attempt logged after its last checkpoint, so a resumed run's
    metrics.jsonl equals an uninterrupted one's."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if line.strip() and json.loads(line)["step"] <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- data stream
@dataclass
class DataPosition:
    """Where the next batch comes from: resume restores exactly this."""

    epoch: int = 1
    index: int = 0  # position within the epoch's batch order


def batch_stream(batches: list[np.ndarray], seed: int, pos: DataPosition) -> Iterator[np.ndarray]:
    """Yields batch indices forever, advancing `pos` in place (epochs roll over)."""
    while True:
        order = epoch_order(batches, seed, pos.epoch)
        while pos.index < len(order):
            indices = order[pos.index]
            pos.index += 1
            yield indices
        pos.epoch, pos.index = pos.epoch + 1, 0


# ----------------------------------------------------------------------------- the run
@dataclass
class RunState:
    step: int = 0
    pos: DataPosition = field(default_factory=DataPosition)
    best_valid_loss: Optional[float] = None
    best_valid_nll: Optional[float] = None
    best_metric: Optional[float] = None  # trainer.best_checkpoint_metric's best value
    train_tokens: int = 0
    train_seconds: float = 0.0
    wall_before: float = 0.0  # wall time of earlier attempts (resume)
    bad_streak: float = 0.0  # consecutive updates with loss above the divergence bound
    last_train_loss: Optional[float] = None
    last_valid: dict = field(default_factory=dict)


class Trainer:
    def __init__(self, cfg, run_dir: Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        t = cfg.trainer
        if t.threads:
            torch.set_num_threads(t.threads)
        self.device = resolve_device(t.device)
        # DDP: one process per device, started by torchrun, submitit tasks or train() itself.
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.main = self.rank == 0
        if self.world > 1:
            import torch.distributed as dist

            if self.device.type == "cuda":
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                torch.cuda.set_device(self.device)
            if not dist.is_initialized():
                dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        self.precision = resolve_precision(t.precision, self.device)
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        self.unpad = t.unpad if t.unpad is not None else self.device.type == "cpu"
        torch.manual_seed(t.seed)

        self.data = build_data(cfg.data)
        self.src_dict, self.tgt_dict = self.data.src_dict, self.data.tgt_dict
        self.pad, self.eos = self.tgt_dict.pad_index, self.tgt_dict.eos_index
        train = self.data.splits[cfg.data.train_split]
        keep = filter_by_length(train, cfg.data.max_source_positions, cfg.data.max_target_positions)
        self.train_split = train
        self.batches = make_batches(train, cfg.data.max_tokens, keep, seed=t.seed)
        valid = self.data.splits[cfg.data.valid_split]
        self.valid_split = valid
        self.valid_batches = make_batches(valid, cfg.data.max_tokens, shuffle=False)
        if t.valid_max_batches:
            self.valid_batches = self.valid_batches[:t.valid_max_batches]
        self.valid_unigram_nll = unigram_nll(train, valid, len(self.tgt_dict))
        self.data_stats = {
            "train_pairs": len(train), "train_filtered": int(len(train) - len(keep)),
            "valid_pairs": len(valid), "batches_per_epoch": len(self.batches),
            "src_vocab": len(self.src_dict), "tgt_vocab": len(self.tgt_dict),
            **self.data.stats,
        }

        self.model = build_model(cfg, len(self.src_dict), len(self.tgt_dict), self.pad)
        self.on_update = init_schemes.on_update_hook(cfg)
        self.state = RunState()
        self.stream = batch_stream(self.batches, t.seed, self.state.pos)

    # ---- batches
    def _next_batches(self) -> tuple[list[Batch], int]:
        """This rank's micro-batches of one update and the update's target tokens over all
        ranks (every rank knows every batch's lengths, so no communication is needed)."""
        out, global_tokens = [], 0
        for _ in range(self.cfg.trainer.update_freq):
            group = [next(self.stream) for _ in range(self.world)]  # rank r takes group[r]
            global_tokens += int(sum(self.train_split.tgt_lengths[g].sum() for g in group))
            batch = collate(self.train_split, group[self.rank], self.pad, self.eos)
            if self.device.type == "cuda":
                batch = batch.pin_memory()
            out.append(batch.to(self.device, non_blocking=True))
        return out, global_tokens

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return tensor

    def autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    # ---- init / resume
    def initialize(self) -> dict:
        """Apply the init scheme on the CPU model (Admin profiles the first batch)."""
        first = collate(self.train_split, self.batches[0], self.pad, self.eos)
        report = init_schemes.apply(self.model, self.cfg, first)
        self.model.to(self.device)
        return report

    def build_optimizer(self):
        self.optimizer = build_optimizer(self.model.parameters(), self.cfg, self.device.type)
        self.forward = self.model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            self.forward = self.ddp
        if self.cfg.trainer.compile:
            import torch._dynamo

            # Compilation is an optimisation: a graph that fails to compile runs eagerly.
            torch._dynamo.config.suppress_errors = True
            try:
                self.forward = torch.compile(self.forward)
            except Exception as exc:
                log.warning("torch.compile failed (%s); running eagerly", exc)

    def state_dict(self) -> dict:
        from dataclasses import asdict

        s = self.state
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "schedule": {"step": s.step},  # the lr is a pure function of the step
            "step": s.step, "epoch": s.pos.epoch, "epoch_index": s.pos.index,
            "best_valid_loss": s.best_valid_loss, "best_valid_nll": s.best_valid_nll,
            "best_metric": s.best_metric, "train_tokens": s.train_tokens,
            "train_seconds": s.train_seconds, "wall_s": s.wall_before + (time.time() - self.t0),
            "bad_streak": s.bad_streak, "last_train_loss": s.last_train_loss,
            "last_valid": s.last_valid,
            "rng": ckpt.rng_state(),
            "config": asdict(self.cfg),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.model.to(self.device)
        self.build_optimizer()
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        s = self.state
        s.step = state["step"]
        s.pos.epoch, s.pos.index = state["epoch"], state["epoch_index"]
        s.best_valid_loss = state["best_valid_loss"]
        s.best_valid_nll = state.get("best_valid_nll")
        s.best_metric = state.get("best_metric")
        s.train_tokens, s.train_seconds = state["train_tokens"], state["train_seconds"]
        s.wall_before = state["wall_s"]
        s.bad_streak, s.last_train_loss = state["bad_streak"], state["last_train_loss"]
        s.last_valid = state["last_valid"]
        ckpt.set_rng_state(state["rng"])

    # ---- evaluation
    @torch.no_grad()
    def validate(self) -> dict:
        self.model.eval()
        loss_sum = nll_sum = 0.0
        tokens = 0
        for indices in self.valid_batches[self.rank::self.world]:
            batch = collate(self.valid_split, indices, self.pad, self.eos).to(self.device)
            with self.autocast():
                logits = self.model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad)
            loss, nll = label_smoothed_nll(logits, batch.target, self.cfg.trainer.label_smoothing, self.pad)
            loss_sum += float(loss)
            nll_sum += float(nll)
            tokens += batch.ntokens
        self.model.train()
        if self.world > 1:
            sums = self.all_reduce(torch.tensor([loss_sum, nll_sum, tokens], dtype=torch.float64,
                                                device=self.device))
            loss_sum, nll_sum, tokens = sums.tolist()
        loss, nll = loss_sum / max(tokens, 1), nll_sum / max(tokens, 1)
        return {"loss": loss, "nll_loss": nll, "ppl": math.exp(min(nll, 50.0))}

    # ---- the loop
    def run(self) -> dict:
        cfg, t, run_dir = self.cfg, self.cfg.trainer, self.run_dir
        self.t0 = time.time()
        last = run_dir / ckpt.LAST
        resumed = False
        if t.resume and last.exists():
            self.load_state_dict(ckpt.load(last, map_location=self.device))
            resumed = True
            log.info("resumed from %s at update %d", last, self.state.step)
        else:
            report = self.initialize()
            if self.main:
                write_json(run_dir / "init.json", report)
                # The vocabularies the model is trained on: eval checks its rebuilt data against them.
                self.src_dict.save(run_dir / "dict.src.txt")
                self.tgt_dict.save(run_dir / "dict.tgt.txt")
            self.build_optimizer()
        n_params = sum(p.numel() for p in self.model.parameters())
        if self.main:
            write_json(run_dir / "env.json", {**environment(self.device, self.precision),
                                              "parameters": n_params, "unpad": self.unpad,
                                              "data": self.data_stats,
                                              "world_size": self.world})
        log.info("model: %s params, %d+%d layers, norm=%s, init=%s, optim=%s; data: %s",
                 f"{n_params:,}", cfg.model.num_encoder_layers, cfg.model.num_decoder_layers,
                 cfg.norm.placement, cfg.init.name, cfg.optim.name, self.data_stats)

        if resumed and self.main:
            truncate_metrics(run_dir / "metrics.jsonl", self.state.step)
        writer = None
        if t.tensorboard and self.main:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events a killed attempt wrote after its last checkpoint.
            writer = SummaryWriter(log_dir=str(run_dir), purge_step=self.state.step + 1 if resumed else None)
        metrics = open(run_dir / "metrics.jsonl", "a") if self.main else None
        s = self.state
        status, reason, diverged_step = "ok", None, None
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = cfg.optim.clip_norm if cfg.optim.clip_norm > 0 else float("inf")
        bound, patience = t.divergence.loss_bound, t.divergence.patience
        # Device-side accumulators: no host sync per update (CUDA); read on log/check steps.
        dev = self.device
        window_loss = torch.zeros((), device=dev)
        window_nll = torch.zeros((), device=dev)
        window_gnorm = torch.zeros((), device=dev)
        window_tokens, window_updates, window_time = 0, 0, 0.0
        streak = torch.tensor(s.bad_streak, device=dev)
        max_streak = torch.zeros((), device=dev)
        nonfinite = torch.zeros((), dtype=torch.bool, device=dev)

        self.model.train()
        with progress_bar(t.progress if self.main else False) as progress:
            task = progress.add_task("train", total=t.max_updates, completed=s.step, loss="-",
                                     lr="-", tps="-")
            while s.step < t.max_updates and (t.max_epochs == 0 or s.pos.epoch <= t.max_epochs):
                tick = time.perf_counter()
                lr = lr_at(s.step, cfg)
                set_lr(self.optimizer, lr)
                batches, ntokens = self._next_batches()
                update_loss = torch.zeros((), device=dev)
                for i, batch in enumerate(batches):
                    # DDP averages gradients over ranks; scaling by world/ntokens makes the
                    # result sum(loss)/ntokens over the global batch, as in one process.
                    sync = self.world == 1 or i == len(batches) - 1
                    with nullcontext() if sync else self.ddp.no_sync():
                        with self.autocast():
                            logits = self.forward(batch.src_tokens, batch.prev_tokens,
                                                  batch.src_has_pad, unpad=self.unpad)
                        target = batch.real_target if self.unpad else batch.target
                        loss, nll = label_smoothed_nll(logits, target, t.label_smoothing, self.pad)
                        self.scaler.scale(loss * (self.world / ntokens)).backward()
                    update_loss += loss.detach()
                    window_nll += nll.detach()
                self.scaler.unscale_(self.optimizer)
                gnorm = torch.nn.utils.clip_grad_norm_(params, max_norm)
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
                s.step += 1
                if self.on_update is not None:
                    self.on_update(self.model, s.step)

                # Per-token loss of this rank's share (ranks agree at check steps, below).
                per_token = update_loss * (self.world / ntokens)
                window_loss += update_loss
                window_gnorm += gnorm.detach().float()
                nonfinite |= ~torch.isfinite(per_token)
                streak = (streak + 1) * (per_token > bound)
                max_streak = torch.maximum(max_streak, streak)
                window_tokens += ntokens
                window_updates += 1
                elapsed = time.perf_counter() - tick
                window_time += elapsed
                s.train_tokens += ntokens
                s.train_seconds += elapsed
                progress.update(task, completed=s.step)

                at_log = s.step % t.log_interval == 0 or s.step == t.max_updates
                at_check = at_log or s.step % t.divergence.check_interval == 0
                if at_check:
                    if self.world > 1:
                        flags = self.all_reduce(torch.stack([nonfinite.float(), max_streak]), "max")
                        nonfinite, max_streak = flags[0] > 0, flags[1]
                    if bool(nonfinite):
                        status, reason, diverged_step = "diverged", "non-finite loss (nan/inf)", s.step
                    elif float(max_streak) >= patience:
                        status, diverged_step = "diverged", s.step
                        reason = f"loss above {bound} for {patience} consecutive updates"
                    s.bad_streak = float(streak)
                if at_log or status != "ok":
                    sums = self.all_reduce(torch.stack([window_loss, window_nll]))
                    train_loss = float(sums[0]) / max(window_tokens, 1)
                    record = {
                        "split": "train", "step": s.step, "epoch": s.pos.epoch,
                        "loss": train_loss, "nll_loss": float(sums[1]) / max(window_tokens, 1),
                        "lr": lr, "grad_norm": float(window_gnorm) / max(window_updates, 1),
                        "tokens_per_s": window_tokens / max(window_time, 1e-9),
                        "wall_s": s.wall_before + time.time() - self.t0,
                    }
                    s.last_train_loss = train_loss
                    self._emit(metrics, writer, record)
                    progress.update(task, loss=f"{train_loss:.3f}", lr=f"{lr:.2e}",
                                    tps=f"{record['tokens_per_s']:,.0f}")
                    if not progress.live.is_started or progress.disable:
                        log.info("update %d/%d  loss %.4f  lr %.3e  gnorm %.2f  %.0f tok/s",
                                 s.step, t.max_updates, train_loss, lr, record["grad_norm"],
                                 record["tokens_per_s"])
                    window_loss.zero_(); window_nll.zero_(); window_gnorm.zero_()
                    window_tokens, window_updates, window_time = 0, 0, 0.0
                if status != "ok":
                    log.warning("diverged at update %d: %s", s.step, reason)
                    break
                done = s.step >= t.max_updates
                if (t.valid_interval and s.step % t.valid_interval == 0) or done:
                    self._validate_and_log(metrics, writer, lr)
                if (t.save_interval and s.step % t.save_interval == 0) or done:
                    self.save_checkpoint()
            if status == "ok" and s.step < t.max_updates:  # stopped by max_epochs
                self._validate_and_log(metrics, writer, lr_at(s.step, cfg))
                self.save_checkpoint()
        if metrics is not None:
            metrics.close()
        if writer is not None:
            writer.close()

        valid = s.last_valid or {}
        stall_line = self.valid_unigram_nll - t.divergence.stall_margin
        stalled = status == "ok" and s.best_valid_nll is not None and s.best_valid_nll > stall_line
        if stalled:
            log.warning("stalled: best valid NLL %.3f is not below the unigram NLL %.3f minus %.2f",
                        s.best_valid_nll, self.valid_unigram_nll, t.divergence.stall_margin)
        result = {
            "status": status, "reason": reason, "diverged_step": diverged_step,
            "updates": s.step, "epochs": s.pos.epoch,
            "train_loss": s.last_train_loss, "valid_loss": valid.get("loss"),
            "valid_nll_loss": valid.get("nll_loss"), "valid_ppl": valid.get("ppl"),
            "best_valid_loss": s.best_valid_loss, "best_valid_nll": s.best_valid_nll,
            "valid_unigram_nll": self.valid_unigram_nll, "stalled": stalled,
            "tokens_per_s": s.train_tokens / max(s.train_seconds, 1e-9),
            "train_tokens": s.train_tokens,
            "wall_s": s.wall_before + time.time() - self.t0,
            "resumed": resumed, "parameters": n_params, "bleu": None,
            "device": str(self.device), "precision": self.precision,
        }
        return result

    def save_checkpoint(self) -> None:
        if self.main:
            ckpt.save(self.run_dir, self.state_dict(), self.state.step,
                      self.cfg.trainer.keep_checkpoints)
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def _validate_and_log(self, metrics, writer, lr: float) -> None:
        s = self.state
        valid = self.validate()
        t = self.cfg.trainer
        if t.valid_bleu or t.best_checkpoint_metric == "bleu":
            # every rank decodes the whole split: the same score, no communication
            from runner.evaluate import split_bleu

            valid["bleu"] = split_bleu(
                self.model, self.valid_split, self.data.references[self.cfg.data.valid_split],
                self.tgt_dict, self.data.bpe_symbol, t, self.cfg.data.max_tokens, self.device)
            self.model.train()
        s.last_valid = valid
        if s.best_valid_loss is None or valid["loss"] < s.best_valid_loss:
            s.best_valid_loss = valid["loss"]
        if s.best_valid_nll is None or valid["nll_loss"] < s.best_valid_nll:
            s.best_valid_nll = valid["nll_loss"]
        if t.best_checkpoint_metric in ("loss", "bleu"):
            value = valid["loss"] if t.best_checkpoint_metric == "loss" else valid["bleu"]
            sign = 1.0 if t.best_checkpoint_metric == "loss" else -1.0
            if s.best_metric is None or sign * value < sign * s.best_metric:
                s.best_metric = value
                if self.main:
                    ckpt.save_atomic(self.state_dict(), self.run_dir / "checkpoint_best.pt")
        self._emit(metrics, writer, {"split": "valid", "step": s.step, "epoch": s.pos.epoch,
                                     "lr": lr, **valid})
        log.info("valid at update %d: loss %.4f  nll %.4f  ppl %.2f", s.step, valid["loss"],
                 valid["nll_loss"], valid["ppl"])

    @staticmethod
    def _emit(metrics, writer, record: dict) -> None:
        if metrics is None:  # not the main rank
            return
        metrics.write(json.dumps(record) + "\n")
        metrics.flush()
        if writer is not None:
            split = record["split"]
            for key, value in record.items():
                if key not in ("split", "step", "epoch") and isinstance(value, (int, float)):
                    writer.add_scalar(f"{split}/{key}", value, record["step"])
            writer.flush()


def train(cfg, run_dir: Path) -> dict:
    """Validate, then train (or skip a finished run), and write result.json last."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg):
        cfg = OmegaConf.to_object(cfg)  # the typed dataclasses (with their derived properties)
    validate(cfg)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    previous = read_result(run_dir)
    if cfg.trainer.resume and previous and previous.get("status") in FINISHED:
        log.info("run already finished (%s): %s", previous["status"], run_dir / "result.json")
        console.print(summary_table(previous, str(run_dir)))
        return previous
    if cfg.trainer.devices > 1 and "WORLD_SIZE" not in os.environ:
        return spawn_ddp(cfg, run_dir)
    trainer = Trainer(cfg, run_dir)
    result = trainer.run()
    result["world_size"] = trainer.world
    if trainer.main and cfg.trainer.final_bleu and result["status"] == "ok":
        from runner.evaluate import final_scores

        try:
            result.update(final_scores(cfg, run_dir, trainer.device))
        except Exception as exc:  # scoring must not turn a finished run into a failed one
            log.warning("final BLEU failed: %s: %s", type(exc).__name__, exc)
            result["bleu_error"] = f"{type(exc).__name__}: {exc}"
    if trainer.main:
        write_json(run_dir / "result.json", result)
        console.print(summary_table(result, str(run_dir)))
    if trainer.world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return result


def _ddp_worker(rank: int, world: int, port: int, cfg, run_dir: Path) -> None:
    import logging

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if rank == 0:  # a spawned interpreter has no Hydra logging: log to train.log directly
        handler = logging.FileHandler(run_dir / "train.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(logging.INFO)
    train(cfg, run_dir)


def spawn_ddp(cfg, run_dir: Path) -> dict:
    """trainer.devices=N without a launcher: start N local processes (gloo on CPU, NCCL on
    CUDA) and return rank 0's result."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if resolve_device(cfg.trainer.device).type == "cuda" and torch.cuda.device_count() < cfg.trainer.devices:
        raise ConfigError(f"trainer.devices={cfg.trainer.devices} but only "
                          f"{torch.cuda.device_count()} CUDA devices are visible")
    mp.spawn(_ddp_worker, args=(cfg.trainer.devices, port, cfg, run_dir), nprocs=cfg.trainer.devices)
    return read_result(run_dir)
