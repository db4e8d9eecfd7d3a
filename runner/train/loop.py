"""The train loop: `Trainer.step` does one update, `Trainer.run` repeats it until
trainer.max_updates (or max_epochs), logging windows, checking divergence, validating and asking
for checkpoints at their intervals.

The loop knows the loss and nothing else: what happens with its records (metrics.jsonl,
TensorBoard), checkpoints, validation BLEU and diagnostics are `Callback`s handed to it by the
run assembly (runner/run/). It does no file I/O of its own.
"""
from __future__ import annotations

import math
import random
import signal
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from runner.console import log, progress_bar, track
from runner.data.batching import Batch, collate, epoch_order
from runner.model.loss import label_smoothed_nll
from runner.train.loss_scale import LossScaleMonitor
from runner.train.optim import set_lr
from runner.train.schedule import lr_at


# ----------------------------------------------------------------------------- state
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


@dataclass
class LoopState:
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
    # trainer.early_stop: the validation loss of the last improvement and its update (the rule's
    # reference), and whether the rule ended the run (then `step` is the update it stopped at)
    stop_reference: Optional[float] = None
    stop_reference_step: Optional[int] = None
    stopped_early: bool = False
    # the loss of update 1 under the initial weights, and of the first train record
    initial_loss: Optional[float] = None
    first_logged_loss: Optional[float] = None


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG streams: torch's CPU generator (the CPU dropout masks), Python's, and
    on CUDA the generator of the run's own GPU only (another GPU's state would not exist when
    the run resumes with fewer GPUs visible)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda_device"] = torch.cuda.get_rng_state(device)
    return state


def _as_tuple(obj):
    return tuple(_as_tuple(x) for x in obj) if isinstance(obj, (list, tuple)) else obj


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    # .cpu(): torch takes RNG states as CPU byte tensors, and a checkpoint loaded with
    # map_location=cuda brings them onto the GPU
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(_as_tuple(state["python"]))
    if device.type != "cuda":
        return
    if "cuda_device" in state:
        torch.cuda.set_rng_state(state["cuda_device"].cpu(), device)
    elif state.get("cuda"):  # older checkpoints: every visible GPU's state, indexed by GPU
        states = state["cuda"]
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.set_rng_state(states[index if index < len(states) else 0].cpu(), device)


@dataclass
class StepOutput:
    """One update, as tensors on the device (read them only on log steps: a host sync)."""

    loss_sum: torch.Tensor  # label-smoothed loss summed over this rank's target tokens
    nll_parts: list[torch.Tensor]  # the NLL sum of each micro-batch (added to windows one by one)
    grad_norm: torch.Tensor  # before clipping
    tokens: int  # target tokens of the update over all ranks
    lr: float
    batches: list[Batch]  # this rank's micro-batches (on the device)
    # fp16 only: 1 when the loss scaler skipped this update (its gradients overflowed), else 0
    skipped: Optional[torch.Tensor] = None

    @property
    def loss_per_token(self) -> torch.Tensor:
        return self.loss_sum / self.tokens

    @property
    def nll_sum(self) -> torch.Tensor:
        return sum(self.nll_parts[1:], self.nll_parts[0])


@dataclass
class Validation:
    """One validation: the label-smoothed loss and the NLL per target token, the perplexity, and
    the valid split's BLEU when the run measures it (the run assembly's scorer: trainer.valid_bleu
    or best_checkpoint_metric=bleu), else None, and for task=lm the NLL in bits per character
    (data=shakespeare_char) or per BPE token (data=text) (runner/train/lm_loop.py), else None."""

    loss: float
    nll_loss: float
    ppl: float
    bleu: Optional[float] = None
    bpc: Optional[float] = None
    bpt: Optional[float] = None

    def record(self) -> dict:
        """The fields of the validation record (metrics.jsonl; bleu, bpc and bpt only when measured)."""
        out = {"loss": self.loss, "nll_loss": self.nll_loss, "ppl": self.ppl}
        if self.bleu is not None:
            out["bleu"] = self.bleu
        if self.bpc is not None:
            out["bpc"] = self.bpc
        if self.bpt is not None:
            out["bpt"] = self.bpt
        return out


