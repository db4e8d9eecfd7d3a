"""Instability telemetry (trainer.telemetry_interval, runner/run/telemetry.py)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from runner.analysis.hooks import SublayerRecorder
from runner.data.batching import collate
from runner.model.attention import MultiheadAttention
from runner.run.build import build_run
from runner.run.folder import read_metrics, read_result, scalars
from runner.run.telemetry import Telemetry, attention_stats
from runner.run.train import train
from runner.train.loop import Trainer
from tests.conftest import TINY, compose


def _parts():
    return build_run(compose(TINY))


def _batch(parts):
    return collate(parts.train_split, parts.batches[0], parts.pad, parts.eos)


def _fake_trainer(step: int = 0):
    records = []
    trainer = SimpleNamespace(state=SimpleNamespace(step=step, pos=SimpleNamespace(epoch=1)),
                              device=torch.device("cpu"),
                              scaler=torch.amp.GradScaler("cuda", enabled=False), loss_scale=None,
                              emit_record=records.append)
    return trainer, records


def _observed_update(parts, batch, unpad: bool):
    """One telemetry update (eval mode, no dropout) with a SublayerRecorder on the same forward."""
    model = parts.model.eval()
    telemetry = Telemetry(model, 1, parts.pad)
    trainer, records = _fake_trainer()
    with torch.no_grad(), SublayerRecorder(model, keep=("out",)) as recorder:
        telemetry.on_step_start(trainer)
        model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad, unpad=unpad)
        trainer.state.step = 1
        out = SimpleNamespace(loss_sum=torch.tensor(1.0), grad_norm=torch.tensor(1.0))
        telemetry.on_step_end(trainer, out)
    telemetry.remove()
    return records, recorder


def test_max_abs_equals_recorder():
    parts = _parts()
    batch = _batch(parts)
    keep = {"encoder": batch.src_tokens != parts.pad, "decoder": batch.prev_tokens != parts.pad}
    for unpad in (True, False):
        records, recorder = _observed_update(parts, batch, unpad)
        (record,) = records
        assert record["split"] == "telemetry" and record["step"] == 1
        assert record["sublayers"] == [ref.name for ref in parts.model.sublayers()]
        for name, value in zip(record["sublayers"], record["max_abs"]):
            rec = recorder.records[name]
            out = rec.out if unpad else rec.out[keep[rec.ref.side]]  # real tokens only
            assert value == float(out.abs().max()), (name, unpad)
        kinds = [ref.kind for ref in parts.model.sublayers()]
        for kind, entropy, logit in zip(kinds, record["attn_entropy"], record["attn_max_logit"]):
            if kind == "ffn":
                assert entropy is None and logit is None
            else:
                assert len(entropy) == len(logit) == parts.cfg.model.heads
                assert all(0.0 <= h <= math.log(batch.src_tokens.shape[1] + batch.prev_tokens.shape[1])
                           for h in entropy)


@torch.no_grad()
def test_attention_entropy_by_hand():
    torch.manual_seed(0)
    attn = MultiheadAttention(8, 2, dropout=0.0).eval()
    x = torch.randn(2, 5, 8)
    keep = torch.tensor([[True] * 5, [True, True, True, False, False]])
    mask = keep[:, None, None, :]
    logits, allowed = attn.observed_logits(x, attn_mask=mask)
    entropy_sum, count, max_logit = attention_stats(logits, allowed, keep)
    # by hand from the projections
    q = attn.q_proj(x).view(2, 5, 2, 4).transpose(1, 2)
    k = attn.k_proj(x).view(2, 5, 2, 4).transpose(1, 2)
    hand = q @ k.transpose(-1, -2) / math.sqrt(4)
    for h in range(2):
        total, n, top = 0.0, 0, -math.inf
        for b in range(2):
            real = int(keep[b].sum())
            for i in range(real):
                row = hand[b, h, i, :real]
                p = torch.softmax(row, -1)
                total += float(-(p * p.log()).sum())
                n += 1
                top = max(top, float(row.max()))
        assert math.isclose(float(entropy_sum[h] / count[h]), total / n, rel_tol=1e-5)
        assert math.isclose(float(max_logit[h]), top, rel_tol=1e-5)
    # the observed logits and masks are those the kernel used: they reproduce the output
    v = attn.v_proj(x).view(2, 5, 2, 4).transpose(1, 2)
    p = torch.softmax(logits.masked_fill(~allowed, -math.inf), -1)
    again = attn.out_proj((p @ v).transpose(1, 2).reshape(2, 5, 8))
    assert torch.allclose(again, attn(x, attn_mask=mask), atol=1e-5)
    causal, allowed = attn.observed_logits(x, is_causal=True)
    assert torch.equal(allowed, torch.ones(5, 5, dtype=torch.bool).tril())


def _locate(parts, sabotage) -> dict:
    telemetry = Telemetry(parts.model, 1000, parts.pad)
    sabotage(parts.model)
    Trainer(parts, [telemetry]).step()
    found = telemetry.first_nonfinite()
    telemetry.remove()
    return found


def test_first_nonfinite_forward():
    # a NaN weight in decoder layer 1's fc2: every earlier sublayer (the encoder, decoder layer
    # 0, decoder layer 1's attentions) computes without it, so its ffn output is the first
    def nan_fc2(model):
        with torch.no_grad():
            model.decoder.layers[1].ffn.branch.fc2.weight[0, 0] = float("nan")
    assert _locate(_parts(), nan_fc2) == {"update": 1, "where": "decoder.1.ffn"}


def test_first_nonfinite_backward():
    # a finite forward and loss, a non-finite gradient
    def nan_grad(model):
        model.encoder.layers[0].ffn.branch.fc1.weight.register_hook(lambda g: g * float("nan"))
    assert _locate(_parts(), nan_grad) == {"update": 1, "where": "backward"}


def test_tensorboard_scalars():
    record = {"split": "telemetry", "step": 5, "epoch": 1, "sublayers": ["a", "b"],
              "max_abs": [1.0, 2.0], "attn_entropy": [[0.5, 0.25], None]}
    assert dict(scalars(record)) == {"telemetry/max_abs/a": 1.0, "telemetry/max_abs/b": 2.0,
                                     "telemetry/attn_entropy/a/h0": 0.5,
                                     "telemetry/attn_entropy/a/h1": 0.25}


def test_train_with_telemetry(tmp_path):
    result = train(compose([*TINY, "trainer.telemetry_interval=5"]), tmp_path / "on")
    records = [r for r in read_metrics(tmp_path / "on") if r["split"] == "telemetry"]
    assert [r["step"] for r in records] == [5, 10, 15, 20]
    assert all(len(r["max_abs"]) == len(r["sublayers"]) for r in records)
    assert result["status"] == "ok" and result["first_nonfinite"] is None

    diverged = train(compose([*TINY, "trainer.telemetry_interval=5", "optim.lr=1e6"]),
                     tmp_path / "diverged")
    assert diverged["status"] == "diverged"
    first = read_result(tmp_path / "diverged")["first_nonfinite"]
    assert first["update"] <= diverged["diverged_step"]
    assert isinstance(first["where"], str)


def test_telemetry_off_writes_none(tiny_run):
    run_dir, _ = tiny_run  # the TINY run, telemetry off by default (conftest)
    assert compose(TINY).trainer.telemetry_interval == 0
    assert "first_nonfinite" not in read_result(run_dir)
    assert all(r["split"] != "telemetry" for r in read_metrics(run_dir))


def test_telemetry_leaves_training_unchanged_sigma_reparam_included(tmp_path):
    """Watching a run must not change it: with telemetry every update, the final parameters and
    buffers (sigma-reparam's power-iteration vector u among them) equal those of the same run
    without telemetry, bit for bit."""
    overrides = [*TINY, "model.sigma_reparam=true", "trainer.max_updates=6", "trainer.save_interval=0",
                 "trainer.valid_interval=0"]
    train(compose(overrides), tmp_path / "off")
    train(compose([*overrides, "trainer.telemetry_interval=1"]), tmp_path / "on")
    off = torch.load(tmp_path / "off" / "checkpoint_last.pt", weights_only=True)["model"]
    on = torch.load(tmp_path / "on" / "checkpoint_last.pt", weights_only=True)["model"]
    assert any(k.endswith(".u") for k in off)  # the buffers the attention hook used to advance
    assert off.keys() == on.keys()
    changed = [k for k in off if not torch.equal(off[k], on[k])]
    assert changed == []
