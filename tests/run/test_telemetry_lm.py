"""Telemetry (runner/run/telemetry.py) with task=lm: the decoder-only model's sublayers, every
position real, causal attention statistics, and the first non-finite value located."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch

from runner.analysis.hooks import SublayerRecorder
from runner.data.lm import training_batch
from runner.run.build import build_run
from runner.run.folder import read_metrics
from runner.run.telemetry import Telemetry
from runner.run.train import train
from runner.train.lm_loop import LMTrainer
from tests.conftest import compose

LM = ["task=lm", "model=ci", "model.max_positions=16", "data.block_size=16", "data.batch_size=4",
      "trainer.max_updates=10", "trainer.log_interval=5", "trainer.valid_interval=5", "trainer.save_interval=5",
      "trainer.valid_max_batches=2", "trainer.tensorboard=false", "warmup.updates=2", "trainer.threads=1",
      "trainer.progress=false", "trainer.keep_checkpoints=0", "trainer.telemetry_interval=5"]


def lm_parts(tmp_path, *overrides):
    """An LM run on a folder of seeded random words (data=text, 100 BPE merges)."""
    rng = np.random.default_rng(0)
    words = ["the", "king", "speaks", "and", "queen", "answers", "thou", "art", "night"]
    folder = tmp_path / "corpus"
    folder.mkdir(exist_ok=True)
    (folder / "a.txt").write_text("".join(" ".join(rng.choice(words, size=8)) + "\n" for _ in range(300)))
    cfg = compose([*LM, "data=text", f"data.dir={folder}", "data.bpe_merges=100", *overrides])
    return build_run(cfg)


def test_lm_telemetry_measures_the_decoders_sublayers(tmp_path):
    parts = lm_parts(tmp_path)
    model = parts.model.eval()
    telemetry = Telemetry(model, 1, parts.pad)
    tokens, _ = training_batch(parts.train_split, 16, 4, 1, 0)
    records = []
    trainer = SimpleNamespace(state=SimpleNamespace(step=0, pos=SimpleNamespace(epoch=1)),
                              device=torch.device("cpu"), loss_scale=None, emit_record=records.append)
    with torch.no_grad(), SublayerRecorder(model, keep=("out",)) as recorder:
        telemetry.on_step_start(trainer)
        model(tokens)
        trainer.state.step = 1
        telemetry.on_step_end(trainer, SimpleNamespace(loss_sum=torch.tensor(1.0), grad_norm=torch.tensor(1.0)))
    telemetry.remove()
    (record,) = records
    assert record["sublayers"] == ["decoder.0.self_attn", "decoder.0.ffn", "decoder.1.self_attn", "decoder.1.ffn"]
    for name, value in zip(record["sublayers"], record["max_abs"]):
        assert value == float(recorder.records[name].out.abs().max())  # every position is real
    attention = record["attn_entropy"][0]
    assert record["attn_entropy"][1] is None and len(attention) == parts.cfg.model.heads
    # causal: query i attends i + 1 keys, so the mean entropy is at most the mean of log(i + 1)
    bound = sum(math.log(i + 1) for i in range(16)) / 16
    assert all(0.0 < h <= bound + 1e-6 for h in attention)


def test_lm_run_writes_telemetry_and_finds_the_first_nan(tmp_path):
    parts = lm_parts(tmp_path)
    result = train(parts.cfg, tmp_path / "run")
    records = [r for r in read_metrics(tmp_path / "run") if r["split"] == "telemetry"]
    assert [r["step"] for r in records] == [5, 10] and result["first_nonfinite"] is None
    assert all(len(r["max_abs"]) == 4 and all(math.isfinite(v) for v in r["max_abs"]) for r in records)

    broken = lm_parts(tmp_path)
    with torch.no_grad():  # a NaN in layer 1's FFN: layer 0 and layer 1's attention stay finite
        broken.model.decoder.layers[1].ffn.branch.fc2.weight[0, 0] = float("nan")
    telemetry = Telemetry(broken.model, 1000, broken.pad)
    LMTrainer(broken, [telemetry]).step()
    assert telemetry.first_nonfinite() == {"update": 1, "where": "decoder.1.ffn"}
    telemetry.remove()