@dataclass
class Outcome:
    status: str = "ok"  # ok | diverged
    reason: Optional[str] = None
    diverged_step: Optional[int] = None


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM) the loop acted on: it finished the update under way and
    saved checkpoint_last.pt at `saved_step`. A KeyboardInterrupt, so that what handles Ctrl-C
    handles it (signum: the signal, as runner.sweep.cells reads it)."""

    def __init__(self, signum: int, saved_step: Optional[int]):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.saved_step = signum, saved_step


# ----------------------------------------------------------------------------- callbacks
class Callback:
    """Hooks the loop calls; every method is optional (the defaults do nothing)."""

    def on_step_start(self, trainer: "Trainer") -> None: ...

    def on_step_end(self, trainer: "Trainer", out: StepOutput) -> None: ...

    def on_best(self, trainer: "Trainer") -> None:
        """The validation just done is the best so far by trainer.best_checkpoint_metric."""

    def on_record(self, trainer: "Trainer", record: dict) -> None:
        """A train-window or validation record (what metrics.jsonl holds)."""

    def on_checkpoint(self, trainer: "Trainer") -> None: ...


def next_update(stream: Iterator[np.ndarray], split, update_freq: int, world: int, rank: int, pad: int,
                eos: int, device: torch.device) -> tuple[list[np.ndarray], list[Batch], int]:
    """One update's micro-batches from the batch stream: this rank's sentence indices, its
    collated batches on `device`, and the update's target tokens over all ranks (every rank
    knows every batch's lengths, so no communication is needed). Rank r takes the r-th of each
    `world` consecutive batches."""
    indices, batches, global_tokens = [], [], 0
    for _ in range(update_freq):
        group = [next(stream) for _ in range(world)]
        global_tokens += int(sum(split.tgt_lengths[g].sum() for g in group))
        indices.append(group[rank])
        batches.append(to_device(collate(split, group[rank], pad, eos), device))
    return indices, batches, global_tokens


def to_device(batch: Batch, device: torch.device) -> Batch:
    """`batch` on `device` without waiting: a GPU copy goes from pinned memory, asynchronously."""
    if device.type == "cuda":
        batch = batch.pin_memory()
    return batch.to(device, non_blocking=True)


def optimizer_update(model, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], max_norm: float,
                     scaler: torch.amp.GradScaler, loss_scale: Optional[LossScaleMonitor],
                     update_hook: Optional[Callable[[Any, int], None]],
                     step: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The update once the gradients are in, as training takes it: unscale them (fp16's loss
    scaler; a no-op otherwise), clip to max_norm (inf: measure only), the optimizer step through
    the scaler (skipped on an fp16 overflow, which loss_scale counts), zero the gradients, then
    the init scheme's per-update hook for update `step` (1-based). Returns (the gradient norm
    before clipping, the fp16 skip flag or None). `Trainer.step` takes every update through it,
    and so does an analysis that takes "one update as training does" (output_change.adam_step)."""
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    scaler.step(optimizer)
    if loss_scale is not None:
        loss_scale.before_update()
    scaler.update()
    skipped = None
    if loss_scale is not None:
        loss_scale.after_update()
        skipped = loss_scale.last_overflow
    optimizer.zero_grad(set_to_none=True)
    if update_hook is not None:
        update_hook(model, step)
    return grad_norm, skipped


def loss_scaler(precision: str) -> torch.amp.GradScaler:
    """The gradient scaler of a run in `precision`: active for fp16 only (a no-op otherwise)."""
    return torch.amp.GradScaler("cuda", enabled=precision == "fp16")


