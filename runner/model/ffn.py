"""Position-wise feed-forward branch: fc1 -> activation -> activation dropout -> fc2."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from runner.model.dropout import Dropout
from runner.model.linear import make_linear

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


class FeedForward(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, activation: str, activation_dropout: float,
                 parameterization: str = "standard", sigma_reparam: Optional[str] = None):
        super().__init__()
        self.fc1 = make_linear(dim, ffn_dim, parameterization, sigma_reparam=sigma_reparam)
        self.activation = ACTIVATIONS[activation]()
        self.activation_dropout = Dropout(activation_dropout)
        self.fc2 = make_linear(ffn_dim, dim, parameterization, sigma_reparam=sigma_reparam)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_dropout(self.activation(self.fc1(x))))
