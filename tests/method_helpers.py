"""Helpers shared by the method tests: a small model on the toy task built by the run assembly,
norms with non-trivial affine parameters, and LayerNorm written from its definition."""
from __future__ import annotations

import math

import pytest
import torch

from runner import init as init_schemes
from runner.analysis import common, grad_norms
from runner.config import Config
from runner.data.batching import collate, make_batches
from runner.data.toy import build
from runner.init import options_for
from runner.model.loss import label_smoothed_nll
from runner.model.sublayer import norm_options_for
from runner.run.build import check_config
from runner.run.build import model_for as build_model
from runner.train.optim import build_optimizer, set_lr
from tests.conftest import compose

SMALL = ["model=ci", "model.dropout=0.0", "data.toy.train_size=200", "data.toy.valid_size=20",
         "data.toy.test_size=20"]


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def model_for(overrides, seed=0):
    cfg = compose([*SMALL, *overrides])
    check_config(cfg)
    data = build(cfg.data)
    split = data.splits["train"]
    batch = collate(split, make_batches(split, 256, seed=0)[0], data.tgt_dict.pad_index,
                    data.tgt_dict.eos_index)
    torch.manual_seed(seed)
    model = build_model(cfg, len(data.src_dict), len(data.tgt_dict), data.tgt_dict.pad_index)
    init_schemes.apply(model, cfg, batch)
    model.eval()
    return cfg, model, batch


@torch.no_grad()
def randomize_norms(model, gen):
    """Non-trivial affine parameters, so the tests see which norm is applied where."""
    for _, norm in model.norms():
        for p in norm.parameters():
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))


def ln(norm, x):
    """LayerNorm from its definition: (x - mean) / sqrt(var + eps) * weight + bias."""
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def assert_grad_norms_finite(configs, depth: int) -> None:
    """`analyze grad-norms` runs on these configurations: one finite, positive row per sublayer."""
    settings = common.settings_from(configs, ["model=ci"], [], compose)
    result = grad_norms.run(settings, depth=depth, seeds=[1], sentences=8)
    for entry in result["settings"]:
        for side, count in (("encoder", depth * 2), ("decoder", depth * 3)):
            rows = entry[side]
            assert len(rows) == count
            assert all(math.isfinite(r["relative"]) and r["relative"] > 0 for r in rows)


# ----- a model from a bare Config, without composing conf/ (the QK-norm, sigma-reparam, LayerScale
# and Depth-muP tests): 2 heads, no dropout, a 40-word vocabulary
PAD, EOS, VOCAB = 1, 2, 40


def make_cfg(scheme: str = "xavier", norm: str = "pre", layers: int = 2, dim: int = 32,
             ffn_dim: int = 64, encoder_layers=None, decoder_layers=None, model=None,
             init=None, optim=None) -> Config:
    cfg = Config(init=options_for(scheme, **(init or {})))
    cfg.norm = norm_options_for(norm)  # the placement's own options class
    m = cfg.model
    m.layers, m.dim, m.ffn_dim, m.heads, m.dropout = layers, dim, ffn_dim, 2, 0.0
    m.encoder_layers, m.decoder_layers, m.max_positions = encoder_layers, decoder_layers, 64
    for group, fields in ((cfg.model, model), (cfg.optim, optim)):
        for key, value in (fields or {}).items():
            setattr(group, key, value)
    return cfg


def make_batch(seed: int = 0, rows: int = 4, src_len: int = 7, tgt_len: int = 6):
    """(src, prev, target) with padding on both sides."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (rows, src_len), generator=g)
    tgt = torch.randint(4, VOCAB, (rows, tgt_len), generator=g)
    src[:, -1], tgt[:, -1] = EOS, EOS
    src[0, -3:], tgt[0, -2:] = PAD, PAD
    prev = torch.cat([torch.full((rows, 1), EOS), tgt[:, :-1]], dim=1)
    prev[0, -1] = PAD
    return src, prev, tgt


def initialized(cfg, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(cfg, VOCAB, VOCAB, PAD)
    init_schemes.apply(model, cfg, None)
    return model


def one_update(model, cfg, batch, lr: float = 1e-2):
    optimizer = build_optimizer(model.parameters(), cfg, "cpu", init_schemes.param_groups(model, cfg))
    set_lr(optimizer, lr)
    src, prev, tgt = batch
    loss, _ = label_smoothed_nll(model(src, prev), tgt, 0.1, PAD)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return optimizer
