"""`init=deepnorm`: DeepNet (Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers):
Post-LN with the shortcut up-weighted by a constant alpha (written into omega, not trained) and
v/out/fc1/fc2 drawn Xavier-normal with gain beta (q/k gain 1), with the paper's encoder-decoder
constants, or its decoder-only ones under task=lm (Table 1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from runner.config import InitConfig
from runner.config.options import options
from runner.init.base import BRANCH_WEIGHTS, InitScheme
from runner.init.common import branch_linears, fairseq_xavier, store_effective_, t5_qk_adjust_
from runner.model.sublayer import ResidualSpec

BETA_SCALED = ("v", "out", "fc1", "fc2")


@options
@dataclass
class DeepNormOptions(InitConfig):
    # paper (0.87 encoder beta, default) | torchscale (1.15, microsoft/torchscale)
    deepnorm_variant: Literal["paper", "torchscale"] = "paper"


def constants(encoder_layers: int, decoder_layers: int, variant: str = "paper") -> dict:
    """Enc-dec alpha/beta of the paper (xformers/components/residual.py get_deepnorm_coefficients,
    Transformer-Clinic `deepnet`). torchscale (torchscale/architecture/encoder.py) uses 1.15
    where the paper has 0.87 in the encoder beta; its alphas are the paper's."""
    n, m = encoder_layers, decoder_layers
    enc_beta_coef = {"paper": 0.87, "torchscale": 1.15}[variant]
    return {
        "encoder": {"alpha": 0.81 * (n ** 4 * m) ** (1 / 16),
                    "beta": enc_beta_coef * (n ** 4 * m) ** (-1 / 16)},
        "decoder": {"alpha": (3 * m) ** 0.25, "beta": (12 * m) ** -0.25},
    }


def decoder_only_constants(layers: int) -> dict:
    """alpha = (2L)^1/4, beta = (8L)^-1/4 for an encoder-only or decoder-only stack of L layers
    (Wang et al. 2022, Table 1 / Fig. 2 pseudocode; xformers get_deepnorm_coefficients)."""
    return {"decoder": {"alpha": (2 * layers) ** 0.25, "beta": (8 * layers) ** -0.25}}


class DeepNorm(InitScheme):
    name = "deepnorm"
    options = DeepNormOptions
    changes = (*BRANCH_WEIGHTS, "*.omega")
    tasks = ("translation", "lm")
    placements = ("post",)
    placement_hint = "DeepNorm up-weights the Post-LN shortcut"

    def residual(self, cfg) -> ResidualSpec:
        return ResidualSpec(omega_trainable=False, omega_vector=True)

    @torch.no_grad()
    def apply(self, model, cfg, batch=None) -> dict:
        return apply_deepnorm(model, cfg)


def apply_deepnorm(model, cfg) -> dict:
    fairseq_xavier(model, cfg)
    variant = cfg.init.deepnorm_variant
    if model.decoder_only:  # the model, not cfg.task, says which of DeepNet's rows applies
        c = decoder_only_constants(model.cfg.num_decoder_layers)
    else:
        c = constants(model.cfg.num_encoder_layers, model.cfg.num_decoder_layers, variant)
    for ref in model.sublayers():
        beta = c[ref.side]["beta"]
        ref.module.omega.fill_(c[ref.side]["alpha"])
        for role, linear in branch_linears(ref).items():
            if variant == "paper":
                # xavier_normal_(gain=beta) for v/out/fc, gain 1 for q/k, cross-attention
                # included with the decoder's beta (Transformer-Clinic `deepnet`,
                # fairseq/fairseq/modules/transformer_layer.py).
                nn.init.xavier_normal_(linear.weight, gain=beta if role in BETA_SCALED else 1.0)
                store_effective_(linear)
                t5_qk_adjust_(model, role, linear)
            elif role in BETA_SCALED:
                # torchscale divides the default (Xavier-uniform, v at 1/sqrt(2)) init by
                # init_scale = 1/beta; q/k keep the baseline.
                linear.weight.mul_(beta)
    return {"rule": f"DeepNorm (Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers), "
                    f"{variant} constants", "constants": c}
