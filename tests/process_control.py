"""Freezing and inspecting the processes of a running cell, for tests that must stop a cell at a
known point however fast the machine trains (from /proc; Linux only)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Iterable


def send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def holding_files_under(pids: Iterable[int], folder: Path) -> set[int]:
    """The processes among pids with a file open under folder (a training cell keeps its
    train.log open)."""
    held = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith(str(folder) + os.sep):
                held.add(pid)
                break
    return held


def all_processes() -> set[int]:
    return {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}


def signal_pending(pid: int, sig: int = signal.SIGINT) -> bool:
    """sig waits in the process's pending set (/proc/PID/status, SigPnd or ShdPnd), or the
    process is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    bit = 1 << (sig - 1)
    return any(int(line.split()[1], 16) & bit for line in status.splitlines()
               if line.startswith(("SigPnd:", "ShdPnd:")))


def wait_pending(pids: Iterable[int], sig: int, timeout_s: float = 30.0) -> bool:
    """Wait until sig is pending on every process in pids; whether it is."""
    pids = list(pids)
    deadline = time.time() + timeout_s
    while time.time() < deadline and not all(signal_pending(p, sig) for p in pids):
        time.sleep(0.05)
    return all(signal_pending(p, sig) for p in pids)
