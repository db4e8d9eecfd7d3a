"""Keep freed host memory in the process during CPU training, instead of handing it back to the
kernel after every update.

glibc's malloc serves large blocks (above a threshold that starts at 128 KiB and follows the
largest block freed so far) with their own mmap and unmaps them on free, and it returns free
memory at the top of the heap to the kernel once it exceeds a trim threshold (twice that). A
training step allocates and frees the same activation-sized blocks every update, so each update
maps them again and the kernel zero-fills every page on first touch: over a thousand page faults
per update of the nanoGPT CPU preset (`ru_minflt`; results/performance/lm-cpu-8b1329e/). Fixing
both thresholds (mallopt(3); glibc's own MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_
variables do the same before the process starts) keeps those pages mapped and reused: 0 to 3
faults per update there. The price is that each of the process's malloc arenas keeps up to
TRIM_BYTES of freed memory instead of returning it, memory a training process allocates again.

A process keeps the setting for the rest of its life (glibc has no way back to its dynamic
thresholds). It changes where memory comes from, never a value: training is bit-for-bit the same.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from typing import Optional

# mallopt parameter numbers (glibc malloc/malloc.h: M_TRIM_THRESHOLD -1, M_MMAP_THRESHOLD -3)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# blocks up to 32 MiB from the heap: glibc's largest mmap threshold on 64-bit systems
# (malloc/malloc.c DEFAULT_MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * sizeof(long))
MMAP_BYTES = 32 * 2 ** 20
# at most 1 GiB of freed memory kept at the top of each heap
TRIM_BYTES = 2 ** 30
# the user's own settings of the same thresholds (read by glibc at start-up) win
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")
# another malloc loaded in glibc's place: mallopt would still answer, and change nothing
PRELOADED_MALLOCS = ("jemalloc", "tcmalloc", "mimalloc")

KEPT = "glibc, freed memory kept"
_applied = False


def reason_left_alone() -> Optional[str]:
    """Why keep_freed_memory leaves this process's allocator as it is, in the words env.json
    records; None when it sets the thresholds."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "default"  # macOS, musl, ...: no glibc mallopt
    preloaded = [m for m in PRELOADED_MALLOCS if m in os.environ.get("LD_PRELOAD", "")]
    if preloaded:
        return f"{preloaded[0]} (LD_PRELOAD)"
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(v in os.environ for v in USER_VARIABLES) or any(t in tunables for t in USER_TUNABLES):
        return "glibc, the user's thresholds"
    return None


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process (see the module docstring). Returns
    True when they are set (now or by an earlier call); False, changing nothing, where
    reason_left_alone() gives a reason, or if glibc refuses them."""
    global _applied
    if _applied:
        return True
    if reason_left_alone() is not None:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 on an error (a refused mmap threshold changes nothing, and
    # the trim threshold is then left alone too)
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_BYTES))
    return _applied


def host_allocator() -> str:
    """What env.json and a suite's records say about this process's host allocator."""
    if _applied:
        return KEPT
    return reason_left_alone() or "glibc, default thresholds"


def cpu_training_allocator() -> str:
    """What a CPU training process started in this environment records (host_allocator there)."""
    return reason_left_alone() or KEPT
