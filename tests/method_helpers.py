"""Helpers shared by the method tests: a small model on the toy task built by the run assembly,
norms with non-trivial affine parameters, and LayerNorm written from its definition."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import compose

from runner import init as init_schemes
from runner.analysis import common, grad_norms
from runner.data.batching import collate, make_batches
from runner.data.toy import build
from runner.run.build import check_config
from runner.run.build import model_for as build_model
from runner.run.train import train

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


def assert_trains(overrides, tmp_path) -> None:
    """A short training run on the toy task ends ok with finite losses."""
    from conftest import TINY

    result = train(compose([*TINY, "trainer.progress=false", *overrides]), tmp_path)
    assert result["status"] == "ok"
    assert math.isfinite(result["train_loss"]) and math.isfinite(result["valid_loss"])


def assert_grad_norms_finite(configs, depth: int) -> None:
    """`analyze grad-norms` runs on these configurations: one finite, positive row per sublayer."""
    settings = common.settings_from(configs, ["model=ci"], [], compose)
    result = grad_norms.run(settings, depth=depth, seeds=[1], sentences=8)
    for entry in result["settings"]:
        for side, count in (("encoder", depth * 2), ("decoder", depth * 3)):
            rows = entry[side]
            assert len(rows) == count
            assert all(math.isfinite(r["relative"]) and r["relative"] > 0 for r in rows)
