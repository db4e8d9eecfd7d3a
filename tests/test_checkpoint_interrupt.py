"""An interrupt that lands while a checkpoint is being written: the checkpoint is written whole,
then the interrupt is raised as the interrupt it is (not as torch's error from a torn zip, which
made a stopped sweep cell read as a crash)."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from runner.run import folder


def _interrupt_inside_torch_save(monkeypatch, signum: int) -> list[str]:
    """torch.save that receives `signum` in the middle of writing (after its first bytes)."""
    real = torch.save
    calls = []

    def save(obj, f, *args, **kwargs):
        f.write(b"")  # the file is open and torch.save has begun
        os.kill(os.getpid(), signum)
        calls.append("saved")
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(folder.torch, "save", save)
    return calls


def test_sigint_during_a_checkpoint_is_raised_after_it_is_written(tmp_path, monkeypatch):
    folder.save_checkpoint(tmp_path, {"step": torch.tensor(1)}, 1, keep=2)
    calls = _interrupt_inside_torch_save(monkeypatch, signal.SIGINT)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        folder.save_checkpoint(tmp_path, {"step": torch.tensor(2)}, 2, keep=2)
    assert calls == ["saved"]
    # The new checkpoint is complete, its numbered link too, and no temporary file is left.
    assert int(folder.load_checkpoint(tmp_path / folder.LAST)["step"]) == 2
    assert [p.name for p in folder.numbered_checkpoints(tmp_path)] == ["checkpoint_1.pt", "checkpoint_2.pt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert signal.getsignal(signal.SIGINT) is handler  # the run's handler is back


def test_a_sigterm_handler_runs_once_after_the_best_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint_best.pt"
    received = []  # (signal, whether the checkpoint was in place when the handler ran)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append((signum, path.exists())))
    try:
        _interrupt_inside_torch_save(monkeypatch, signal.SIGTERM)
        folder.save_checkpoint_file({"step": torch.tensor(7)}, path)
        assert received == [(signal.SIGTERM, True)]
        assert int(folder.load_checkpoint(path)["step"]) == 7
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_ignored_signal_stays_ignored(tmp_path, monkeypatch):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _interrupt_inside_torch_save(monkeypatch, signal.SIGINT)
        folder.save_checkpoint_file({"step": torch.tensor(3)}, tmp_path / "c.pt")  # no exception
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
