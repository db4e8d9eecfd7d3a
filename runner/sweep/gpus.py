"""GPU assignment for local sweeps: which devices each concurrently running cell gets.

Pure logic on device-id lists, so it is testable without CUDA. The local launcher
(hydra_plugins/deepinit_launcher) uses it because submitit's local executor gives every job the
same `CUDA_VISIBLE_DEVICES=0..k-1` (submitit/local/local.py; facebookresearch/hydra#2757).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Callable, Mapping, Optional, Sequence

Slot = tuple[str, ...]  # the device ids one cell sees, in CUDA_VISIBLE_DEVICES order


def parse_visible_devices(value: Optional[str]) -> Optional[list[str]]:
    """Device ids named by a CUDA_VISIBLE_DEVICES value; None when the variable is unset.

    CUDA stops at the first invalid entry (e.g. "-1"), so an empty string or "-1" means no GPU.
    Entries may be indices or UUIDs ("GPU-...", "MIG-..."), kept as strings.
    """
    if value is None:
        return None
    devices: list[str] = []
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        devices.append(item)
    return devices


def _nvidia_smi_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def detect_devices(environ: Mapping[str, str] = os.environ,
                   count: Callable[[], int] = _nvidia_smi_count) -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES when set (respecting a
    restriction made by the user or an outer scheduler), else every GPU `count()` reports."""
    visible = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        return visible
    return [str(i) for i in range(count())]


def make_slots(devices: Sequence[str], gpus_per_cell: int = 1,
               cpu_parallelism: int = 1) -> list[Slot]:
    """Disjoint device groups, one per cell that may run at the same time.

    With GPUs: len(devices) // gpus_per_cell slots, so no two running cells share a GPU and
    leftover GPUs stay idle. Without GPUs (or gpus_per_cell == 0): `cpu_parallelism` empty slots.
    """
    if gpus_per_cell < 0:
        raise ValueError(f"gpus_per_cell={gpus_per_cell}: expected >= 0")
    if cpu_parallelism < 1:
        raise ValueError(f"cpu_parallelism={cpu_parallelism}: expected >= 1")
    devices = list(devices)
    if len(set(devices)) != len(devices):
        raise ValueError(f"duplicate device ids in {devices}")
    if not devices or gpus_per_cell == 0:
        return [()] * cpu_parallelism
    if gpus_per_cell > len(devices):
        raise ValueError(
            f"each cell wants {gpus_per_cell} GPUs but only {len(devices)} are available "
            f"({','.join(devices)})")
    n = len(devices) // gpus_per_cell
    return [tuple(devices[i * gpus_per_cell:(i + 1) * gpus_per_cell]) for i in range(n)]


class SlotPool:
    """Hands out slots to cells and takes them back; at most len(slots) cells hold one at once."""

    def __init__(self, slots: Sequence[Slot]):
        if not slots:
            raise ValueError("no slots to run cells on")
        self._slots = list(slots)
        self._free = list(range(len(self._slots)))
        self._owner: dict[int, object] = {}

    @property
    def capacity(self) -> int:
        return len(self._slots)

    def has_free(self) -> bool:
        return bool(self._free)

    def acquire(self, owner: object) -> tuple[int, Slot]:
        if not self._free:
            raise RuntimeError("no free slot")
        idx = self._free.pop(0)  # lowest free index first: predictable device order
        self._owner[idx] = owner
        return idx, self._slots[idx]

    def release(self, idx: int) -> None:
        if idx not in self._owner:
            raise KeyError(f"slot {idx} is not in use")
        del self._owner[idx]
        self._free.append(idx)
        self._free.sort()

    def in_use(self) -> dict[int, object]:
        return dict(self._owner)


def cuda_visible_devices(slot: Slot) -> str:
    """The CUDA_VISIBLE_DEVICES value for a slot ("" hides every GPU on CPU-only cells)."""
    return ",".join(slot)