# ----------------------------------------------------------------------------- the loop
class Trainer:
    """Trains `parts` (a runner.run.build.RunParts: config, device, data, model, optimizer)."""

    def __init__(self, parts, callbacks: Sequence[Callback] = (),
                 valid_bleu: Optional[Callable[["Trainer"], float]] = None):
        """`valid_bleu`: the BLEU of the valid split for each validation (the run assembly's
        decoder: runner/run/train.py ValidBleu), None when validation measures the loss only."""
        self.parts = parts
        self.valid_bleu = valid_bleu
        self.cfg, self.model, self.optimizer = parts.cfg, parts.model, parts.optimizer
        self.device, self.world, self.rank = parts.device, parts.world, parts.rank
        self.callbacks = list(callbacks)
        self.state = LoopState()
        self._rng_ranks: Optional[list] = None  # every rank's RNG state at the last gather_rng()
        self.stream = batch_stream(parts.batches, self.cfg.trainer.seed, self.state.pos)
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(parts.precision)
        self.scaler = loss_scaler(parts.precision)
        # fp16 only: overflow count and the min-scale stop (runner/train/loss_scale.py)
        self.loss_scale = (LossScaleMonitor(self.scaler, self.cfg.trainer.min_loss_scale)
                           if self.scaler.is_enabled() else None)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        clip = self.cfg.optim.clip_norm
        self.max_norm = clip if clip > 0 else float("inf")
        # wall time counts from the run's start (parts.started: before the init scheme or the
        # checkpoint load), so it includes them, as it did for every earlier run
        self.t0 = parts.started
        # A stop signal received while training (set by the run's signal handler): the loop
        # saves and raises Stopped after the update under way.
        self.stop_signal: Optional[int] = None
        # whether the checkpoint being written is a scheduled one (numbered copies for averaging)
        # or an extra one (time-based, on a stop: checkpoint_last.pt alone)
        self.checkpoint_numbered = True
        self.window: Optional[TrainWindow] = None
        self.monitor: Optional[DivergenceMonitor] = None
        self._pending: Optional[dict] = None  # a loaded checkpoint's unfinished log window
        self._last_save = time.monotonic()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _callbacks(self, hook: str, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

    def emit_record(self, record: dict) -> None:
        """A record made by a callback (e.g. telemetry) to every callback's on_record, as the
        loop's own records go (metrics.jsonl, TensorBoard)."""
        self._callbacks("on_record", record)

    def autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return tensor

    # ---- one update
    def _next_batches(self) -> tuple[list[Batch], int]:
        """This rank's micro-batches of one update and the update's target tokens over all ranks."""
        _, batches, tokens = next_update(self.stream, self.parts.train_split, self.cfg.trainer.update_freq,
                                         self.world, self.rank, self.parts.pad, self.parts.eos, self.device)
        return batches, tokens

    def micro_batch_loss(self, forward, batch: Batch, unpad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(label-smoothed loss, NLL), each summed over the micro-batch's target tokens. The
        logits are not kept: autograd keeps what it needs, and the logits themselves would add
        B*T*V to the peak."""
        # an all-True mask on a batch without padding changes no attention weight
        has_pad = batch.src_has_pad or self.parts.src_mask_always
        with self.autocast():
            logits = forward(batch.src_tokens, batch.prev_tokens, has_pad, unpad=unpad)
        target = batch.real_target if unpad else batch.target
        return label_smoothed_nll(logits, target, self.cfg.trainer.label_smoothing, self.parts.pad)

    def step(self) -> StepOutput:
        """One optimizer update: lr from the schedule, forward/backward of the update's
        micro-batches, clipping, the optimizer step and the init scheme's per-update hook."""
        unpad, forward = self.parts.unpad, self.parts.forward
        self._callbacks("on_step_start")
        lr = lr_at(self.state.step, self.cfg)
        set_lr(self.optimizer, lr)
        batches, ntokens = self._next_batches()
        loss_sum = torch.zeros((), device=self.device)
        nll_parts = []
        for i, batch in enumerate(batches):
            # DDP averages gradients over ranks; scaling by world/ntokens makes the result
            # sum(loss)/ntokens over the global batch, as in one process.
            sync = self.world == 1 or i == len(batches) - 1
            with nullcontext() if sync else forward.no_sync():
                loss, nll = self.micro_batch_loss(forward, batch, unpad)
                self.scaler.scale(loss * (self.world / ntokens)).backward()
            loss_sum += loss.detach()
            nll_parts.append(nll.detach())
        grad_norm, skipped = optimizer_update(self.model, self.optimizer, self.params, self.max_norm,
                                              self.scaler, self.loss_scale, self.parts.update_hook,
                                              self.state.step + 1)
        self.state.step += 1
        out = StepOutput(loss_sum, nll_parts, grad_norm, ntokens, lr, batches, skipped)
        self._callbacks("on_step_end", out)
        return out

    # ---- validation
    @torch.no_grad()
    def validation_sums(self) -> tuple[torch.Tensor, int]:
        """This rank's summed validation loss and NLL (a float64 pair on the device) and its
        target tokens. Nothing here waits for the GPU: the sums stay on the device (adding in
        float64 as Python floats would), where a float() per batch would sync after each batch."""
        self.model.eval()
        split, pad, eos = self.parts.valid_split, self.parts.pad, self.parts.eos
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        tokens = 0
        for indices in track(self.parts.valid_batches[self.rank::self.world], "valid"):
            batch = to_device(collate(split, indices, pad, eos), self.device)
            with self.autocast():
                logits = self.model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad)
            loss, nll = label_smoothed_nll(logits, batch.target, self.cfg.trainer.label_smoothing, pad)
            sums += torch.stack([loss, nll]).double()
            tokens += batch.ntokens
        self.model.train()
        return sums, tokens

    def validation_loss(self) -> Validation:
        """The validation loss over every rank (no BLEU: `validation` adds it)."""
        sums, tokens = self.validation_sums()
        totals = torch.cat([sums.cpu(), torch.tensor([tokens], dtype=torch.float64)])
        if self.world > 1:
            totals = self.all_reduce(totals.to(self.device)).cpu()
        loss_sum, nll_sum, tokens = totals.tolist()
        loss, nll = loss_sum / max(tokens, 1), nll_sum / max(tokens, 1)
        return Validation(loss, nll, math.exp(min(nll, 50.0)))

    def validation(self) -> Validation:
        """One validation: the loss, and the BLEU when the run measures it (`valid_bleu`)."""
        valid = self.validation_loss()
        if self.valid_bleu is not None:
            valid = replace(valid, bleu=self.valid_bleu(self))
        return valid

    def validate(self, lr: float) -> None:
        s, t = self.state, self.cfg.trainer
        valid = self.validation()
        s.last_valid = valid.record()
        # a non-finite validation (an fp16 overflow) is never the best
        if math.isfinite(valid.loss) and (s.best_valid_loss is None or valid.loss < s.best_valid_loss):
            s.best_valid_loss = valid.loss
        if math.isfinite(valid.nll_loss) and (s.best_valid_nll is None or valid.nll_loss < s.best_valid_nll):
            s.best_valid_nll = valid.nll_loss
        rule = t.early_stop
        if rule.window > 0 and math.isfinite(valid.loss) and (
                s.stop_reference is None or valid.loss < s.stop_reference - rule.min_delta):
            s.stop_reference, s.stop_reference_step = valid.loss, s.step
        if t.best_checkpoint_metric in ("loss", "bleu"):
            # every rank gathers, whether or not its own value is a new best: a rank's BLEU could
            # differ from the main rank's, and a collective some ranks skip would hang the others
            self.gather_rng()
            value = valid.loss if t.best_checkpoint_metric == "loss" else valid.bleu
            if value is None:
                raise ValueError("best_checkpoint_metric=bleu needs the trainer's valid_bleu scorer")
            sign = 1.0 if t.best_checkpoint_metric == "loss" else -1.0
            if math.isfinite(value) and (s.best_metric is None or sign * value < sign * s.best_metric):
                s.best_metric = value
                self._callbacks("on_best")
            self._rng_ranks = None
        self._callbacks("on_record", {"split": "valid", "step": s.step, "epoch": s.pos.epoch,
                                      "lr": lr, **valid.record()})
        log.info("valid at update %d: loss %.4f  nll %.4f  ppl %.2f", s.step, valid.loss,
                 valid.nll_loss, valid.ppl)

    def should_stop(self) -> bool:
        """trainer.early_stop after the validation at this update: the last improvement is
        `window` or more updates back and the run has reached `min_updates`. Every rank takes
        the same decision (the validation loss is reduced over all ranks)."""
        s, rule = self.state, self.cfg.trainer.early_stop
        return (rule.window > 0 and s.step >= rule.min_updates
                and s.stop_reference_step is not None
                and s.step - s.stop_reference_step >= rule.window)

    def gather_rng(self) -> None:
        """Every rank's RNG streams, for the checkpoint that follows (all ranks call this)."""
        if self.world > 1:
            self._rng_ranks = [None] * self.world
            dist.all_gather_object(self._rng_ranks, rng_state(self.device))
        else:
            self._rng_ranks = None

    def checkpoint(self, numbered: bool = True) -> None:
        """Save (the callbacks write the files); numbered=False: checkpoint_last.pt only."""
        self.gather_rng()
        self.checkpoint_numbered = numbered
        try:
            self._callbacks("on_checkpoint")
        finally:
            self.checkpoint_numbered = True
        self._rng_ranks = None  # a later state_dict() without a gather takes this rank's own state
        if self.world > 1:
            dist.barrier()
        self._last_save = time.monotonic()

    def _stop_or_save(self, at_log: bool) -> tuple[Optional[int], bool]:
        """After an update: (the stop signal to act on now, or None; whether a time-based save
        is due), the same on every rank. One process acts on a stop after any update; DDP ranks
        agree at the end of a log window (one small all-reduce there), as they do on time-based
        saves, which come at the end of a log window in any case."""
        t = self.cfg.trainer
        due = (at_log and t.save_interval_min > 0
               and time.monotonic() - self._last_save >= 60.0 * t.save_interval_min)
        if self.world == 1:
            return self.stop_signal, due
        if not at_log:
            return None, False
        flags = self.all_reduce(torch.tensor([float(self.stop_signal or 0), float(due)],
                                             device=self.device), "max").tolist()
        return (int(flags[0]) or None), flags[1] > 0

    # ---- checkpoint state
    def state_dict(self) -> dict:
        s = self.state
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "overflows": self.loss_scale.overflow_count() if self.loss_scale is not None else 0,
            "schedule": {"step": s.step},  # the lr is a pure function of the step
            "step": s.step, "epoch": s.pos.epoch, "epoch_index": s.pos.index,
            "best_valid_loss": s.best_valid_loss, "best_valid_nll": s.best_valid_nll,
            "best_metric": s.best_metric, "train_tokens": s.train_tokens,
            "train_seconds": s.train_seconds, "wall_s": self.wall_s(),
            "bad_streak": s.bad_streak, "last_train_loss": s.last_train_loss,
            "last_valid": s.last_valid,
            "early_stop": {"reference_loss": s.stop_reference, "reference_step": s.stop_reference_step,
                           "stopped": s.stopped_early},
            "initial_loss": s.initial_loss, "first_logged_loss": s.first_logged_loss,
            # a checkpoint written inside a log window (a stop): the window's sums and the
            # divergence counters, so that the resumed run logs what an uninterrupted one does
            "pending": ({"window": self.window.state_dict(), "monitor": self.monitor.state_dict()}
                        if self.window is not None and self.window.updates else None),
            # each rank's RNG streams (gathered in checkpoint() and before on_best), so that every
            # rank of a resumed DDP run continues its own dropout masks
            "rng_ranks": self._rng_ranks or [rng_state(self.device)],
            "config": asdict(self.cfg),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        if self.loss_scale is not None:
            self.loss_scale.load_state_dict({"overflows": state.get("overflows", 0)})
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
        stop = state.get("early_stop") or {}  # absent from checkpoints written before the rule
        s.stop_reference, s.stop_reference_step = stop.get("reference_loss"), stop.get("reference_step")
        s.stopped_early = bool(stop.get("stopped", False))
        s.initial_loss, s.first_logged_loss = state.get("initial_loss"), state.get("first_logged_loss")
        self._pending = state.get("pending")
        ranks = state.get("rng_ranks") or [state["rng"]]  # "rng": the main rank's, in older checkpoints
        if len(ranks) != self.world:
            log.warning("the checkpoint holds the RNG streams of %d process(es) and this run has %d: "
                        "dropout continues from the main rank's stream, so the run does not "
                        "repeat an uninterrupted one exactly", len(ranks), self.world)
        set_rng_state(ranks[self.rank] if len(ranks) == self.world else ranks[0], self.device)

    def wall_s(self) -> float:
        return self.state.wall_before + time.time() - self.t0

    # ---- the run
    def _log_window(self, window: "TrainWindow", lr: float, progress, task) -> None:
        """The train record of the updates since the last one (metrics.jsonl, the progress bar,
        a log line where no live bar is drawn)."""
        s, t = self.state, self.cfg.trainer
        record = window.record(self, lr)
        s.last_train_loss = record["loss"]
        if s.first_logged_loss is None and s.step <= t.log_interval:
            s.first_logged_loss = record["loss"]
        self._callbacks("on_record", record)
        progress.update(task, loss=f"{record['loss']:.3f}", lr=f"{lr:.2e}",
                        tps=f"{record['tokens_per_s']:,.0f}")
        if not progress.live.is_started or progress.disable:
            log.info("update %d/%d  loss %.4f  lr %.3e  gnorm %.2f  %.0f tok/s",
                     s.step, t.max_updates, record["loss"], lr, record["grad_norm"],
                     record["tokens_per_s"])

    def run(self) -> Outcome:
        """Update until max_updates (or max_epochs), divergence, or trainer.early_stop. Logs a
        train record every trainer.log_interval updates, validates every valid_interval and
        checkpoints every save_interval (and both at the end). Besides, checkpoint_last.pt alone
        is saved at the end of a log window once trainer.save_interval_min minutes have passed
        since the last save, and after the update under way when `stop_signal` is set, which
        then raises Stopped."""
        cfg, t, s = self.cfg, self.cfg.trainer, self.state
        outcome = Outcome()
        window = TrainWindow(self.device)
        monitor = DivergenceMonitor(self.device, s.bad_streak, t.divergence.loss_bound,
                                    t.divergence.patience, self.loss_scale)
        if self._pending:  # resumed inside a log window
            window.load_state_dict(self._pending["window"])
            monitor.load_state_dict(self._pending["monitor"])
            self._pending = None
        self.window, self.monitor = window, monitor
        self._last_save = time.monotonic()
        self.model.train()
        lr = lr_at(s.step, cfg)
        with progress_bar(t.progress if self.is_main else False) as progress:
            task = progress.add_task("train", total=t.max_updates, completed=s.step, loss="-",
                                     lr="-", tps="-")
            while (s.step < t.max_updates and not s.stopped_early
                   and (t.max_epochs == 0 or s.pos.epoch <= t.max_epochs)):
                tick = time.perf_counter()
                out = self.step()
                lr = out.lr
                if s.step == 1:  # the loss under the initial weights, as update 1 computed it
                    s.initial_loss = float(self.all_reduce(out.loss_sum.clone())) / out.tokens
                window.add(out)
                monitor.add(out.loss_sum * (self.world / out.tokens), out.skipped)  # this rank's share
                at_log = s.step % t.log_interval == 0 or s.step == t.max_updates
                checks = at_log or s.step % t.divergence.check_interval == 0
                if checks and self.device.type == "cuda":
                    # the check below waits for the GPU anyway; waiting here first puts the GPU's
                    # backlog of queued updates into the timed seconds, so tokens/s is the GPU's
                    torch.cuda.synchronize(self.device)
                elapsed = time.perf_counter() - tick
                window.seconds += elapsed
                s.train_tokens += out.tokens
                s.train_seconds += elapsed
                progress.update(task, completed=s.step)

                if checks:
                    outcome = monitor.check(self)
                    s.bad_streak = monitor.bad_streak
                if at_log or outcome.status != "ok":
                    self._log_window(window, lr, progress, task)
                if outcome.status != "ok":
                    log.warning("diverged at update %d: %s", s.step, outcome.reason)
                    break
                done = s.step >= t.max_updates
                if (t.valid_interval and s.step % t.valid_interval == 0) or done:
                    self.validate(lr)
                    if not done and self.should_stop():
                        s.stopped_early = done = True
                        log.info("early stop at update %d: the validation loss has not dropped more "
                                 "than %g below %.4f (update %d) in %d updates",
                                 s.step, t.early_stop.min_delta, s.stop_reference,
                                 s.stop_reference_step, s.step - s.stop_reference_step)
                        if not at_log:  # the window's updates since the last record
                            self._log_window(window, lr, progress, task)
                stop, due = self._stop_or_save(at_log)
                if (t.save_interval and s.step % t.save_interval == 0) or done:
                    self.checkpoint()
                elif stop is not None or due:  # checkpoint_last.pt only: averaging is unchanged
                    self.checkpoint(numbered=False)
                if stop is not None:
                    raise Stopped(stop, s.step)
            if outcome.status == "ok" and s.step < t.max_updates and not s.stopped_early:  # max_epochs
                self.validate(lr_at(s.step, cfg))
                self.checkpoint()
        return outcome


class TrainWindow:
    """Sums over one log window, kept on the device: no host sync per update on CUDA, read
    only when a record is made. Updates the fp16 loss scaler skipped count for throughput but
    not for the loss and gradient norm (as fairseq drops an overflowed step's logging outputs):
    their values are inf/nan, and no weight changed."""

    def __init__(self, device: torch.device):
        self.loss = torch.zeros((), device=device)
        self.nll = torch.zeros((), device=device)
        self.grad_norm = torch.zeros((), device=device)
        self.tokens, self.updates, self.seconds = 0, 0, 0.0
        # fp16: target tokens and updates of the window that the scaler did not skip (device)
        self.kept_tokens: Optional[torch.Tensor] = None
        self.kept_updates: Optional[torch.Tensor] = None

    def add(self, out: StepOutput) -> None:
        if out.skipped is None:
            self.loss += out.loss_sum
            for part in out.nll_parts:  # one by one: the order float sums were always in
                self.nll += part
            self.grad_norm += out.grad_norm.detach().float()
        else:
            keep = out.skipped == 0
            self.loss += torch.where(keep, out.loss_sum, 0.0)
            for part in out.nll_parts:
                self.nll += torch.where(keep, part, 0.0)
            self.grad_norm += torch.where(keep, out.grad_norm.detach().float(), 0.0)
            tokens, updates = keep.long() * out.tokens, keep.long()  # no host-to-device copy
            if self.kept_tokens is None:
                self.kept_tokens, self.kept_updates = tokens, updates
            else:
                self.kept_tokens, self.kept_updates = self.kept_tokens + tokens, self.kept_updates + updates
        self.tokens += out.tokens
        self.updates += 1

    def state_dict(self) -> dict:
        """The window so far (a checkpoint written inside it): its sums, bit for bit."""
        on_host = lambda x: None if x is None else x.detach().cpu()  # noqa: E731
        return {"loss": on_host(self.loss), "nll": on_host(self.nll), "grad_norm": on_host(self.grad_norm),
                "tokens": self.tokens, "updates": self.updates, "seconds": self.seconds,
                "kept_tokens": on_host(self.kept_tokens), "kept_updates": on_host(self.kept_updates)}

    def load_state_dict(self, state: dict) -> None:
        to_device = lambda x: None if x is None else x.to(self.loss.device)  # noqa: E731
        self.loss, self.nll = to_device(state["loss"]), to_device(state["nll"])
        self.grad_norm = to_device(state["grad_norm"])
        self.tokens, self.updates, self.seconds = state["tokens"], state["updates"], state["seconds"]
        self.kept_tokens, self.kept_updates = to_device(state["kept_tokens"]), to_device(state["kept_updates"])

    def record(self, trainer: Trainer, lr: float) -> dict:
        """The window's train record (per-token means over all ranks); starts a new window."""
        sums = trainer.all_reduce(torch.stack([self.loss, self.nll]))
        s = trainer.state
        tokens, updates = self.tokens, self.updates
        if self.kept_tokens is not None:  # fp16: only the updates that trained (nan if none did)
            tokens, updates = int(self.kept_tokens), int(self.kept_updates)
        record = {
            "split": "train", "step": s.step, "epoch": s.pos.epoch,
            "loss": float(sums[0]) / tokens if tokens else math.nan,
            "nll_loss": float(sums[1]) / tokens if tokens else math.nan,
            "lr": lr, "grad_norm": float(self.grad_norm) / updates if updates else math.nan,
            "tokens_per_s": self.tokens / max(self.seconds, 1e-9),
            "wall_s": trainer.wall_s(),
        }
        if trainer.loss_scale is not None:  # fp16: what fairseq logs as loss_scale
            record["loss_scale"] = trainer.loss_scale.scale()
            record["overflows"] = trainer.loss_scale.overflow_count()
        self.loss.zero_(); self.nll.zero_(); self.grad_norm.zero_()
        self.tokens, self.updates, self.seconds = 0, 0, 0.0
        self.kept_tokens = self.kept_updates = None
        return record


class DivergenceMonitor:
    """A run diverges when its loss becomes non-finite, or stays above `bound` nats per token for
    `patience` consecutive updates (trainer.divergence). Counted on the device; checked every
    trainer.divergence.check_interval updates, when the ranks agree. With fp16 loss scaling a
    non-finite loss in an update the scaler skipped is an overflow, not a divergence (a
    non-finite loss whose gradients were finite, so that the update was applied, still is); such
    a run diverges when the scale falls below trainer.min_loss_scale (runner/train/loss_scale.py)."""

    def __init__(self, device: torch.device, bad_streak: float, bound: float, patience: int,
                 loss_scale: Optional[LossScaleMonitor] = None):
        self.bound, self.patience, self.loss_scale = bound, patience, loss_scale
        self.streak = torch.tensor(bad_streak, device=device)
        self.max_streak = torch.zeros((), device=device)
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=device)

    def add(self, loss_per_token: torch.Tensor, skipped: Optional[torch.Tensor] = None) -> None:
        bad = ~torch.isfinite(loss_per_token)
        if skipped is not None:  # fp16: the scaler skipped this update
            bad = bad & (skipped == 0)
        self.nonfinite |= bad
        self.streak = (self.streak + 1) * (loss_per_token > self.bound)
        self.max_streak = torch.maximum(self.max_streak, self.streak)

    @property
    def bad_streak(self) -> float:
        return float(self.streak)

    def state_dict(self) -> dict:
        """The counters since the last check (a checkpoint written between checks)."""
        return {"streak": self.streak.detach().cpu(), "max_streak": self.max_streak.detach().cpu(),
                "nonfinite": self.nonfinite.detach().cpu()}

    def load_state_dict(self, state: dict) -> None:
        device = self.streak.device
        self.streak, self.max_streak = state["streak"].to(device), state["max_streak"].to(device)
        self.nonfinite = state["nonfinite"].to(device)

    def check(self, trainer: Trainer) -> Outcome:
        if trainer.world > 1:  # ranks agree on divergence
            flags = trainer.all_reduce(torch.stack([self.nonfinite.float(), self.max_streak]), "max")
            self.nonfinite, self.max_streak = flags[0] > 0, flags[1]
        step = trainer.state.step
        if bool(self.nonfinite):
            return Outcome("diverged", "non-finite loss (nan/inf)", step)
        if float(self.max_streak) >= self.patience:
            return Outcome("diverged", f"loss above {self.bound} for {self.patience} consecutive updates", step)
        if self.loss_scale is not None and self.loss_scale.collapsed():
            return Outcome("diverged", f"fp16 loss scale {self.loss_scale.scale():.3g} fell below "
                                       f"trainer.min_loss_scale={self.loss_scale.min_scale:g} "
                                       f"({self.loss_scale.overflow_count()} updates overflowed)", step)
        return Outcome()
