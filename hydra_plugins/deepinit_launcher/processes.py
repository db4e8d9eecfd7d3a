"""Stopping a local sweep's worker processes for good.

submitit's local jobs are process trees: `sh -c` (when a setup line is given), submitit's
controller, one task per `tasks_per_node`, and whatever a task starts (DDP ranks, data workers).
Cancelling a job only signals its top process, and a task ignores SIGTERM (submitit keeps it for
preemption), so the launcher stops the whole tree itself: SIGINT to the workers (what Ctrl-C in a
terminal does; a cell then marks itself interrupted; submitit's controllers, left out of this
round, see their tasks end and exit by themselves), a grace period, then SIGKILL to whatever is
left. Linux reads the tree from /proc; elsewhere only the given processes are signalled.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence


def _parents() -> dict[int, int]:
    out = {}
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return out
    for p in entries:
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after "pid (comm)": state ppid ...
        if len(fields) > 1:
            out[int(p.name)] = int(fields[1])
    return out


def descendants(pid: int) -> set[int]:
    """Every process below pid (children, grandchildren, ...), from /proc; empty without it."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        pass
    if Path("/proc").is_dir():
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_tree(root: int, popens: Sequence = (), grace_s: float = 10.0,
              interrupt: Optional[Callable[[int], bool]] = None) -> set[int]:
    """Stop every process below `root` (this process, for a launcher) and the given Popen
    objects' processes: SIGINT to those `interrupt` selects (all by default), up to grace_s
    seconds for everything to end, then SIGKILL. A second SIGINT/SIGTERM meanwhile skips the rest
    of the grace period. Returns the pids killed."""
    hurry: list[int] = []
    handlers = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            handlers[sig] = signal.signal(sig, lambda signum, frame: hurry.append(signum))
        except ValueError:  # not the main thread
            pass
    try:
        pids = descendants(root) | {p.pid for p in popens}
        _send([p for p in pids if interrupt is None or interrupt(p)], signal.SIGINT)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not hurry:
            for p in popens:
                p.poll()  # reap our own children, or they linger as zombies
            pids |= descendants(root)
            if not any(alive(p) for p in pids):
                return set()
            time.sleep(0.1)
        left = {p for p in pids | descendants(root) if alive(p)}
        _send(left, signal.SIGKILL)
        end = time.monotonic() + 5.0
        while time.monotonic() < end and any(alive(p) for p in left):
            for p in popens:
                p.poll()
            time.sleep(0.05)
        return left
    finally:
        for sig, old in handlers.items():
            signal.signal(sig, old)
