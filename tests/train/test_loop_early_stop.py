"""trainer.early_stop (stop when the validation loss stops improving) and the losses at the start
of a run that result.json records (initial_loss, first_logged_loss).

The expected stopping update is computed here from the validation losses in metrics.jsonl of a
run without the rule (the same training: the rule only decides when to stop), so the tests check
the trainer against the documented rule, not against itself."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from runner.config import ConfigError, validate
from runner.model.loss import label_smoothed_nll
from runner.run import folder
from runner.run.build import build_run
from runner.run.train import train
from runner.train.loop import DataPosition, Trainer, batch_stream, next_update
from tests.conftest import TINY, compose

# 80 updates, a validation every 5: the tiny model learns slowly and steadily, so the loss keeps
# improving by a shrinking amount and a min_delta of 0.08 stops it part-way
RUN = [*TINY, "trainer.max_updates=80", "trainer.valid_interval=5", "trainer.save_interval=10",
       "trainer.progress=false"]
RULE = {"min_delta": 0.08, "window": 10, "min_updates": 0}
TIMING = ("tokens_per_s", "wall_s")


def rule_overrides(min_delta: float, window: int, min_updates: int) -> list[str]:
    return [f"trainer.early_stop.min_delta={min_delta}", f"trainer.early_stop.window={window}",
            f"trainer.early_stop.min_updates={min_updates}"]


def records(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in folder.read_metrics(run_dir)]


def valid_curve(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in folder.read_metrics(run_dir) if r["split"] == "valid"]


def expected_stop(curve, min_delta: float, window: int, min_updates: int):
    """The documented rule, applied to a list of (update, validation loss): an improvement is a
    loss more than min_delta below the last improvement's (the first validation is one); stop at
    the first validation at or after min_updates that is `window` updates past the last one."""
    reference = reference_step = None
    for step, loss in curve:
        if reference is None or loss < reference - min_delta:
            reference, reference_step = loss, step
        elif step >= min_updates and step - reference_step >= window:
            return step
    return None


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The run without the rule: all 80 updates."""
    run_dir = tmp_path_factory.mktemp("reference")
    train(compose(RUN), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """The same run with RULE, uninterrupted."""
    run_dir = tmp_path_factory.mktemp("stopped")
    train(compose([*RUN, *rule_overrides(**RULE)]), run_dir)
    return run_dir


def test_the_rule_stops_at_the_update_the_validation_curve_gives(reference, stopped):
    curve = valid_curve(reference)
    assert [s for s, _ in curve] == list(range(5, 85, 5))
    want = expected_stop(curve, **RULE)
    assert want is not None and 20 < want < 80  # it fires, and neither at once nor at the cap
    result = folder.read_result(stopped)
    assert result["status"] == "ok"
    assert result["stopped_early"] is True and result["stop_update"] == want
    assert result["updates"] == want
    assert result["early_stop"] == {**RULE, "last_improvement": _last_improvement(curve, want)}
    # a suite's record keeps the rule with the stop, so its report can say where runs stopped
    from runner.tables.records import record_from_run
    record = record_from_run(stopped, [], {}, 1)
    assert (record["stopped_early"], record["stop_update"], record["early_stop"]) == (
        True, want, result["early_stop"])
    # and each validation's NLL beside its loss, from the same metrics lines
    valid = [r for r in records(stopped) if r["split"] == "valid"]
    assert record["valid_nll_curve"] == [(r["step"], r["nll_loss"]) for r in valid] and len(valid) >= 4
    assert [s for s, _ in record["valid_nll_curve"]] == [s for s, _ in record["valid_curve"]]
    assert want - result["early_stop"]["last_improvement"] >= RULE["window"]
    # the same training up to the stop, nothing after it; the final checkpoint is at the stop
    got = records(stopped)
    assert got == [r for r in records(reference) if r["step"] <= want]
    assert got[-1]["split"] == "valid" and got[-1]["step"] == want
    assert int(folder.load_checkpoint(stopped / folder.LAST)["step"]) == want
    assert result["valid_loss"] == dict(curve)[want]


def _last_improvement(curve, upto: int) -> int:
    reference = step_of = None
    for step, loss in curve:
        if step > upto:
            break
        if reference is None or loss < reference - RULE["min_delta"]:
            reference, step_of = loss, step
    return step_of


def test_a_stop_between_log_steps_logs_the_last_updates_and_checkpoints_there(reference, tmp_path):
    want = expected_stop(valid_curve(reference), **RULE)
    assert want % 3  # not a log step below
    result = train(compose([*RUN, *rule_overrides(**RULE), "trainer.log_interval=3",
                            "trainer.save_interval=30"]), tmp_path)
    assert result["stop_update"] == want and valid_curve(tmp_path) == [
        c for c in valid_curve(reference) if c[0] <= want]
    last = folder.read_metrics(tmp_path)[-1]  # the updates since the last log step
    assert last["split"] == "train" and last["step"] == want
    assert result["train_loss"] == last["loss"]
    assert int(folder.load_checkpoint(tmp_path / folder.LAST)["step"]) == want


def test_the_rule_never_stops_before_min_updates(reference, tmp_path):
    curve = valid_curve(reference)
    early = expected_stop(curve, **RULE)
    min_updates = early + 5
    want = expected_stop(curve, **{**RULE, "min_updates": min_updates})
    assert want is not None and min_updates <= want < 80  # min_updates held it back, then it fired
    result = train(compose([*RUN, *rule_overrides(**{**RULE, "min_updates": min_updates})]), tmp_path)
    assert result["stopped_early"] is True and result["stop_update"] == want > early
    assert max(r["step"] for r in records(tmp_path)) == want


def test_a_rule_that_does_not_fire_changes_nothing(reference, tmp_path):
    curve = valid_curve(reference)
    assert expected_stop(curve, 0.0, 10, 0) is None  # the loss still improves at every validation
    result = train(compose([*RUN, *rule_overrides(0.0, 10, 0)]), tmp_path)
    assert result["stopped_early"] is False and result["stop_update"] is None
    assert result["updates"] == 80 and result["early_stop"]["window"] == 10
    assert records(tmp_path) == records(reference)
    off = folder.read_result(reference)  # the default: no rule
    assert off["stopped_early"] is False and off["stop_update"] is None and off["early_stop"] is None


class Interrupted(Exception):
    pass


def test_a_resumed_run_stops_where_the_uninterrupted_one_does(stopped, reference, tmp_path,
                                                              monkeypatch):
    stop = folder.read_result(stopped)["stop_update"]
    curve = valid_curve(reference)
    # Interrupted after the checkpoint at 30 and the validation at 35. The rule's state at 30 is
    # what decides: a resumed run that started the rule afresh would stop elsewhere.
    kill_at, checkpoint_at = 37, 30
    assert checkpoint_at < 35 < kill_at < stop
    assert expected_stop([c for c in curve if c[0] > checkpoint_at], **RULE) != stop
    cfg = compose([*RUN, *rule_overrides(**RULE)])
    real_step = Trainer.step

    def step(self):
        out = real_step(self)
        if self.state.step == kill_at:
            raise Interrupted
        return out

    monkeypatch.setattr(Trainer, "step", step)
    with pytest.raises(Interrupted):
        train(cfg, tmp_path)
    assert not (tmp_path / "result.json").exists()
    assert int(folder.load_checkpoint(tmp_path / folder.LAST)["step"]) == checkpoint_at
    monkeypatch.setattr(Trainer, "step", real_step)
    result = train(cfg, tmp_path)
    assert result["resumed"] is True
    assert result["stopped_early"] is True and result["stop_update"] == stop
    want = folder.read_result(stopped)
    for key in ("updates", "train_loss", "valid_loss", "best_valid_loss", "initial_loss",
                "first_logged_loss", "early_stop", "train_tokens"):
        assert result[key] == want[key], key
    assert records(tmp_path) == records(stopped)


def test_a_run_that_stopped_and_lost_its_result_does_not_train_on(stopped, tmp_path):
    """Killed after the final checkpoint, before result.json: the resumed run ends where it was."""
    want = folder.read_result(stopped)
    cfg = compose([*RUN, *rule_overrides(**RULE)])
    train(cfg, tmp_path)
    (tmp_path / "result.json").unlink()
    result = train(cfg, tmp_path)
    assert result["resumed"] is True and result["stopped_early"] is True
    assert result["updates"] == result["stop_update"] == want["stop_update"]
    assert records(tmp_path) == records(stopped)


def test_initial_loss_is_the_first_batch_under_the_initial_weights(tmp_path):
    """Without dropout: a forward pass of update 1's micro-batches through a freshly built model,
    done here, gives the recorded initial_loss; first_logged_loss is the first train record's."""
    overrides = [*TINY, "trainer.update_freq=2", "trainer.max_updates=10", "model.dropout=0",
                 "model.attention_dropout=0", "model.activation_dropout=0"]
    cfg = compose(overrides)
    result = train(cfg, tmp_path / "run")

    parts = build_run(compose(overrides))
    stream = batch_stream(parts.batches, cfg.trainer.seed, DataPosition())
    _, batches, tokens = next_update(stream, parts.train_split, 2, 1, 0, parts.pad, parts.eos,
                                     parts.device)
    parts.model.train()
    total = 0.0
    with torch.no_grad():
        for batch in batches:  # the padded path (training takes the unpadded one on CPU)
            logits = parts.model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad)
            loss, _ = label_smoothed_nll(logits, batch.target, cfg.trainer.label_smoothing, parts.pad)
            total += float(loss)
    assert result["initial_loss"] == pytest.approx(total / tokens, rel=1e-5)
    # a fresh model predicts close to uniformly over the target vocabulary
    assert abs(result["initial_loss"] - math.log(len(parts.data.tgt_dict))) < 1.0
    first = next(r for r in folder.read_metrics(tmp_path / "run") if r["split"] == "train")
    assert first["step"] == cfg.trainer.log_interval
    assert result["first_logged_loss"] == first["loss"] != result["initial_loss"]


