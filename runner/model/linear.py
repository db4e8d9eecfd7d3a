"""Projection layers: both parameterizations (model.parameterization) and sigma-reparam
(model.sigma_reparam), chosen by `make_linear`."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F


class NTKLinear(nn.Linear):
    """NTK parameterization (an option of this tool, after Su 2021, kexue.fm/archives/8620,
    "NTK Parameterization"): unit-variance weights, output scaled by 1/sqrt(fan_in), so the forward
    scale no longer lives in the init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.output_scale = 1.0 / math.sqrt(in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight * self.output_scale, self.bias)


class SigmaReparamLinear(nn.Linear):
    """sigma-reparam (Zhai et al., ICML 2023, Stabilizing Transformer Training by Preventing
    Attention Entropy Collapse, Eq. 2): the forward uses W_hat = (gamma / sigma(W)) W, with
    sigma(W) the spectral norm estimated by one power-iteration step per call and gamma a
    learnable scalar. As apple/ml-sigma-reparam vision/layers.py (SpectralNormedWeight, SNLinear):

        v = normalize(W u),  u' = normalize(W^T v)   (no gradient; u := u' in train mode only)
        sigma = v^T W u'                             (W in the graph, u' and v constants)

    u (in_features) is a persistent buffer, so checkpoints carry it and a resumed run continues
    the same iteration. `after_init()` (called once the init scheme has written W_0) sets u to
    W_0's top right singular vector (SVD, as the reference's first sigma; no random numbers) and
    gamma to sigma(W_0) (gamma_init="sigma", the vision code's sn_init) or 1 (gamma_init="one",
    the speech code's initjax.ones). gamma = sigma(W_0) is the sigma the first forward computes,
    so gamma / sigma is exactly 1 there and the model equals the plain one at init, bit for bit
    on the device after_init ran on. sigma is computed in fp32 with autocast off (the reference's
    FP32SpectralNormedWeight)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gamma_init: str = "sigma"):
        if gamma_init not in ("sigma", "one"):
            raise ValueError(f"sigma-reparam gamma_init {gamma_init!r}: expected sigma or one")
        super().__init__(in_features, out_features, bias=bias)  # nn.Linear's draws, no others
        self.gamma_init = gamma_init
        self.gamma = nn.Parameter(torch.ones(1))
        # a unit vector until after_init writes W_0's top singular vector (deterministic, no RNG)
        self.register_buffer("u", torch.full((in_features,), in_features ** -0.5))

    def sigma(self) -> torch.Tensor:
        """One power-iteration step from u; u advances only in train mode (the reference's
        get_sigma). A 0-dim tensor in at least fp32, differentiable in W only."""
        dtype = torch.promote_types(self.weight.dtype, torch.float32)
        with torch.autocast(self.weight.device.type, enabled=False):
            weight = self.weight.to(dtype)
            with torch.no_grad():
                v = F.normalize(weight.mv(self.u.to(dtype)), dim=0)
                u = F.normalize(weight.t().mv(v), dim=0)
                if self.training:
                    self.u.copy_(u)
            return torch.einsum("c,cd,d->", v, weight, u)

    def effective_weight(self) -> torch.Tensor:
        """W_hat = (gamma / sigma(W)) W, what the forward multiplies by."""
        return self.weight * (self.gamma / self.sigma()).to(self.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.effective_weight(), self.bias)

    @torch.no_grad()
    def after_init(self) -> None:
        """u := top right singular vector of W_0, gamma := sigma(W_0) or 1 (see the class)."""
        dtype = torch.promote_types(self.weight.dtype, torch.float32)
        _, _, vh = torch.linalg.svd(self.weight.to(dtype), full_matrices=False)
        self.u.copy_(vh[0])
        if self.gamma_init == "sigma":
            was_training = self.training
            self.train(False)  # the first forward's sigma, without advancing u
            self.gamma.copy_(self.sigma().reshape(1))
            self.train(was_training)
        else:
            self.gamma.fill_(1.0)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sigma_reparam=True, gamma_init={self.gamma_init}"


def plain_affine(parameterization: str, sigma_reparam: Optional[str] = None) -> bool:
    """True when make_linear builds plain affine maps x W^T + b (nn.Linear), so that projections
    of one input can run as one F.linear of their concatenated weights and biases. False for
    NTK, whose forward multiplies the weight by output_scale first, and for sigma-reparam, whose
    forward divides each weight by its own spectral norm."""
    return parameterization != "ntk" and sigma_reparam is None


def linear_variant(cfg) -> Optional[str]:
    """model.sigma_reparam as make_linear's `sigma_reparam` argument: the gamma init
    (model.sigma_reparam_gamma_init) when on, None when off. cfg: the ModelConfig."""
    return cfg.sigma_reparam_gamma_init if cfg.sigma_reparam else None


def make_linear(in_features: int, out_features: int, parameterization: str, bias: bool = True,
                sigma_reparam: Optional[str] = None) -> nn.Linear:
    """sigma_reparam: None (plain), or the gamma init ("sigma" | "one") of a SigmaReparamLinear.
    Every variant draws the same random numbers at construction (nn.Linear's)."""
    if sigma_reparam is not None:
        if parameterization == "ntk":
            raise ValueError("sigma-reparam divides W by its spectral norm, which cancels the NTK "
                             "output scale: use the standard parameterization")
        return SigmaReparamLinear(in_features, out_features, bias=bias, gamma_init=sigma_reparam)
    cls = nn.Linear if plain_affine(parameterization) else NTKLinear
    return cls(in_features, out_features, bias=bias)
