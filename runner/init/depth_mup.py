"""`init=depth_mup`: depth-wise hyperparameter transfer for Pre-LN stacks. Every residual branch
is multiplied by m^-a,

    x_{l+1} = x_l + m^-a F_l(x_l),   m = L / L_base   (L layers in the stack, L_base =
                                                        init.depth_mup_base_layers),

with a = init.depth_mup_exponent: 1/2 is Depth-muP (Yang, Yu, Zhu, Hayou, ICLR 2024, Tensor
Programs VI: Feature Learning in Infinite-Depth Neural Networks, the branch multiplier
a/sqrt(L)), 1 is CompleteP (Dey et al. 2025, Don't be lazy: CompleteP enables compute-efficient
deep transformers: h + L^-alpha F). The multiplier is the sublayer's alpha slot, frozen. The
optimizer gets matching corrections for the parameters inside the residual branches (the
branch's pre-norm, its weight matrices and biases, and any QK-norm or sigma-reparam gain in it),
per stack:

    Adam / RAdam:  lr * m^(a-1),  eps * m^-a
    SGD:           lr * m^(2a-1)

Embeddings, the final norms and the output projection keep lr and eps. The Adam rule is the
CompleteP code's (the paper links EleutherAI/nanoGPT-mup, branch completep; read here in the copy
clairez-cerebras/nanoGPT-mup @ 95aa846, model.py configure_optimizers: hidden weights, hidden
biases and in-block LayerNorms get lr_scale depth_multiplier**(depth_alpha_exp - 1), and the
Adam eps is multiplied by depth_multiplier**(-depth_alpha_exp)). The SGD
rule is derived here, not taken from either reference code: a branch parameter's gradient carries
m^-a and its effect on the stream another m^-a, summed over L ~ m branches, so lr m^(2a-1) keeps
the per-update feature change O(1) (for a = 1/2 the SGD lr is depth-independent, which is how
Depth-muP's SGD rule is usually stated; not checked against the paper's text here). At m = 1
every factor is exactly 1 and the model, init and updates are those of init=xavier norm=pre.

Deviations from the reference: eps is scaled only for the branch parameters (the reference
scales its one global eps, embeddings and final norm included, whose gradients carry no m^-a);
encoder and decoder each use their own m (the reference is a decoder-only stack). The init is the
default Xavier at every depth (Depth-muP keeps the hidden init variance independent of depth)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runner.config import InitConfig
from runner.init.base import InitScheme, ParamGroup
from runner.init.common import fairseq_xavier, stack_sides
from runner.model.sublayer import ResidualSpec


@dataclass
class DepthMuPOptions(InitConfig):
    # a in x_{l+1} = x_l + m^-a F_l(x_l): 0.5 Depth-muP (Yang et al., ICLR 2024), 1.0 CompleteP
    # (Dey et al. 2025); any a in [0.5, 1] accepted
    depth_mup_exponent: float = 0.5
    # L_base, the depth the learning rate was tuned at; 6 = the tiny preset's depth (the CPU default)
    depth_mup_base_layers: int = 6


def depth_multiplier(cfg, side: str) -> float:
    """m = L / L_base for the encoder or decoder stack."""
    layers = cfg.model.num_encoder_layers if side == "encoder" else cfg.model.num_decoder_layers
    return layers / cfg.init.depth_mup_base_layers


def branch_multiplier(cfg, side: str) -> float:
    """m^-a: the residual branch multiplier (nanoGPT-mup model.py Block residual_scaling)."""
    return depth_multiplier(cfg, side) ** -cfg.init.depth_mup_exponent


def lr_scale(cfg, side: str) -> float:
    """The branch parameters' learning-rate multiplier: m^(a-1) for Adam and RAdam (nanoGPT-mup
    model.py depth_lr_scaling), m^(2a-1) for SGD (see the module docstring)."""
    a = cfg.init.depth_mup_exponent
    exponent = 2 * a - 1 if cfg.optim.name == "sgd" else a - 1
    return depth_multiplier(cfg, side) ** exponent


def eps_scale(cfg, side: str) -> float:
    """The branch parameters' Adam eps multiplier: m^-a (nanoGPT-mup model.py:
    adam_eps *= depth_multiplier**(-depth_alpha_exp)); 1 for SGD, which has no eps."""
    if cfg.optim.name == "sgd":
        return 1.0
    return depth_multiplier(cfg, side) ** -cfg.init.depth_mup_exponent


def branch_parameters(ref) -> list:
    """The parameters inside one residual branch: pre-norm, branch (its projections, biases and
    any QK-norm or sigma-reparam gain), branch norm. Not omega and alpha (the residual scales,
    frozen here) nor a post-norm (on the stream, not in the branch)."""
    module = ref.module
    return [p for part in (module.pre_norm, module.branch, module.branch_norm)
            for p in part.parameters()]


class DepthMuP(InitScheme):
    tasks = ("translation", "lm")
    name = "depth_mup"
    options = DepthMuPOptions
    changes = ("*.alpha",)  # m^-a: 2 layers against the default base of 6 gives sqrt(3)
    placements = ("pre",)
    placement_hint = "Depth-muP and CompleteP are derived for Pre-LN residual stacks"

    def requirements(self, cfg) -> list[str]:
        a, base = cfg.init.depth_mup_exponent, cfg.init.depth_mup_base_layers
        problems = []
        if not 0.5 <= a <= 1.0:
            problems.append(f"init.depth_mup_exponent={a}: expected a value in [0.5, 1] "
                            "(0.5 Depth-muP, 1.0 CompleteP)")
        if base < 1:
            problems.append(f"init.depth_mup_base_layers={base}: expected the depth the lr was "
                            "tuned at, at least 1")
        return problems

    def residual(self, cfg) -> ResidualSpec:
        return ResidualSpec()  # alpha frozen; the scheme writes m^-a into it

    @torch.no_grad()
    def apply(self, model, cfg, batch=None) -> dict:
        fairseq_xavier(model, cfg)
        sides = stack_sides(model)  # init.json reports the stacks the model has
        multiplier = {side: branch_multiplier(cfg, side) for side in sides}
        for ref in model.sublayers():
            ref.alpha.fill_(multiplier[ref.side])
        return {"rule": "Depth-muP / CompleteP (Yang et al. 2024; Dey et al. 2025; nanoGPT-mup model.py): "
                        "x + m^-a F(x), m = L / L_base; branch parameters lr * m^(a-1) (SGD "
                        "m^(2a-1)), Adam eps * m^-a",
                "exponent": cfg.init.depth_mup_exponent,
                "base_layers": cfg.init.depth_mup_base_layers,
                "m": {side: depth_multiplier(cfg, side) for side in sides},
                "branch_multiplier": multiplier,
                "lr_scale": {side: lr_scale(cfg, side) for side in sides},
                "eps_scale": {side: eps_scale(cfg, side) for side in sides}}

    def param_groups(self, model, cfg) -> list[ParamGroup]:
        """One group per stack for the branch parameters, one for the rest (scales 1)."""
        groups = {side: ParamGroup(f"{side}_branches", [], lr_scale(cfg, side), eps_scale(cfg, side))
                  for side in ("encoder", "decoder")}
        seen: set[int] = set()
        for ref in model.sublayers():
            for p in branch_parameters(ref):
                if id(p) not in seen:
                    seen.add(id(p))
                    groups[ref.side].params.append(p)
        rest = ParamGroup("other", [p for p in model.parameters() if id(p) not in seen])
        return [groups["encoder"], groups["decoder"], rest]