def test_initial_loss_tells_a_blow_up_in_training_from_one_at_init(reference, stopped, tmp_path):
    """The loss of update 1 is taken before that update changes a weight: a learning rate that
    blows the run up in its first updates leaves it as a sane run's, and the first logged loss
    shows the blow-up."""
    sane = folder.read_result(reference)
    assert math.isfinite(sane["initial_loss"])
    assert folder.read_result(stopped)["initial_loss"] == sane["initial_loss"]  # bit for bit
    blown = train(compose([*RUN, "optim=sgd", "optim.lr=1e6", "optim.momentum=0.9", "warmup=none",
                           "schedule=constant"]), tmp_path)
    assert blown["status"] == "diverged"
    assert blown["initial_loss"] == sane["initial_loss"]
    first = blown["first_logged_loss"]
    assert not math.isfinite(first) or first > sane["first_logged_loss"] + 1.0


@pytest.mark.parametrize("overrides, key", [
    (["trainer.early_stop.window=-1"], "trainer.early_stop.window"),
    (["trainer.early_stop.min_updates=-5"], "trainer.early_stop.min_updates"),
    (["trainer.early_stop.min_delta=-0.1"], "trainer.early_stop.min_delta"),
    (["trainer.early_stop.min_delta=nan"], "trainer.early_stop.min_delta"),
    (["trainer.early_stop.window=100", "trainer.valid_interval=0"], "trainer.early_stop.window"),
])
def test_bad_settings_are_one_line_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate(compose([*TINY, *overrides]))
    assert str(err.value).startswith(key + "=") and "\n" not in str(err.value)


def test_the_rule_is_off_by_default():
    rule = compose([]).trainer.early_stop
    assert (rule.window, rule.min_delta, rule.min_updates) == (0, 0.0, 0)
    validate(compose([*TINY, "trainer.early_stop.window=0", "trainer.valid_interval=0"]))


def test_result_records_carry_the_new_fields():
    from runner.tables.records import RESULT_FIELDS

    assert {"initial_loss", "first_logged_loss", "stopped_early", "stop_update"} <= set(RESULT_FIELDS)
