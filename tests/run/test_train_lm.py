"""task=lm end to end on the real corpus (data=shakespeare_char): a run trains through the run
layer and the shared train loop, reports bits per character, resumes exactly, saves the
vocabulary `deepinit sample` decodes with; bad combinations are one-line errors."""
from __future__ import annotations

import json
import math

import pytest
import torch

from runner.config import ConfigError
from runner.run import folder
from runner.run.build import check_config
from runner.run.train import train
from tests.conftest import compose, needs_shakespeare

TINY_LM = ["task=lm", "model=ci", "model.max_positions=16", "data.block_size=16", "data.batch_size=4",
           "trainer.max_updates=20", "trainer.log_interval=5", "trainer.valid_interval=10",
           "trainer.save_interval=10", "trainer.valid_max_batches=3", "trainer.tensorboard=false",
           "warmup.updates=5", "optim.lr=1e-2", "trainer.threads=1", "trainer.progress=false", "trainer.keep_checkpoints=0"]


@needs_shakespeare
def test_a_language_model_trains_and_reports_bits_per_character(tmp_path):
    result = train(compose(TINY_LM), tmp_path / "run")
    assert result["status"] == "ok" and result["updates"] == 20
    assert result["valid_bpc"] == pytest.approx(result["valid_nll_loss"] / math.log(2))
    assert result["best_valid_bpc"] == pytest.approx(result["best_valid_nll"] / math.log(2))
    assert result["valid_nll_loss"] < math.log(65)  # below the uniform distribution's NLL
    valid = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "valid"]
    assert [v["step"] for v in valid] == [10, 20] and all("bpc" in v for v in valid)
    vocab = json.loads((tmp_path / "run" / "vocab.json").read_text())
    assert vocab["unit"] == "character" and len(vocab["chars"]) == 65


@needs_shakespeare
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    straight = train(compose(TINY_LM), tmp_path / "straight")
    first = train(compose([*TINY_LM, "trainer.max_updates=10"]), tmp_path / "resumed")
    assert first["updates"] == 10
    (tmp_path / "resumed" / "result.json").unlink()  # as if it had stopped after update 10's checkpoint
    resumed = train(compose(TINY_LM), tmp_path / "resumed")
    assert resumed["resumed"] and resumed["updates"] == 20
    assert resumed["train_loss"] == straight["train_loss"]
    assert resumed["valid_loss"] == straight["valid_loss"]
    a = folder.load_checkpoint(tmp_path / "straight" / folder.LAST)["model"]
    b = folder.load_checkpoint(tmp_path / "resumed" / folder.LAST)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@needs_shakespeare
def test_sample_prints_a_continuation_of_the_prompt(tmp_path, capsys):
    from runner.cli import main as deepinit_main

    train(compose(TINY_LM), tmp_path / "run")
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        deepinit_main(["sample", str(tmp_path / "run"), "--prompt", "ROMEO:", "--tokens", "12",
                       "--temperature", "0"])
    out = capsys.readouterr().out
    # character-level: the prompt, 12 new characters (a newline may be one of them), print's newline
    assert done.value.code == 0 and out.startswith("ROMEO:") and len(out) == len("ROMEO:") + 12 + 1
    with pytest.raises(SystemExit) as bad:
        deepinit_main(["sample", str(tmp_path / "run"), "--prompt", "{"])
    err = capsys.readouterr().err
    assert bad.value.code == 2 and err.startswith("deepinit: error: --prompt:") and err.count("\n") == 1


@pytest.mark.parametrize("overrides, expected", [
    (["task=lm", "data=toy"], "task=lm needs a text corpus"),
    (["data=shakespeare_char"], "is a language-model corpus: use task=lm"),
    (["task=lm", "init=tfixup"], "init=tfixup has no rule for task=lm"),
    (["task=lm", "trainer.final_bleu=true"], "trainer.final_bleu=true: BLEU scores translations"),
    (["task=lm", "data.block_size=2048"], "data.block_size=2048 is longer than model.max_positions"),
    # keys of a stack the LM does not have: refused before any per-stack rule speaks of two stacks
    (["task=lm", "norm.encoder_placement=pre"], "norm.encoder_placement=pre: task=lm's model has one stack"),
    (["task=lm", "model.encoder_layers=6"], "model.encoder_layers=6: task=lm's model has one stack"),
    (["task=lm", "init=deepnorm", "norm=post", "norm.encoder_placement=pre"],
     "norm.encoder_placement=pre: task=lm's model has one stack"),
])
def test_combinations_the_task_does_not_define_are_one_line_errors(overrides, expected):
    with pytest.raises(ConfigError) as err:
        check_config(compose(overrides))
    assert expected in str(err.value) and "\n" not in str(err.value)


@needs_shakespeare
def test_every_method_trains_the_lm_2_updates_through_the_run_or_refuses_in_one_line(tmp_path):
    """Over conf/method (every placement, norm kind and init scheme the tiers train), through the
    real run (composition, config checks, build_lm_run, LMTrainer): `task=lm method=X` either
    trains 2 updates to a result.json, or is refused in one line by an init scheme without a
    decoder-only rule (T-Fixup and the Lipschitz init, docs/methods.md)."""
    from pathlib import Path

    from runner.cli.compose import config_dir

    methods = sorted(p.stem for p in (Path(config_dir()) / "method").glob("*.yaml"))
    tiny = ["task=lm", "model=ci", "model.layers=2", "model.max_positions=16", "data.block_size=16",
            "data.batch_size=4", "trainer.max_updates=2", "warmup.updates=0", "trainer.valid_interval=0",
            "trainer.save_interval=0", "trainer.log_interval=1", "trainer.tensorboard=false",
            "trainer.progress=false", "trainer.valid_max_batches=2", "trainer.keep_checkpoints=0"]
    refused, trained = {}, []
    for method in methods:
        try:
            cfg = compose([*tiny, f"method={method}"])
            check_config(cfg)
        except ConfigError as err:
            refused[method] = str(err)
            continue
        run = tmp_path / method
        result = train(cfg, run)
        assert result["status"] in ("ok", "stalled") and result["updates"] == 2, (method, result)
        assert result["task"] == "lm" and math.isfinite(result["train_loss"]), method
        assert json.loads((run / "init.json").read_text())["scheme"] == cfg.init.name, method
        trained.append(method)
    assert set(refused) == {"lipschitz_v1", "lipschitz_v2", "tfixup"}, refused
    assert all("has no rule for task=lm: " in m and "\n" not in m for m in refused.values()), refused
    assert {"admin", "deepnorm", "dyt", "mix_ln", "peri_ln", "qk_norm", "sigma_reparam_post_ln"} <= set(trained)
