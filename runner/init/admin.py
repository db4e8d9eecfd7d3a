"""`init=admin`: Admin (Liu et al., EMNLP 2020, Understanding the Difficulty of Training Transformers,
Sec. 4.3) in the profiling form of LiyuanLucasLiu/Transformer-Clinic (init_type adaptive-profiling,
fairseq/fairseq/modules/transformer_layer.py), done in one run: the default Xavier model, then one
forward+backward of the first training batch in train mode that sets each sublayer's shortcut scale
omega from the running output variance. No update happens; the gradients are dropped."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from runner.config import InitConfig
from runner.config.options import options
from runner.init.base import InitScheme
from runner.init.common import fairseq_xavier
from runner.model.loss import NO_PAD, label_smoothed_nll
from runner.model.sublayer import ResidualSpec


@options
@dataclass
class AdminOptions(InitConfig):
    # how omega is held: vector (a trainable d-vector, the reference), scalar (one trainable
    # value per sublayer), constant (a buffer); admin_torch reads it too
    omega: Literal["vector", "scalar", "constant"] = "vector"


def residual_for(omega_mode: str) -> ResidualSpec:
    """init.omega: vector = trainable d-vector (Transformer-Clinic), scalar = one trainable scalar
    per sublayer, constant = a fixed d-vector (not trained)."""
    return ResidualSpec(omega_trainable=omega_mode != "constant",
                        omega_vector=omega_mode != "scalar")


def population_var(t: torch.Tensor) -> float:
    # np.var over every element of the flattened tensor, padding included, in fp32 (Transformer-Clinic)
    return float(t.detach().float().reshape(-1).var(unbiased=False))


class Profiler:
    """Forward hooks that run the Transformer-Clinic profiling walk while the model computes:
    before sublayer k, omega_k := acc; after it, acc := sqrt(Var[omega_k * x_in] + Var[F_k(x_in)]),
    with one accumulator per stack starting at 1."""

    def __init__(self, model):
        self.acc = {"encoder": 1.0, "decoder": 1.0}
        self.omegas: dict[str, float] = {}
        self.handles = []
        self._x_in = self._branch = None
        for ref in model.sublayers():
            sub = ref.module
            self.handles.append(sub.register_forward_pre_hook(self._before(ref)))
            # F_k is measured after the residual dropout (and after the layer's alpha, which is 1).
            self.handles.append(sub.dropout.register_forward_hook(self._capture_branch(ref)))
            self.handles.append(sub.register_forward_hook(self._after(ref)))

    def _before(self, ref):
        def hook(module, args):
            with torch.no_grad():
                module.omega.fill_(self.acc[ref.side])
            self.omegas[ref.name] = self.acc[ref.side]
            self._x_in = args[0].detach()
        return hook

    def _capture_branch(self, ref):
        def hook(module, args, output):
            # Detached: nothing the hooks compute may enter the autograd graph (activation
            # checkpointing compares the saved tensors of forward and recomputation).
            self._branch = output.detach() * ref.alpha.detach()
        return hook

    def _after(self, ref):
        def hook(module, args, output):
            shortcut = self._x_in * module.omega.detach()
            self.acc[ref.side] = math.sqrt(population_var(shortcut) + population_var(self._branch))
            self._x_in = self._branch = None
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def profile(model, cfg, batch) -> dict[str, float]:
    """One forward+backward of `batch` in train mode with the profiling hooks; returns the
    omega of every sublayer by name, in forward order. task=lm's batch is (tokens, target)."""
    was_training = model.training
    model.train()
    profiler = Profiler(model)
    lm = cfg.task == "lm"
    try:
        logits = model(batch[0]) if lm else model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad)
    finally:
        # Before the backward: activation checkpointing re-runs forwards there.
        profiler.remove()
    target, pad, ntokens = ((batch[1], NO_PAD, batch[1].numel()) if lm else
                            (batch.target, model.pad_index, batch.ntokens))
    loss, _ = label_smoothed_nll(logits, target, cfg.trainer.label_smoothing, pad)
    (loss / ntokens).backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return profiler.omegas


class Admin(InitScheme):
    name = "admin"
    options = AdminOptions
    changes = ("*.omega",)  # the first sublayer of each stack keeps omega = 1, later ones change
    # the profiling walk keeps one accumulator per stack over its sublayers in forward order
    # (Liu et al. 2020, Sec. 4.3; Transformer-Clinic): a decoder-only stack is walked the same way
    tasks = ("translation", "lm")
    placements = ("post",)
    placement_hint = "Admin rescales the Post-LN shortcut"

    def residual(self, cfg) -> ResidualSpec:
        return residual_for(cfg.init.omega)

    def apply(self, model, cfg, batch=None) -> dict:
        return apply_admin(model, cfg, batch)


def apply_admin(model, cfg, batch) -> dict:
    if batch is None:
        raise ValueError("init=admin profiles the first training batch: pass it to apply()")
    fairseq_xavier(model, cfg)
    # the weights are final: with sigma-reparam, profile the model as it will start (gamma =
    # sigma(W_0)); runner.init.apply calls after_init again afterwards, with the same result
    model.after_init()
    omegas = profile(model, cfg, batch)
    return {"rule": "Admin profiling (Liu et al. 2020, Sec. 4.3; Transformer-Clinic "
                    "fairseq/fairseq/modules/transformer_layer.py), one forward+backward of the "
                    "first batch, train mode, no update",
            "omega_mode": cfg.init.omega, "omega": omegas}
