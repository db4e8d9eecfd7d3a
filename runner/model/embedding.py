"""Token embeddings scaled by sqrt(d) plus fairseq's sinusoidal positions
(as fairseq/models/transformer.py builds them), or learned positions and a learned scale."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from runner.model.dropout import Dropout


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """fairseq SinusoidalPositionalEmbedding layout: [sin | cos] halves, not interleaved."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000.0) / (half - 1)))
    angles = torch.arange(num_positions, dtype=torch.float)[:, None] * freq[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(num_positions, 1)], dim=1)
    return table


class Embedder(nn.Module):
    """sqrt(d) * E[token] + PE(position), then dropout (with a learned scale s: s * E[token] + PE,
    or s * (E[token] + P[position]) with a learned position table). The token table may be shared.
    With `fixnorm` the rows of E are used at unit L2 length, E[t] / ||E[t]|| (FixNorm as
    Nguyen & Salazar 2019 use it: tnq177/transformers_without_tears model.py,
    F.normalize(self.word_embedding, dim=-1) before the lookup and the sqrt(d) scale)."""

    def __init__(self, tokens: nn.Embedding, max_positions: int, dropout: float, scale: bool,
                 fixnorm: bool = False, learned_positions: bool = False, learned_scale: bool = False):
        super().__init__()
        self.tokens = tokens
        self.fixnorm = fixnorm
        dim = tokens.embedding_dim
        # model.embed_scale_learned: one trained factor from sqrt(d) (DyT's LLaMA `shared_scale`, whose
        # embedding layer has tokens only) on the tokens and on a learned position table, which
        # starts at the tokens' scale; fixed sinusoids are added unscaled, as with the fixed factor
        self.scales_positions = learned_scale and learned_positions
        if learned_scale:
            self.scale: nn.Parameter | float = nn.Parameter(torch.full((1,), math.sqrt(dim)))
        else:
            self.scale = math.sqrt(dim) if scale else 1.0
        if learned_positions:  # a trained table (nanoGPT model.py wpe); init schemes fill it
            self.position_table: nn.Embedding | None = nn.Embedding(max_positions, dim)
        else:
            self.position_table = None
            # Sinusoidal positions are a fixed function, not a parameter: kept out of the state_dict.
            self.register_buffer("positions", sinusoidal_table(max_positions, dim), persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """tokens: (B, T); `start` is the first position (incremental decoding)."""
        table = self.positions if self.position_table is None else self.position_table.weight
        positions = table[start:start + tokens.shape[1]]
        x = self.tokens(tokens)
        if self.fixnorm:  # normalizing the looked-up rows = looking up the normalized table
            x = F.normalize(x, dim=-1)
        if self.scales_positions:
            return self.dropout((x + positions) * self.scale)
        return self.dropout(x * self.scale + positions)
