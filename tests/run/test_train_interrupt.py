"""No work is lost to Ctrl-C: SIGINT/SIGTERM finish the update under way, save checkpoint_last.pt
and exit, and the same command resumes exactly there (the run's files equal an uninterrupted
run's), even before the first scheduled save; the message says what a rerun will do. Time-based
saves (trainer.save_interval_min) rewrite checkpoint_last.pt alone and change nothing else."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest

from runner.run import folder
from runner.run.train import stop_after_the_update, train
from runner.train.loop import Stopped, Trainer
from tests.conftest import DEEPINIT, TINY, compose, run_cli_here

TIMING = ("tokens_per_s", "wall_s")


def metrics(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in folder.read_metrics(run_dir)]


def same_result(a: dict, b: dict) -> None:
    for key in ("status", "updates", "train_loss", "valid_loss", "best_valid_loss", "train_tokens",
                "initial_loss", "first_logged_loss"):
        assert a[key] == b[key], key


@pytest.mark.slow
def test_sigint_before_the_first_save_resumes_where_it_stopped(tmp_path):
    """The issue's case: a run that saves every 1000 updates is stopped long before; it saves
    there, says so, and the rerun continues from that update, as if never stopped."""
    args = [*TINY, "trainer.max_updates=150", "trainer.save_interval=1000", "trainer.valid_interval=100",
            "trainer.log_interval=10", "data.toy.train_size=2000"]
    reference = tmp_path / "reference"
    assert run_cli_here(["train", *args, f"hydra.run.dir={reference}"], cwd=tmp_path).returncode == 0

    run_dir = tmp_path / "stopped"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([str(DEEPINIT), "train", *args, f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(folder.read_metrics(run_dir)) < 2:
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert "Traceback" not in out + err
    found = re.search(r"checkpoint_last.pt holds update (\d+): running the same command again resumes "
                      + re.escape(str(run_dir)) + r" from update (\d+)", err)
    assert found and found[1] == found[2], err
    step = int(found[1])
    assert 20 <= step < 150, err
    marker = json.loads((run_dir / "interrupted.json").read_text())
    assert marker["checkpoint"] is True and marker["resume_update"] == step
    assert folder.checkpoint_step(run_dir / folder.LAST) == step
    assert folder.numbered_checkpoints(run_dir) == []  # extra saves are not averaged

    proc = run_cli_here(["train", *args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"resumed from {run_dir / folder.LAST} at update {step}" in (run_dir / "train.log").read_text()
    a, b = (json.loads((d / "result.json").read_text()) for d in (reference, run_dir))
    same_result(a, b)
    assert b["resumed"] is True
    assert metrics(reference) == metrics(run_dir)


@pytest.mark.parametrize("stop_at, signum", [(13, signal.SIGINT), (20, signal.SIGTERM), (1, signal.SIGINT)])
def test_a_stop_inside_a_log_window_resumes_exactly(tmp_path, monkeypatch, stop_at, signum):
    """Stopped after update 13 (inside a log window and between divergence checks), 20 (at a
    window's end) or 1: the resumed run's records and result equal an uninterrupted run's."""
    cfg = compose([*TINY, "trainer.max_updates=30", "trainer.log_interval=10", "trainer.save_interval=30",
                   "trainer.valid_interval=15", "trainer.divergence.check_interval=5", "model.dropout=0.1"])
    reference = train(cfg, tmp_path / "reference")

    real_step = Trainer.step

    def step(self):
        out = real_step(self)
        if self.state.step == stop_at and not getattr(self, "_stopped_once", False):
            self._stopped_once = True
            self.stop_signal = signum  # what the signal handler does
        return out

    monkeypatch.setattr(Trainer, "step", step)
    run_dir = tmp_path / "stopped"
    with pytest.raises(Stopped) as stopped:
        train(cfg, run_dir)
    assert stopped.value.signum == signum and stopped.value.saved_step == stop_at
    assert folder.checkpoint_step(run_dir / folder.LAST) == stop_at
    assert not (run_dir / "result.json").exists()
    monkeypatch.setattr(Trainer, "step", real_step)
    resumed = train(cfg, run_dir)
    same_result(reference, resumed)
    assert metrics(tmp_path / "reference") == metrics(run_dir)


def test_time_based_saves_rewrite_the_last_checkpoint_only_and_change_nothing(tmp_path, monkeypatch):
    cfg = compose([*TINY, "trainer.max_updates=30", "trainer.log_interval=5", "trainer.save_interval=20",
                   "trainer.keep_checkpoints=5", "trainer.save_interval_min=0"])
    plain = train(cfg, tmp_path / "plain")
    saves = []
    real = folder.save_checkpoint
    monkeypatch.setattr(folder, "save_checkpoint",
                        lambda run_dir, state, step, keep: (saves.append((step, keep)), real(run_dir, state, step, keep)))
    cfg.trainer.save_interval_min = 1e-9  # due at every log window's end
    timed = train(cfg, tmp_path / "timed")
    assert saves == [(5, 0), (10, 0), (15, 0), (20, 5), (25, 0), (30, 5)]
    assert [p.name for p in folder.numbered_checkpoints(tmp_path / "timed")] == ["checkpoint_20.pt", "checkpoint_30.pt"]
    same_result(plain, timed)
    assert metrics(tmp_path / "plain") == metrics(tmp_path / "timed")


def test_the_default_saves_every_few_minutes():
    cfg = compose([])
    assert 0 < cfg.trainer.save_interval_min <= 10


def test_the_stop_handler_asks_once_then_stops_at_once(monkeypatch):
    trainer = SimpleNamespace(stop_signal=None, state=SimpleNamespace(step=7))
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Stopped) as stopped:
        with stop_after_the_update(trainer):
            os.kill(os.getpid(), signal.SIGTERM)  # the request
            assert trainer.stop_signal == signal.SIGTERM
            os.kill(os.getpid(), signal.SIGINT)  # a duplicate (a terminal and a launcher together)
            clock[0] += 10
            with pytest.raises(Stopped) as now:
                os.kill(os.getpid(), signal.SIGINT)  # later: at once, nothing saved
            assert now.value.saved_step is None and now.value.signum == signal.SIGINT
    # the request came after the last update: everything is saved
    assert stopped.value.signum == signal.SIGTERM and stopped.value.saved_step == 7
    assert {s: signal.getsignal(s) for s in before} == before


