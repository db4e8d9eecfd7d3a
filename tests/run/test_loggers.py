"""Experiment trackers (logger=...): what each writes, read back with its own reader; missing
packages; the old trainer.tensorboard switch; a failing tracker never fails the run."""
from __future__ import annotations

import csv
import importlib.machinery
import importlib.util
import json
import sys
import types

import pytest

from runner.config import ConfigError
from runner.run import loggers
from runner.run.folder import MetricsLog, folder_name, read_metrics
from runner.run.train import train
from tests.conftest import TINY, compose, run_cli


def by_split(run_dir, split):
    return [r for r in read_metrics(run_dir) if r["split"] == split]


def test_choosing_loggers_and_the_tensorboard_alias():
    assert list(loggers.selected(compose([]))) == ["tensorboard"]  # the default
    assert list(loggers.selected(compose(["logger=csv"]))) == ["csv"]
    assert list(loggers.selected(compose(["logger=[csv,mlflow]"]))) == ["csv", "mlflow"]
    assert list(loggers.selected(compose(["logger=many_loggers"]))) == list(loggers.NAMES)
    assert list(loggers.selected(compose(["~logger"]))) == []
    assert list(loggers.selected(compose(["logger.csv.enabled=true"]))) == ["tensorboard", "csv"]
    # trainer.tensorboard, the old switch: false removes TensorBoard, true adds it
    assert list(loggers.selected(compose(["trainer.tensorboard=false"]))) == []
    assert list(loggers.selected(compose(["logger=csv", "trainer.tensorboard=true"]))) == ["tensorboard", "csv"]
    # the logger choice does not name the run folder
    assert folder_name(["logger=csv", "model=ci", "logger.csv.save_dir=x"], "default") == "model=ci"


