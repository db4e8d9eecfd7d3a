"""A stop signal that lands while a checkpoint is being written: the checkpoint is written whole,
then the signal is handled as it would have been (not turned into torch's error from a torn zip,
which made a stopped sweep cell read as a crash)."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from runner.run import folder


def _signals_inside_torch_save(monkeypatch, *signums: int) -> list[int]:
    """torch.save that sends `signums` to this process once its zip file is open and before its
    records are written (torch.serialization._save runs inside torch.save's zip writer), so
    that the handlers would run with the file half-written. Returns the number of saves."""
    import torch.serialization as serialization

    real = serialization._save
    calls = [0]

    def save(*args, **kwargs):
        calls[0] += 1
        for signum in signums:
            os.kill(os.getpid(), signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(serialization, "_save", save)
    return calls


def test_sigint_during_a_checkpoint_is_raised_after_it_is_written(tmp_path, monkeypatch):
    folder.save_checkpoint(tmp_path, {"step": torch.tensor(1)}, 1, keep=2)
    calls = _signals_inside_torch_save(monkeypatch, signal.SIGINT)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        folder.save_checkpoint(tmp_path, {"step": torch.tensor(2)}, 2, keep=2)
    assert calls == [1]
    # The new checkpoint is complete, its numbered link too, and no temporary file is left.
    assert int(folder.load_checkpoint(tmp_path / folder.LAST)["step"]) == 2
    assert [p.name for p in folder.numbered_checkpoints(tmp_path)] == ["checkpoint_1.pt", "checkpoint_2.pt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert signal.getsignal(signal.SIGINT) is handler  # the run's handler is back


def test_every_held_signal_reaches_its_handler_after_the_file_is_in_place(tmp_path, monkeypatch):
    # SIGTERM and submitit's preemption signal (SIGUSR2) are held too; SIGINT's handler raising
    # does not keep the others from running.
    path = tmp_path / "checkpoint_best.pt"
    seen = []  # (signal, whether the checkpoint was in place when its handler ran)
    record = lambda signum, frame: seen.append((signum, path.exists()))  # noqa: E731
    previous = {s: signal.signal(s, record) for s in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        _signals_inside_torch_save(monkeypatch, signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
        with pytest.raises(KeyboardInterrupt):
            folder.save_checkpoint_file({"step": torch.tensor(7)}, path)
        assert seen == [(signal.SIGTERM, True), (signal.SIGUSR2, True)]
        assert int(folder.load_checkpoint(path)["step"]) == 7
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def test_an_ignored_signal_stays_ignored_and_a_stale_temporary_file_goes(tmp_path, monkeypatch):
    stale = tmp_path / ".c.pt.k1ll3d.tmp"  # what a run killed mid-write leaves
    stale.write_bytes(b"torn")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _signals_inside_torch_save(monkeypatch, signal.SIGINT)
        folder.save_checkpoint_file({"step": torch.tensor(3)}, tmp_path / "c.pt")  # no exception
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_a_signal_taken_by_another_thread_still_interrupts_a_wait_for_a_child():
    """The kernel may hand a process's SIGINT to any thread (torch's, a load probe's); Python
    then raises KeyboardInterrupt in the main thread only when it runs Python code again. A main
    thread blocked in one long wait for a child saw it only when the child ended: `deepinit bench`
    hung after a time limit's SIGINT. wait_interruptibly wakes every poll_s."""
    import subprocess
    import threading
    import time

    from runner.run.folder import wait_interruptibly

    child = subprocess.Popen(["sleep", "30"])

    def interrupt_this_thread():
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    started = time.monotonic()
    threading.Thread(target=interrupt_this_thread).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            wait_interruptibly(child, poll_s=0.2)
        assert time.monotonic() - started < 5
    finally:
        child.kill()
        child.wait()


def test_the_commit_named_by_the_environment_wins_over_the_checkouts_git(monkeypatch):
    """A copied checkout can carry an older .git than its code (a GPU machine's copy): the commit
    in DEEPINIT_GIT_COMMIT is the one recorded; without it, git's HEAD."""
    import subprocess

    from runner.run.folder import git_commit
    from tests.conftest import REPO

    monkeypatch.delenv("DEEPINIT_GIT_COMMIT", raising=False)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_commit() == (head or None)
    monkeypatch.setenv("DEEPINIT_GIT_COMMIT", "f" * 40)
    assert git_commit() == "f" * 40
