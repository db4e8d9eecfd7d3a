"""Small builders shared by the init tests: a config, a model and a batch without the CLI."""
from __future__ import annotations

import torch

from runner.config import Config
from runner.data.batching import Batch
from runner.init import apply as init_apply
from runner.init import options_for
from runner.model.sublayer import norm_options_for
from runner.run.build import model_for as build_model

PAD, EOS, VOCAB = 1, 2, 40


def make_cfg(scheme: str = "xavier", norm: str = "post", layers: int = 2, dim: int = 32,
             ffn_dim: int = 64, heads: int = 2, dropout: float = 0.0, share: str = "all",
             encoder_layers=None, decoder_layers=None, **init_fields) -> Config:
    cfg = Config(init=options_for(scheme, **init_fields))  # the scheme's own options class
    cfg.norm = norm_options_for(norm)  # the placement's own options class
    m = cfg.model
    m.layers, m.dim, m.ffn_dim, m.heads, m.dropout = layers, dim, ffn_dim, heads, dropout
    m.encoder_layers, m.decoder_layers = encoder_layers, decoder_layers
    m.share_embeddings = share
    m.max_positions = 64
    return cfg


def make_model(cfg, seed: int = 0, vocab: int = VOCAB):
    torch.manual_seed(seed)
    return build_model(cfg, vocab, vocab, PAD)


def make_batch(seed: int = 0, rows: int = 4, src_len: int = 7, tgt_len: int = 6,
               vocab: int = VOCAB) -> Batch:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (rows, src_len), generator=g)
    tgt = torch.randint(4, vocab, (rows, tgt_len), generator=g)
    src[:, -1] = EOS
    tgt[:, -1] = EOS
    src[0, -3:] = PAD  # some padding on both sides
    tgt[0, -2:] = PAD
    prev = torch.cat([torch.full((rows, 1), EOS), tgt[:, :-1]], dim=1)
    prev[0, -1] = PAD
    ntokens = int((tgt != PAD).sum())
    cells = src.numel() + tgt.numel()
    padded = int((src == PAD).sum() + (tgt == PAD).sum())
    return Batch(src, prev, tgt, ntokens, rows, True, padded, cells, tgt[tgt != PAD])


def initialized(cfg, seed: int = 0, batch=None):
    """Model built and initialized with cfg's scheme from one seed; returns (model, report)."""
    model = make_model(cfg, seed)
    report = init_apply(model, cfg, batch if batch is not None else make_batch())
    return model, report
