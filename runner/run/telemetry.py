"""Instability telemetry (trainer.telemetry_interval = N > 0; docs/training.md "Telemetry").

`Telemetry` is a train-loop Callback. Every N-th update it attaches forward hooks for that one
update and emits a record with split "telemetry" (metrics.jsonl, TensorBoard), lists aligned
with its "sublayers" names (model.sublayers() order: encoder layers, then decoder layers; a
task=lm model has the decoder's only, and no padding: every position of a block is real):

- max_abs: max |x| of each residual sublayer's output (the residual stream after it), over the
  real (non-pad) tokens of this rank's micro-batches of the update, dropout as trained.
- attn_entropy / attn_max_logit (attention sublayers; null for ffn), one value per head: the mean
  over real query positions of -sum_k p log p, and the max logit over real queries and the keys
  they attend, of the attention probabilities p = softmax(q k^T * scale + masks). The kernels
  never materialize p, so for this update the logits are recomputed from the attention module's
  inputs (MultiheadAttention.observed_logits: the same projections, QK-norm, scale and masks, in
  float32); they equal the kernel's up to rounding, and p is before attention dropout.
- loss_scale, overflows (trainer.precision=fp16 only): the GradScaler's scale after the update,
  and the updates so far whose scale dropped (gradients overflowed, the step was skipped).

Every update (not only the N-th), a finiteness check on each embedding and sublayer output, the
loss and (without fp16 loss scaling) the gradient norm finds the first non-finite value, on the
device without a host sync: `first_nonfinite()` -> {"update": k, "where": "decoder.3.ffn"}
("encoder.embed" / "decoder.embed", a sublayer name, "loss" when every sublayer output was
finite but the loss was not, "backward" when the forward and the loss were finite and the
gradients were not). It is found while training, not by a rerun after the divergence: once a
non-finite gradient reaches the optimizer every weight is non-finite, so a rerun of the failing
batch could only point at the first sublayer.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from runner.train.loop import Callback, StepOutput, Trainer

LOSS, BACKWARD = "loss", "backward"
ATTENTION_KINDS = ("self_attn", "cross_attn")


def attention_stats(logits: torch.Tensor, allowed: Optional[torch.Tensor],
                    query_keep: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per head, over the real queries (query_keep (B, Tq), True = real; None = all): the sum of
    the attention entropies -sum_k p log p, the number of queries, and the max logit over the
    keys they may attend (allowed, True = attend). logits (B, H, Tq, Tk) float32."""
    masked = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(masked, dim=-1)
    entropy = -torch.special.xlogy(p, p).sum(-1)  # (B, H, Tq); masked keys have p = 0
    b, h, tq, _ = logits.shape
    keep = (torch.ones(b, tq, dtype=torch.bool, device=logits.device) if query_keep is None
            else query_keep.to(logits.device))
    rows = keep[:, None, :]  # (B, 1, Tq): real queries that attend some key (others have no p)
    if allowed is not None:
        rows = rows & allowed.any(-1)  # broadcasts as allowed does
    rows = rows.expand(b, h, tq)
    entropy_sum = torch.where(rows, entropy, 0.0).sum((0, 2))  # a nan logit keeps its nan
    count = rows.sum((0, 2)).to(entropy.dtype)
    max_logit = masked.masked_fill(~keep[:, None, :, None], float("-inf")).amax((0, 2, 3))
    return entropy_sum, count, max_logit


def _real(x: torch.Tensor, keep: Optional[torch.Tensor]) -> torch.Tensor:
    """The real-token rows of a sublayer output: packed (N, D) outputs hold only those; padded
    (B, T, D) ones are selected with keep (B, T)."""
    if x.dim() == 3 and keep is not None and keep.shape == x.shape[:2]:
        return x[keep]
    return x