def test_missing_package_is_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"logger=wandb needs the wandb package.*pip install"):
        loggers.check_available(compose(["logger=many_loggers"]))
    from runner.config import validate
    with pytest.raises(ConfigError, match="logger.wandb.mode"):
        validate(compose(["logger=wandb", "logger.wandb.mode=cloud"]))
    # a field of a logger that is not chosen: say how to choose it
    with pytest.raises(ConfigError, match=r"the mlflow logger is not chosen: add logger=mlflow"):
        validate(compose(["logger.mlflow.tracking_uri=sqlite:///x.db"]))
    validate(compose(["logger.csv.enabled=true"]))  # adds csv to the default


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_missing_package_on_the_command_line(tmp_path):
    proc = run_cli(["train", *TINY, "logger=wandb", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "deepinit: error: logger=wandb needs the wandb package, which is not installed: "
        "pip install 'deepinit[wandb]' (or pip install wandb); or choose another logger (~logger for none)"]


def test_csv_logger_writes_readable_csv(tmp_path):
    run_dir = tmp_path / "run"
    result = train(compose([*TINY, "logger=csv"]), run_dir)
    with open(run_dir / "csv" / "train.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    train_records = by_split(run_dir, "train")
    assert [int(r["step"]) for r in rows] == [r["step"] for r in train_records] == [5, 10, 15, 20]
    assert [float(r["loss"]) for r in rows] == [r["loss"] for r in train_records]
    with open(run_dir / "csv" / "valid.csv", newline="") as f:
        valid = list(csv.DictReader(f))
    assert [float(r["nll_loss"]) for r in valid] == [r["nll_loss"] for r in by_split(run_dir, "valid")]
    with open(run_dir / "csv" / "params.csv", newline="") as f:
        params = {r["key"]: r["value"] for r in csv.DictReader(f)}
    assert params["model.dim"] == str(compose(TINY).model.dim) and params["trainer.max_updates"] == "20"
    with open(run_dir / "csv" / "result.csv", newline="") as f:
        written = {r["key"]: r["value"] for r in csv.DictReader(f)}
    assert written["status"] == "ok" and float(written["valid_loss"]) == result["valid_loss"]
    assert not any(p.name.startswith("events.out") for p in run_dir.iterdir())  # csv only


def test_mlflow_logger_round_trip_and_resume(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'deepinit[mlflow]')")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*TINY, "logger=mlflow", f"logger.mlflow.tracking_uri={uri}",
            "logger.mlflow.experiment_name=test", "+logger.mlflow.tags.team=nmt"]
    run_dir = tmp_path / "runs" / "cell"
    # 10 updates, then the result is removed and the run resumed to 20 from its checkpoint
    first = train(compose([*args, "trainer.max_updates=10"]), run_dir)
    assert first["status"] == "ok"
    run_id = json.loads((run_dir / "loggers.json").read_text())["mlflow"]["run_id"]
    (run_dir / "result.json").unlink()
    result = train(compose(args), run_dir)
    assert result["resumed"] and result["updates"] == 20

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("test")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # the resumed run continued the same run
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "cell"
    assert run.data.tags["team"] == "nmt" and run.data.tags["deepinit.folder"] == "runs"
    assert run.data.tags["deepinit.run_dir"] == str(run_dir.resolve())
    params = run.data.params
    assert params["model.dim"] == str(compose(TINY).model.dim) and params["norm.placement"] == "post"
    history = client.get_metric_history(run_id, "train/loss")
    want = by_split(run_dir, "train")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == \
        [(r["step"], r["loss"]) for r in want]
    valid = client.get_metric_history(run_id, "valid/nll_loss")
    assert sorted(m.step for m in valid) == [r["step"] for r in by_split(run_dir, "valid")]
    assert run.data.metrics["result/valid_loss"] == result["valid_loss"]
    assert run.data.metrics["result/updates"] == 20
    assert run.data.tags["result.status"] == "ok"


class FakeWandb(types.ModuleType):
    """The part of wandb's API the logger uses, recording the calls."""

    def __init__(self):
        super().__init__("wandb")
        self.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
        self.util = types.SimpleNamespace(generate_id=lambda: "abc123")
        self.calls = {"init": [], "log": [], "config": {}, "summary": {}, "finish": []}

    def init(self, **kwargs):
        self.calls["init"].append(kwargs)
        calls = self.calls
        return types.SimpleNamespace(
            config=types.SimpleNamespace(update=lambda d, allow_val_change: calls["config"].update(d)),
            log=lambda d, step: calls["log"].append((step, d)),
            summary=types.SimpleNamespace(update=calls["summary"].update),
            finish=lambda exit_code: calls["finish"].append(exit_code))


def test_wandb_logger_offline_in_the_run_folder(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run_dir = tmp_path / "run"
    train(compose([*TINY, "logger=wandb"]), run_dir)
    (init,) = fake.calls["init"]
    assert init["mode"] == "offline" and init["dir"] == str(run_dir) and init["name"] == "run"
    assert init["id"] == "abc123" and init["resume"] == "allow"
    assert fake.calls["config"]["trainer.max_updates"] == 20
    assert [step for step, d in fake.calls["log"] if "train/loss" in d] == [5, 10, 15, 20]
    assert fake.calls["summary"]["result/status"] == "ok" and fake.calls["finish"] == [0]


def test_a_failing_logger_is_dropped_not_the_run(tmp_path, caplog):
    class Broken(loggers.Logger):
        name = "broken"
        closed = None

        def log_metrics(self, record):
            raise RuntimeError("server gone")

        def close(self, status):
            Broken.closed = status

    metrics = MetricsLog(tmp_path, None, [Broken()])
    metrics.write({"split": "train", "step": 1, "loss": 1.0})
    metrics.write({"split": "train", "step": 2, "loss": 0.5})
    metrics.close("ok")
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert Broken.closed == "failed"
    assert sum("logger broken failed" in m for m in caplog.messages) == 1


def test_a_logger_that_cannot_start_is_left_out(tmp_path, monkeypatch, caplog):
    def refuse(self, *args):
        raise OSError("read-only file system")

    monkeypatch.setattr(loggers.CsvLogger, "__init__", refuse)
    made = loggers.make_loggers(compose(["logger=[csv,tensorboard]"]), tmp_path, None)
    assert [m.name for m in made] == ["tensorboard"]
    assert any("logger csv could not start" in m for m in caplog.messages)
    for m in made:
        m.close("ok")
