"""`init=layerscale`: LayerScale (Touvron, Cord, Sablayrolles, Synnaeve, Jegou, ICCV 2021, Going
deeper with Image Transformers (CaiT), Sec. 3, Eq. 2 and Fig. 1d): every residual branch is
multiplied channel by channel by a learnable diagonal matrix, x_{l+1} = x_l + diag(lambda_l)
F_l(LN(x_l)), one d-vector lambda per branch (CaiT's gamma_1 for attention and gamma_2 for the
FFN; here also one for the decoder's cross-attention), every entry initialized to a small epsilon
that depends on the depth. The vector is the sublayer's alpha slot built as a d-vector
(ResidualSpec.alpha_vector): under this scheme alone alpha has shape (dim,) instead of (1,) in the
state_dict. Weights are the default Xavier.

Which depth picks epsilon is `init.layerscale_depth`: per_stack (the default) counts the layers of
the lambda's own stack (the encoder's lambdas use the encoder's layer count, the decoder's its
own; 0.1 at 12+12), total counts both stacks (24 at 12+12, so 1e-5). CaiT is one stack of
encoder blocks, so its "depth" does not settle which reading an encoder-decoder takes: per_stack
reads it as the depth of the residual stream lambda sits on (each stack is its own stream), total
as the model's depth; docs/methods.md (layerscale) quotes the paper.

Defined for norm=pre (the paper's Pre-LN blocks) and norm=sandwich (Pre-LN with a norm on
the branch output; lambda scales that normed output before the add). Post-LN is not allowed: a
norm after the add rescales x + diag(lambda) F whole, so lambda no longer sets the branch's share
of the stream, and norm=none is ReZero/SkipInit territory without the normalization CaiT keeps."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from runner.config import InitConfig
from runner.config.options import options
from runner.init.base import InitScheme
from runner.init.common import fairseq_xavier, stack_sides
from runner.model.sublayer import ResidualSpec


@options
@dataclass
class LayerScaleOptions(InitConfig):
    # the depth epsilon is read from: per_stack (each stack's own layer count, the default) or
    # total (encoder + decoder layers)
    layerscale_depth: Literal["per_stack", "total"] = "per_stack"


def stack_depths(model, depth: str) -> dict[str, int]:
    """The depth each stack's epsilon is read from (init.layerscale_depth): per_stack, the
    stack's own layer count; total, the layers of every stack the model has (the decoder-only
    LM has one)."""
    per_stack = {"encoder": model.cfg.num_encoder_layers, "decoder": model.cfg.num_decoder_layers}
    if depth == "per_stack":
        return per_stack
    total = sum(per_stack[side] for side in {ref.side for ref in model.sublayers()})
    return {side: total for side in per_stack}


def layerscale_epsilon(depth: int) -> float:
    """lambda's initial value for a stack of `depth` layers."""
    # Touvron et al. 2021, Sec. 3: "we fix epsilon to 0.1 for depth up to 18, 10^-5 for depth 24
    # and 10^-6 for deeper networks" (depths 19-23, between the paper's cases, take 10^-5)
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


class LayerScale(InitScheme):
    # CaiT's rule is stated for one stack of layers (Touvron et al. 2021, Sec. 3): the LM's stack
    # is that case, with epsilon picked by its depth (stack_depths)
    tasks = ("translation", "lm")
    name = "layerscale"
    options = LayerScaleOptions
    changes = ("*.alpha",)  # lambda = eps(depth), a d-vector per branch
    placements = ("pre", "sandwich")
    placement_hint = "LayerScale scales the branch of a Pre-LN residual block (CaiT)"

    def residual(self, cfg) -> ResidualSpec:
        # a trained d-vector per residual branch (CaiT's gamma_1/gamma_2 are per block branch)
        return ResidualSpec(alpha_trainable=True, alpha_per_layer=False, alpha_vector=True)

    @torch.no_grad()
    def apply(self, model, cfg, batch=None) -> dict:
        fairseq_xavier(model, cfg)
        sides = stack_sides(model)  # init.json reports the stacks the model has
        depths = {side: depth for side, depth in stack_depths(model, cfg.init.layerscale_depth).items()
                  if side in sides}
        epsilon = {side: layerscale_epsilon(depth) for side, depth in depths.items()}
        for ref in model.sublayers():
            ref.alpha.fill_(epsilon[ref.side])
        return {"rule": "LayerScale (Touvron et al. 2021, CaiT, Sec. 3, Eq. 2): alpha = "
                        "diag(lambda) per residual branch, lambda = eps(depth) * 1, trained",
                "depth": depths, "epsilon": epsilon}
