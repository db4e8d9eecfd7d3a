"""Forward/backward recorders for the analysis commands.

They attach to the model's typed surface (`model.sublayers()`, the Sublayer slots `dropout` and
`post_norm`, the encoder embedder) with PyTorch hooks and never change model code or select
tensors by parameter name. Everything recorded is detached, so the hooks cannot alter the
computation they observe; `remove()` (or leaving the `with` block) takes them all off.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from runner.model.seq2seq import SublayerRef


@dataclass
class SublayerRecord:
    ref: SublayerRef
    x_in: Optional[torch.Tensor] = None  # sublayer input (the shortcut before omega)
    branch: Optional[torch.Tensor] = None  # branch output after branch_norm and dropout, before alpha
    sum_in: Optional[torch.Tensor] = None  # omega*x + alpha*branch (+ layer input, B2T): post_norm input
    out: Optional[torch.Tensor] = None  # sublayer output
    grad_out: Optional[torch.Tensor] = None  # dLoss/d(out), after backward


class _Hooks:
    def __init__(self):
        self.handles = []

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class SublayerRecorder(_Hooks):
    """Records, for every residual branch in forward order, what `keep` names of
    {"x_in", "branch", "sum_in", "out", "grad_out"} during the next forward (and backward).
    One forward per recording: a second forward overwrites the first."""

    def __init__(self, model, keep=("x_in", "branch", "sum_in", "out", "grad_out")):
        super().__init__()
        self.keep = set(keep)
        self.records: dict[str, SublayerRecord] = {}
        for ref in model.sublayers():
            rec = self.records[ref.name] = SublayerRecord(ref)
            sub = ref.module
            self.handles.append(sub.register_forward_pre_hook(self._pre(rec)))
            self.handles.append(sub.dropout.register_forward_hook(self._branch(rec)))
            self.handles.append(sub.post_norm.register_forward_pre_hook(self._sum(rec)))
            self.handles.append(sub.register_forward_hook(self._post(rec)))

    def _pre(self, rec):
        def hook(module, args):
            if "x_in" in self.keep:
                rec.x_in = args[0].detach()
        return hook

    def _branch(self, rec):
        def hook(module, args, output):
            if "branch" in self.keep:
                rec.branch = output.detach()
        return hook

    def _sum(self, rec):
        def hook(module, args):
            if "sum_in" in self.keep:
                rec.sum_in = args[0].detach()
        return hook

    def _post(self, rec):
        def hook(module, args, output):
            if "out" in self.keep:
                rec.out = output.detach()
            if "grad_out" in self.keep and output.requires_grad:
                def save(grad, rec=rec):
                    rec.grad_out = grad.detach()
                output.register_hook(save)
        return hook

    def side(self, side: str) -> list[SublayerRecord]:
        return [r for r in self.records.values() if r.ref.side == side]


class EncoderEmbeddingGrad(_Hooks):
    """dLoss/d(encoder input-embedding rows), through the encoder's lookup only.

    The token table may be tied to the decoder and the output projection; its .grad then mixes
    all three. This recorder catches the gradient of the encoder's lookup output and scatters it
    onto token rows, which is the encoder input-embedding gradient of T-Fixup's Fig. 2."""

    def __init__(self, model):
        super().__init__()
        self.grad_rows: Optional[torch.Tensor] = None  # (rows in the batch, dim)
        self._in_encoder = False
        embedder = model.encoder.embedder
        self.handles.append(embedder.register_forward_pre_hook(self._enter))
        self.handles.append(embedder.register_forward_hook(self._leave))
        self.handles.append(embedder.tokens.register_forward_hook(self._lookup))

    def _enter(self, module, args):
        self._in_encoder = True

    def _leave(self, module, args, output):
        self._in_encoder = False

    def _lookup(self, module, args, output):
        if not self._in_encoder or not output.requires_grad:
            return
        tokens = args[0].detach()

        def save(grad):
            flat_tokens = tokens.reshape(-1)
            table = torch.zeros(module.num_embeddings, grad.shape[-1], dtype=grad.dtype,
                                device=grad.device)
            table.index_add_(0, flat_tokens, grad.detach().reshape(-1, grad.shape[-1]))
            rows = torch.unique(flat_tokens)
            rows = rows[rows != module.padding_idx] if module.padding_idx is not None else rows
            self.grad_rows = table[rows]
        output.register_hook(save)