def test_the_resume_note_says_what_a_rerun_does(tmp_path):
    import torch

    from runner.run.attempt import resume_note

    assert resume_note(tmp_path) == f"nothing was saved yet: running the same command again starts {tmp_path} over from update 0"
    folder.save_checkpoint(tmp_path, {"step": 160, "model": {"w": torch.zeros(3)}}, 160, keep=0)
    assert resume_note(tmp_path) == (f"checkpoint_last.pt holds update 160: running the same command again "
                                     f"resumes {tmp_path} from update 160")
    assert "trainer.resume=false" in resume_note(tmp_path, resume=False)


@pytest.mark.slow
def test_a_stop_reaches_every_ddp_rank_and_the_run_resumes_exactly(tmp_path):
    """trainer.devices=2 on CPU: SIGINT to the launching process goes to both ranks, which agree
    to stop at the end of a log window, save, and end; the rerun resumes there."""
    import threading

    # the stop is asked for at update 10 and lands at the next log window's end (15): 60 updates
    # leave it room on a loaded machine and still cross a validation
    cfg = compose([*TINY, "trainer.devices=2", "trainer.max_updates=60", "trainer.log_interval=5",
                   "trainer.save_interval=100", "trainer.valid_interval=50", "trainer.threads=1",
                   "data.toy.train_size=2000"])
    reference = train(cfg, tmp_path / "reference")
    run_dir = tmp_path / "stopped"

    trained = threading.Event()

    def interrupt_when_training():
        deadline = time.time() + 120
        while (not trained.is_set() and time.time() < deadline
               and len(folder.read_metrics(run_dir)) < 2):
            time.sleep(0.02)
        if not trained.is_set():  # never into a later test of this process
            os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=interrupt_when_training, daemon=True)
    watcher.start()
    try:
        with pytest.raises(Stopped) as stopped:
            train(cfg, run_dir)
    finally:
        trained.set()
        watcher.join()
    step = stopped.value.saved_step
    assert step is not None and step % 5 == 0 and 10 <= step < 60
    assert folder.checkpoint_step(run_dir / folder.LAST) == step
    resumed = train(cfg, run_dir)
    same_result(reference, resumed)
    assert metrics(tmp_path / "reference") == metrics(run_dir)
