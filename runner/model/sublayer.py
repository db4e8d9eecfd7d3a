"""One residual branch with fixed norm slots, filled once from the placement table.

    out = post_norm( omega * x + alpha * Dropout(branch_norm(branch(pre_norm(x)))) )

omega (a d-vector, the shortcut scale of Admin/DeepNorm) and alpha (the branch scale of
ReZero/SkipInit, a scalar) always exist, so every init scheme sees the same state_dict; a scheme
writes their values, and the model's ResidualSpec decides at construction whether they are
trained and whether a layer's sublayers share one alpha (ReZero, rztx.py) or each branch has its
own (SkipInit).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runner.model.dropout import Dropout
from runner.model.norms import make_norm


@dataclass(frozen=True)
class Slots:
    pre_norm: bool  # norm on the branch input (Pre-LN)
    branch_norm: bool  # norm on the branch output before the residual add (Sandwich-LN)
    post_norm: bool  # norm after the residual add (Post-LN)
    final_norm: bool  # norm after the last layer of each stack


# As fairseq/models/transformer.py: Post-LN has no final norm; Pre-LN does (fairseq
# normalize_before); sandwich is Pre-LN plus a norm on the branch output (CogView's Sandwich-LN).
PLACEMENTS = {
    "post": Slots(pre_norm=False, branch_norm=False, post_norm=True, final_norm=False),
    "pre": Slots(pre_norm=True, branch_norm=False, post_norm=False, final_norm=True),
    "none": Slots(pre_norm=False, branch_norm=False, post_norm=False, final_norm=False),
    "sandwich": Slots(pre_norm=True, branch_norm=True, post_norm=False, final_norm=True),
}


@dataclass(frozen=True)
class ResidualSpec:
    """Which residual scales train; declared by the init scheme, fixed at model construction."""

    omega_trainable: bool = False
    omega_vector: bool = True  # False: one scalar per sublayer (Admin's scalar option)
    alpha_trainable: bool = False
    alpha_per_layer: bool = True  # one alpha shared by a layer's sublayers (rztx.py); False: per branch


class Sublayer(nn.Module):
    def __init__(self, branch: nn.Module, dim: int, slots: Slots, norm_kind: str, eps: float,
                 dropout: float, residual: ResidualSpec):
        super().__init__()
        identity = nn.Identity
        self.pre_norm = make_norm(norm_kind, dim, eps) if slots.pre_norm else identity()
        self.branch = branch
        self.branch_norm = make_norm(norm_kind, dim, eps) if slots.branch_norm else identity()
        self.dropout = Dropout(dropout)
        self.post_norm = make_norm(norm_kind, dim, eps) if slots.post_norm else identity()
        self.omega = nn.Parameter(torch.ones(dim if residual.omega_vector else 1),
                                  requires_grad=residual.omega_trainable)
        self.alpha = nn.Parameter(torch.ones(1), requires_grad=residual.alpha_trainable)

    def _unit_residual(self, x: torch.Tensor) -> bool:
        """True when omega and alpha are frozen at one, so the residual is a plain add: two
        fewer element-wise passes over (B, T, D), forward and backward. Checked on every call
        because schemes and checkpoints write these values in place after construction. Only on
        CPU: on CUDA the check would sync the host per sublayer, and compile fuses the general
        path anyway."""
        return (x.device.type == "cpu" and not self.omega.requires_grad
                and not self.alpha.requires_grad and bool((self.omega == 1).all())
                and bool((self.alpha == 1).all()))

    def forward(self, x: torch.Tensor, **branch_kwargs) -> torch.Tensor:
        h = self.dropout(self.branch_norm(self.branch(self.pre_norm(x), **branch_kwargs)))
        if self._unit_residual(x):
            return self.post_norm(x + h)  # bitwise equal to the general path with ones
        return self.post_norm(torch.addcmul(h * self.alpha, x, self.omega))