class Telemetry(Callback):
    """See the module docstring. `model` is the unwrapped Seq2Seq or DecoderOnlyLM (hooks go on
    its modules); `pad` is None for a DecoderOnlyLM (blocks of running text have no padding)."""

    def __init__(self, model: nn.Module, interval: int, pad: Optional[int], fp16: bool = False):
        self.model, self.interval, self.pad, self.fp16 = model, interval, pad, fp16
        self.refs = list(model.sublayers())
        self.names = [ref.name for ref in self.refs]
        self.watching = False  # inside a train update (validation and decoding are not watched)
        self.measuring = False  # inside a telemetry update
        self.keep: dict[str, Optional[torch.Tensor]] = {"encoder": None, "decoder": None}
        self.calls: list[int] = []  # name index of each watched output, in forward order
        self.flags: list[torch.Tensor] = []  # its non-finite flag (a device bool)
        self.where_names = ["encoder.embed", "decoder.embed", *self.names, LOSS, BACKWARD]
        self.ids_cache: dict[tuple[int, ...], torch.Tensor] = {}
        self.first_update: Optional[torch.Tensor] = None  # device ints, -1 until found
        self.first_where: Optional[torch.Tensor] = None
        self.measure_handles: list = []
        self.handles = [model.register_forward_pre_hook(self._batch, with_kwargs=True)]
        for index, side in enumerate(("encoder", "decoder")):  # an LM has the decoder side only
            if hasattr(model, side):
                stack = getattr(model, side)
                self.handles.append(stack.embedder.register_forward_hook(self._finite(index, None)))
        for i, ref in enumerate(self.refs):
            self.handles.append(ref.module.register_forward_hook(self._finite(i + 2, ref.side)))

    def remove(self) -> None:
        for handle in self.handles + self.measure_handles:
            handle.remove()
        self.handles, self.measure_handles = [], []

    # ---- hooks
    def _batch(self, module, args, kwargs):
        if self.watching and self.pad is not None:  # task=lm: no padding, every position is real
            src = args[0] if args else kwargs["src_tokens"]
            prev = args[1] if len(args) > 1 else kwargs["prev_tokens"]
            self.keep = {"encoder": src != self.pad, "decoder": prev != self.pad}

    def _finite(self, index: int, side: Optional[str]):
        def hook(module, args, output):
            if not self.watching:
                return
            out = output.detach()
            self.calls.append(index)
            self.flags.append(~torch.isfinite(out).all())
            if self.measuring and side is not None:
                i = index - 2
                value = _real(out, self.keep[side]).abs().amax().float()
                self.max_abs[i] = torch.maximum(self.max_abs[i], value)
        return hook

    def _attention(self, i: int, side: str):
        def hook(module, args, kwargs, output):
            if not self.measuring:
                return
            with torch.no_grad():
                kwargs = {k: v for k, v in kwargs.items() if k != "cache"}
                # Recomputing q and k must not advance state the training owns (sigma-reparam's
                # power-iteration vector u moves on every train-mode call): keep the buffers.
                saved = [(b, b.clone()) for b in module.buffers()]
                logits, allowed = module.observed_logits(args[0], **kwargs)
                for buffer, value in saved:
                    buffer.copy_(value)
                ent, count, max_logit = attention_stats(logits, allowed, self.keep[side])
            self.entropy_sum[i] += ent
            self.count[i] += count
            self.max_logit[i] = torch.maximum(self.max_logit[i], max_logit)
        return hook

    # ---- the loop's hooks
    def on_step_start(self, trainer: Trainer) -> None:
        self.watching = True
        self.calls, self.flags = [], []
        if (trainer.state.step + 1) % self.interval == 0:
            self._start_measuring(trainer.device)

    def _start_measuring(self, device: torch.device) -> None:
        self.measuring = True
        n = len(self.refs)
        self.max_abs = [torch.zeros((), device=device) for _ in range(n)]
        self.entropy_sum, self.count, self.max_logit = {}, {}, {}
        for i, ref in enumerate(self.refs):
            if ref.kind in ATTENTION_KINDS:
                heads = ref.module.branch.heads
                self.entropy_sum[i] = torch.zeros(heads, device=device)
                self.count[i] = torch.zeros(heads, device=device)
                self.max_logit[i] = torch.full((heads,), float("-inf"), device=device)
                self.measure_handles.append(ref.module.branch.register_forward_hook(
                    self._attention(i, ref.side), with_kwargs=True))

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        self.watching = False
        self._locate(trainer, out)
        if self.measuring:
            self.measuring = False
            for handle in self.measure_handles:
                handle.remove()
            self.measure_handles = []
            trainer.emit_record(self._record(trainer))

    def _locate(self, trainer: Trainer, out: StepOutput) -> None:
        """Keeps the update and place of the first non-finite value, on the device."""
        flags = list(self.flags) + [~torch.isfinite(out.loss_sum)]
        calls = list(self.calls) + [len(self.where_names) - 2]
        if not self.fp16:  # with loss scaling, overflowing gradients are skipped, not fatal
            flags.append(~torch.isfinite(out.grad_norm))
            calls.append(len(self.where_names) - 1)
        key = tuple(calls)
        if key not in self.ids_cache:
            self.ids_cache[key] = torch.tensor(calls, device=out.loss_sum.device)
        bad = torch.stack([f.to(out.loss_sum.device) for f in flags])
        where = self.ids_cache[key][bad.int().argmax()]  # argmax: the first True
        if self.first_update is None:
            self.first_update = torch.full((), -1, device=bad.device)
            self.first_where = torch.full((), -1, device=bad.device)
        new = bad.any() & (self.first_update < 0)
        self.first_update = torch.where(new, trainer.state.step, self.first_update)
        self.first_where = torch.where(new, where, self.first_where)

    def _record(self, trainer: Trainer) -> dict:
        s = trainer.state
        entropy, max_logit = [], []
        for i in range(len(self.refs)):
            if i in self.entropy_sum:
                entropy.append((self.entropy_sum[i] / self.count[i].clamp(min=1)).tolist())
                max_logit.append(self.max_logit[i].tolist())
            else:
                entropy.append(None)
                max_logit.append(None)
        record = {"split": "telemetry", "step": s.step, "epoch": s.pos.epoch,
                  "sublayers": self.names,
                  "max_abs": [float(v) for v in self.max_abs],
                  "attn_entropy": entropy, "attn_max_logit": max_logit}
        if trainer.loss_scale is not None:  # fp16 (runner/train/loss_scale.py)
            record["loss_scale"] = trainer.loss_scale.scale()
            record["overflows"] = trainer.loss_scale.overflow_count()
        return record

    def first_nonfinite(self) -> Optional[dict]:
        """{"update": k, "where": name} of the first non-finite value seen, or None."""
        if self.first_update is None or int(self.first_update) < 0:
            return None
        return {"update": int(self.first_update), "where": self.where_names[int(self.first_where)]}
