"""deepinit bench's task=lm entry (runner/bench/lm.py): deepinit's LM step beside a hand-written
plain-PyTorch GPT of the same shape on the same blocks, the timing of its windows, and the
reference model itself (causal, tied, learns)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from runner.bench.lm import ReferenceGPT, StepClock, unsupported, windows_of
from runner.cli.bench import main as main_bench
from tests.conftest import compose, needs_shakespeare


def test_reference_gpt_is_causal_tied_and_learns():
    torch.manual_seed(0)
    model = ReferenceGPT(vocab=20, block=8, dim=32, heads=4, ffn=128, layers=2, eps=1e-5)
    x = torch.randint(0, 20, (3, 8))
    with torch.no_grad():
        logits = model(x)
        later = x.clone()
        later[:, 5] = (later[:, 5] + 1) % 20
        changed = model(later)
    assert logits.shape == (3, 8, 20)
    assert torch.allclose(changed[:, :5], logits[:, :5], atol=1e-6)  # no position sees the future
    assert not torch.allclose(changed[:, 5:], logits[:, 5:], atol=1e-4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    y = torch.roll(x, -1, dims=1)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(x).view(-1, 20), y.view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_reference_has_deepinits_parameter_count_and_refuses_what_it_cannot_express():
    """The same shape: the preset's deepinit model and the reference train the same parameters
    (deepinit's also holds its residual scales, frozen at one under init=gpt2: a plain add)."""
    from runner.run.build import lm_model_for

    cfg = compose(["+sweep=lm_nanogpt_cpu"])
    m = cfg.model
    ours = sum(p.numel() for p in lm_model_for(cfg, 65).parameters() if p.requires_grad)
    ref = ReferenceGPT(65, m.max_positions, m.dim, m.heads, m.ffn_dim, m.num_decoder_layers, cfg.norm.eps)
    assert sum(p.numel() for p in ref.parameters()) == ours
    assert unsupported(cfg) == []
    assert any("norm=pre" in p for p in unsupported(compose(["+sweep=lm_nanogpt_cpu", "norm=post"])))
    assert any("dropout" in p for p in unsupported(compose(["+sweep=lm_nanogpt_cpu", "model.dropout=0.1"])))
    assert any("embed_scale" in p for p in unsupported(compose(["+sweep=lm_nanogpt_cpu",
                                                                "model.embed_scale_learned=true"])))


def test_windows_span_the_timed_updates():
    clock = StepClock()
    clock.wall = [float(i * i) for i in range(1, 12)]  # after updates 1..11
    clock.cpu = [0.5 * w for w in clock.wall]
    windows = windows_of(clock, warmup=3, steps=4, windows=2, tokens_per_update=10)
    # window 0: updates 4..7, from the mark after update 3 to the mark after update 7
    assert windows[0]["seconds"] == 49.0 - 9.0 and windows[1]["seconds"] == 121.0 - 49.0
    assert windows[0]["tokens"] == 40 and windows[0]["tokens_per_s"] == pytest.approx(40 / 40.0)
    assert windows[1]["tokens_per_cpu_s"] == pytest.approx(40 / 36.0)


@needs_shakespeare
def test_lm_entry_and_its_reference_train_on_the_same_blocks(tmp_path):
    out = tmp_path / "bench.json"
    rc = main_bench(["--quick", "--presets", "lm-nanogpt-cpu", "--depths", "--reference", "--reps", "1",
                     "--threads", "1", "--work", str(tmp_path / "work"), "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    row = report["reference"]["lm-nanogpt-cpu"]
    ours, ref = row["deepinit_runs"][0], row["reference_runs"][0]
    assert ours["status"] == ref["status"] == "ok" and ref["kind"] == "reference"
    assert row["task"] == "lm" and row["tokens_per_s"]["target"] == 1.0
    assert ours["trainable_parameters"] == ref["trainable_parameters"] == ref["parameters"]
    assert ours["tgt_vocab"] == ref["tgt_vocab"] == 65
    # --quick: 2 windows of 2 updates of 12 blocks of 64 characters, on both sides
    assert [w["tokens"] for w in ours["windows"]] == [w["tokens"] for w in ref["windows"]] == [1536, 1536]
    assert ours["flops_per_target_token"] == ref["flops_per_target_token"] > 6 * 128 * 65
    # nanoGPT's first losses on 65 characters: near ln 65 after a handful of updates
    assert abs(ref["train_loss"] - ours["train_loss"]) < 0.5 and ours["train_loss"] < math.log(65) + 0.5
    assert row["tokens_per_s"]["ratio"] == pytest.approx(ours["tokens_per_s"] / ref["tokens_per_s"])
    markdown = out.with_suffix(".md").read_text()
    assert "a hand-written GPT" in markdown and "| lm-nanogpt-cpu | 128-512-4, 4 layers" in markdown
    assert "other processes' load" in markdown


def test_a_missing_corpus_is_one_line_before_any_entry_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DEEPINIT_DATA_ROOT", str(tmp_path / "no-data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no-cache"))
    out = tmp_path / "bench.json"
    rc = main_bench(["--quick", "--presets", "lm-nanogpt-cpu", "--depths", "--threads", "1",
                     "--work", str(tmp_path / "work"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert err.startswith("deepinit: error: lm-nanogpt-cpu: data=shakespeare_char: no ") and err.count("\n") == 1
