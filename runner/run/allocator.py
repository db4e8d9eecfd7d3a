"""Keep freed host memory in the process during CPU training, instead of handing it back to the
kernel after every update.

glibc's malloc serves large blocks (above a threshold that starts at 128 KiB and follows the
largest block freed so far) with their own mmap and unmaps them on free, and it returns free
memory at the top of the heap to the kernel once it exceeds a trim threshold (twice that). A
training step allocates and frees the same activation-sized blocks every update, so each update
maps them again and the kernel zero-fills every page on first touch: about 1,000 to 1,800 page
faults per update of the nanoGPT CPU preset (`ru_minflt`), several milliseconds of a 60 ms
update. Fixing both thresholds (mallopt(3); glibc's own MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_ variables do the same before the process starts) keeps those pages mapped
and reused: about 5 faults per update. The price is that the process keeps up to TRIM_BYTES of
freed memory instead of returning it, which a training process would allocate again anyway.

It changes where memory comes from, never a value: training is bit-for-bit the same.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt parameter numbers (glibc malloc/malloc.h: M_TRIM_THRESHOLD -1, M_MMAP_THRESHOLD -3)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# blocks up to 32 MiB from the heap: glibc's largest mmap threshold on 64-bit systems
# (malloc/malloc.c DEFAULT_MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * sizeof(long))
MMAP_BYTES = 32 * 2 ** 20
# at most 1 GiB of freed memory kept at the top of the heap
TRIM_BYTES = 2 ** 30
# the user's own settings of the same thresholds (read by glibc at start-up) win
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")

_applied = False


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process (see the module docstring). Returns
    True when they are set (now or by an earlier call); False, changing nothing, on a system
    without glibc's mallopt, or when the environment sets them already."""
    global _applied
    if _applied:
        return True
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if (not sys.platform.startswith("linux") or any(v in os.environ for v in USER_VARIABLES)
            or any(t in tunables for t in USER_TUNABLES)):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 on an error
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_BYTES))
    return _applied


def host_allocator() -> str:
    """What env.json and a suite's records say about this process's host allocator."""
    return "glibc, freed memory kept" if _applied else "default"
