"""Atomic, self-describing checkpoints (model, optimizer, schedule position, RNG, config)."""
from __future__ import annotations

import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

LAST = "checkpoint_last.pt"
NUMBERED = re.compile(r"checkpoint_(\d+)\.pt$")


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(obj):
    return tuple(_as_tuple(x) for x in obj) if isinstance(obj, (list, tuple)) else obj


def save_atomic(obj: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, then rename: a kill at any moment
    leaves either the old checkpoint or the new one, never a torn file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp creates 0600; checkpoints are shared like any output
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=map_location, weights_only=True)


def numbered_checkpoints(run_dir: Path) -> list[Path]:
    """checkpoint_<step>.pt files, oldest first."""
    found = [(int(m.group(1)), p) for p in Path(run_dir).glob("checkpoint_*.pt")
             if (m := NUMBERED.search(p.name))]
    return [p for _, p in sorted(found)]


def save(run_dir: Path, state: dict[str, Any], step: int, keep: int) -> None:
    """checkpoint_last.pt always; with keep > 0 also checkpoint_<step>.pt (for averaging), as a
    hard link to the same bytes, pruning all but the newest `keep`."""
    run_dir = Path(run_dir)
    last = run_dir / LAST
    save_atomic(state, last)
    if keep > 0:
        numbered = run_dir / f"checkpoint_{step}.pt"
        tmp = run_dir / f".{numbered.name}.link"
        tmp.unlink(missing_ok=True)
        os.link(last, tmp)
        os.replace(tmp, numbered)
        for old in numbered_checkpoints(run_dir)[:-keep]:
            old.unlink(missing_ok=True)
