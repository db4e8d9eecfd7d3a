"""Model FLOPs of an encoder-decoder Transformer, from its shape alone: what MFU divides by a
peak (runner/run/hardware.py) and what the paper-scale cost estimates multiply
(runner/tables/cost.py)."""
from __future__ import annotations

import numpy as np


def train_flops(dim: int, ffn: int, enc_layers: int, dec_layers: int, tgt_vocab: int,
                src_len: np.ndarray, tgt_len: np.ndarray) -> float:
    """Model FLOPs of one training pass over sentences with these lengths: 3x the forward
    (backward = 2x forward), 2 FLOPs per weight per token for every matmul weight, and the
    attention score/value products over full (not causally halved) matrices, as in PaLM's MFU
    (Chowdhery et al. 2022, appendix B). Recomputation by checkpointing is not model FLOPs."""
    s, t = src_len.astype(np.float64), tgt_len.astype(np.float64)
    per_src = enc_layers * (4 * dim * dim + 2 * dim * ffn) + dec_layers * 2 * dim * dim  # + cross k/v
    per_tgt = dec_layers * (6 * dim * dim + 2 * dim * ffn) + dim * tgt_vocab  # + output projection
    dense = 2 * (per_src * s.sum() + per_tgt * t.sum())
    attn = 4 * dim * (enc_layers * (s * s).sum() + dec_layers * ((t * t).sum() + (s * t).sum()))
    return 3 * (dense + attn)


def lm_train_flops(dim: int, ffn: int, layers: int, vocab: int, lengths: np.ndarray) -> float:
    """Model FLOPs of one training pass of a decoder-only LM over blocks of these lengths: the
    layers are train_flops' encoder layers (self-attention and FFN), with the output projection."""
    return train_flops(dim, ffn, layers, 0, vocab, lengths, lengths)
