"""`deepinit eval` end to end on a small trained toy run: files, both BLEU scores, result.json,
checkpoint averaging choice, bad input."""
from __future__ import annotations

import json

import pytest
import torch

from runner.cli.eval import main as main_eval
from runner.config import config_from_dict
from runner.decode.scoring import tokenized_bleu
from runner.decode.search import decode_throughput
from runner.init import options_class
from runner.model.sublayer import norm_options_class
from runner.run import folder as ckpt
from runner.run.build import model_for as build_model
from runner.run.evaluate import evaluate_run, load_eval_data
from runner.run.train import train
from tests.conftest import TINY, compose, run_cli

# A reduced toy grammar and a short run: enough for a model whose output overlaps the
# references (BLEU well above 0) in about 12 s on one core.
RUN = TINY + ["trainer.max_updates=240", "optim.lr=5e-3", "trainer.keep_checkpoints=3",
              "trainer.save_interval=20", "trainer.valid_interval=0", "trainer.progress=false",
              "data.toy.nouns=8", "data.toy.verbs=4", "data.toy.adjectives=4",
              "data.max_tokens=1024"]
FAST = ["--max-len-a", "1.2", "--max-len-b", "10"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("evalrun")
    result = train(compose(RUN), path)
    assert result["status"] == "ok"
    return path


def test_eval_writes_files_scores_and_result(run_dir, capsys):
    assert main_eval([str(run_dir), "--beam", "5", "--average-last", "3", *FAST]) == 0
    out = capsys.readouterr().out
    assert "BLEU (tokenized" in out and "sacreBLEU (detokenized)" in out and "nrefs:1" in out
    ev = run_dir / "eval"
    lines = {name: (ev / name).read_text().splitlines()
             for name in ("test.hyp", "test.ref", "test.detok.hyp", "test.detok.ref")}
    assert all(len(v) == 50 for v in lines.values())  # data.toy.test_size=50
    record = json.loads((ev / "test.json").read_text())
    # the files are what was scored
    assert record["bleu"] == pytest.approx(tokenized_bleu(lines["test.hyp"], lines["test.ref"]))
    assert record["bleu"] > 5.0  # a trained model, not noise
    assert record["checkpoints"] == [p.name for p in ckpt.numbered_checkpoints(run_dir)]
    assert record["checkpoints"] == ["checkpoint_200.pt", "checkpoint_220.pt", "checkpoint_240.pt"]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["bleu"] == record["bleu"] and result["sacrebleu"] == record["sacrebleu"]
    assert result["sacrebleu_signature"].startswith("nrefs:1")
    assert result["status"] == "ok" and result["updates"] == 240  # training keys kept
    assert result["eval"]["test"]["beam"] == 5


def test_other_split_and_last_checkpoint(run_dir):
    before = json.loads((run_dir / "result.json").read_text()).get("bleu")
    record = evaluate_run(run_dir, split="valid", beam=1, average_last=0, max_len_a=1.2,
                          max_len_b=10, echo=lambda *_: None)
    assert record["checkpoints"] == ["checkpoint_last.pt"] and record["sentences"] == 50
    result = json.loads((run_dir / "result.json").read_text())
    assert result["eval"]["valid"]["bleu"] == record["bleu"]
    assert result.get("bleu") == before  # the headline score is the test split's


def test_averaging_changes_the_model(run_dir):
    from runner.run.folder import average_checkpoints

    paths = ckpt.numbered_checkpoints(run_dir)
    avg = average_checkpoints(paths)
    last = ckpt.load_checkpoint(paths[-1])["model"]
    states = [ckpt.load_checkpoint(p)["model"] for p in paths]
    key = next(k for k, v in last.items() if v.is_floating_point() and v.dim() == 2)
    torch.testing.assert_close(avg[key], sum(s[key] for s in states) / 3)
    assert not torch.equal(avg[key], last[key])


def test_decode_throughput(run_dir):
    state = ckpt.load_checkpoint(run_dir / ckpt.LAST)
    cfg = config_from_dict(state["config"], options_class, norm_options_class)
    data = load_eval_data(cfg, "test")
    model = build_model(cfg, len(data.src_dict), len(data.tgt_dict), data.tgt_dict.pad_index)
    model.load_state_dict(state["model"])
    stats = decode_throughput(model, data.splits["test"], beam=5)
    assert stats["sentences"] == 50 and stats["sentences_per_s"] > 0 and stats["tokens_per_s"] > 0


def test_bad_input_one_line_exit_2(run_dir, tmp_path, capsys):
    assert main_eval([str(tmp_path / "nope")]) == 2
    assert main_eval([str(run_dir), "--split", "dev2099"]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main_eval([str(empty)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("deepinit: error:") for line in err)
    assert "run folder not found" in err[0] and "dev2099" in err[1] and "no checkpoint" in err[2]
    # the same through the installed command
    proc = run_cli(["eval", str(tmp_path / "nope")], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr


def test_training_with_valid_bleu_best_checkpoint_and_final_bleu(tmp_path):
    run = tmp_path / "run"
    # RUN's reduced grammar, long enough that both validations score above 0 and apart (a
    # selection by the lowest BLEU, or a score that ignores the checkpoint, would fail below)
    cfg = compose(TINY + ["trainer.max_updates=180", "trainer.valid_interval=90", "trainer.save_interval=90",
                          "optim.lr=5e-3", "data.toy.nouns=8", "data.toy.verbs=4", "data.toy.adjectives=4",
                          "data.max_tokens=1024", "trainer.progress=false", "trainer.best_checkpoint_metric=bleu",
                          "trainer.final_bleu=true", "trainer.final_bleu_last=true", "trainer.eval_beam=2",
                          "trainer.keep_checkpoints=2", "data.toy.valid_size=20",
                          "data.toy.test_size=20"])
    result = train(cfg, run)
    valid = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "valid"]
    assert [v["step"] for v in valid] == [90, 180]
    assert all(v["bleu"] > 0 for v in valid) and valid[0]["bleu"] != valid[1]["bleu"]
    # the Validation's fields, BLEU (the run's valid_bleu scorer) last
    assert list(valid[0]) == ["split", "step", "epoch", "lr", "loss", "nll_loss", "ppl", "bleu"]
    best = ckpt.load_checkpoint(run / "checkpoint_best.pt")
    assert best["best_metric"] == max(v["bleu"] for v in valid)
    assert best["step"] == next(v["step"] for v in valid if v["bleu"] == best["best_metric"])
    on_disk = json.loads((run / "result.json").read_text())
    assert on_disk["bleu"] == result["bleu"] and on_disk["bleu"] > 0
    assert on_disk["sacrebleu_signature"].startswith("nrefs:1")
    test = on_disk["eval"]["test"]
    assert test["beam"] == 2 and test["max_len_a"] == 1.2 and test["sentences"] == 20
    assert test["checkpoints"] == ["checkpoint_90.pt", "checkpoint_180.pt"]
    # final_bleu_last: the last checkpoint alone, scored beside the average into files of its own
    last = on_disk["eval"]["test.last"]
    assert last["checkpoints"] == ["checkpoint_last.pt"] and on_disk["bleu_last"] == last["bleu"]
    assert on_disk["sacrebleu_last"] == last["sacrebleu"]
    assert json.loads((run / "eval" / "test.json").read_text())["checkpoints"] == test["checkpoints"]
    assert (run / "eval" / "test.last.hyp").is_file()
    alone = evaluate_run(run, split="test", beam=2, max_len_a=1.2, max_len_b=10, max_tokens=cfg.data.max_tokens,
                         checkpoint="checkpoint_last.pt", update_result=False, out_name="check",
                         echo=lambda *_: None)
    assert alone["bleu"] == on_disk["bleu_last"] > 0
    assert (run / "eval" / "check.hyp").read_text() == (run / "eval" / "test.last.hyp").read_text()
    assert (run / "eval" / "check.hyp").read_text() != (run / "eval" / "test.hyp").read_text()
    record = evaluate_run(run, split="valid", beam=2, max_len_a=1.2, max_len_b=10,
                          checkpoint="checkpoint_best.pt", echo=lambda *_: None)
    assert record["checkpoints"] == ["checkpoint_best.pt"]
    # the in-training score of that checkpoint, reproduced by deepinit eval
    assert record["bleu"] == pytest.approx(best["best_metric"])


def test_checkpoint_that_does_not_fit_the_data(run_dir, tmp_path, capsys):
    import shutil

    other = tmp_path / "other"
    other.mkdir()
    state = ckpt.load_checkpoint(run_dir / ckpt.LAST)
    state["config"]["data"]["toy"]["nouns"] = 40  # a larger vocabulary than the weights have
    torch.save(state, other / ckpt.LAST)
    shutil.copy(run_dir / "result.json", other / "result.json")
    assert main_eval([str(other), "--average-last", "0", *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not fit the model" in err[0]


def test_eval_refuses_data_whose_vocabulary_changed(tmp_path):
    """Same vocabulary size, other words: decoding would be silently wrong, so eval stops."""
    from runner.data.dictionary import Dictionary
    from runner.run.evaluate import EvalError, check_dictionaries

    saved = Dictionary(["a", "b", "c", "d"])
    saved.save(tmp_path / "dict.src.txt")
    saved.save(tmp_path / "dict.tgt.txt")
    check_dictionaries(tmp_path, saved, saved)  # the same words: fine
    with pytest.raises(EvalError, match="vocabulary differs"):
        check_dictionaries(tmp_path, Dictionary(["a", "b", "c", "e"]), saved)


def test_final_bleu_last_with_one_checkpoint_and_when_its_decode_fails(tmp_path):
    """Scoring checkpoint_last.pt alone already (eval_average_last=1): bleu_last is that score,
    without a second decode. A failing second decode leaves the averaged score in place."""
    import shutil

    from runner.run.evaluate import final_scores

    run = tmp_path / "run"
    cfg = compose(TINY + ["trainer.max_updates=20", "trainer.save_interval=10", "trainer.valid_interval=10",
                          "trainer.progress=false", "trainer.eval_beam=1", "trainer.keep_checkpoints=2",
                          "data.toy.test_size=20"])
    train(cfg, run)
    cfg.trainer.final_bleu, cfg.trainer.final_bleu_last, cfg.trainer.eval_average_last = True, True, 1
    one = final_scores(cfg, run)
    assert one["eval"]["test"]["checkpoints"] == ["checkpoint_last.pt"] and "test.last" not in one["eval"]
    assert one["bleu_last"] == one["bleu"] and one["sacrebleu_last"] == one["sacrebleu"]
    cfg.trainer.eval_average_last = 2
    (run / "checkpoint_last.pt").unlink()  # the numbered ones average; the last one cannot load
    shutil.copy(run / "dict.src.txt", run / "checkpoint_last.pt")
    broken = final_scores(cfg, run)
    assert broken["eval"]["test"]["checkpoints"] == ["checkpoint_10.pt", "checkpoint_20.pt"]
    assert broken["bleu"] is not None and "bleu_last" not in broken
    assert broken["bleu_last_error"].startswith("EvalError")


def test_a_score_filed_under_its_own_name_leaves_the_headline_numbers(run_dir):
    before = json.loads((run_dir / "result.json").read_text())
    record = evaluate_run(run_dir, beam=1, max_len_a=1.2, max_len_b=10, checkpoint="checkpoint_last.pt",
                          out_name="test.alone", echo=lambda *_: None)
    after = json.loads((run_dir / "result.json").read_text())
    assert after["eval"]["test.alone"]["bleu"] == record["bleu"]
    assert after.get("bleu") == before.get("bleu") and after["eval"].get("test") == before.get("eval", {}).get("test")
    assert (run_dir / "eval" / "test.alone.hyp").is_file()
