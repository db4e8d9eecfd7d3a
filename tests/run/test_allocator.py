"""runner/run/allocator.py: a CPU training process keeps its freed memory instead of mapping it
again (and taking a page fault per page) every update. Each check runs in a child process, since
a process keeps the setting for the rest of its life."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from runner.run.allocator import KEPT, cpu_training_allocator
from tests.conftest import REPO, TINY

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
needs_glibc = pytest.mark.skipif(not GLIBC, reason="glibc's mallopt: Linux with glibc only")

# The allocation pattern of a training step, made deterministic with malloc itself: blocks
# allocated, touched and freed together, 80 MB of them per cycle. Under glibc's default
# thresholds the freed top of the heap exceeds the trim threshold (at most 64 MiB), so every
# cycle hands the pages back and faults them in again. 1 MiB blocks, first in a fresh process, sit
# above glibc's starting mmap threshold (128 KiB, which a wrong or refused mmap threshold leaves
# static once the trim threshold is set) and test the mmap threshold; 100,000-byte blocks sit
# under every mmap threshold and test the trim threshold.
PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, json, resource, sys
    from runner.run.allocator import host_allocator, keep_freed_memory
    applied = keep_freed_memory() if sys.argv[1] == "keep" else False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    faults = {}
    for size in (1 << 20, 100_000):  # the larger first: an earlier cycle's kept heap would serve it
        def cycle():
            blocks = [libc.malloc(size) for _ in range(80_000_000 // size)]
            for b in blocks:
                ctypes.memset(b, 1, size)
            for b in reversed(blocks):
                libc.free(b)
        cycle()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            cycle()
        faults[size] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
    print(json.dumps({"applied": applied, "allocator": host_allocator(), "faults": list(faults.values())}))
""")
MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD")


def clean_env(**extra: str) -> dict:
    """This environment without the user's malloc settings (which would make the run leave the
    allocator alone), plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if k not in MALLOC_ENV}, **extra}


def probe(mode: str, **extra: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=clean_env(**extra), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_glibc
def test_kept_memory_cuts_the_page_faults_of_a_training_allocation_pattern():
    default, kept = probe("default"), probe("keep")
    assert not default["applied"] and default["allocator"] == "glibc, default thresholds"
    assert kept["applied"] and kept["allocator"] == KEPT
    # 80 MB is about 19,500 pages: measured ~17,700 and ~19,600 faults per cycle by default, 0
    # kept (fewer of both with transparent huge pages always on, hence a ratio)
    for size, before, after in zip(("1 MiB", "100 kB"), default["faults"], kept["faults"]):
        assert before >= 20 and after * 20 <= before, (size, before, after)


@needs_glibc
@pytest.mark.parametrize("name,value,recorded", [
    ("MALLOC_TRIM_THRESHOLD_", "100000000", "glibc, the user's thresholds"),
    ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=100000", "glibc, the user's thresholds"),
    ("LD_PRELOAD", "libjemalloc.so.2", "jemalloc (LD_PRELOAD)"),
])
def test_the_users_own_allocator_settings_win(name, value, recorded):
    """The user's thresholds, or another malloc preloaded: nothing is changed, and the record says
    which. (LD_PRELOAD names a library that need not exist here: only the name is read, and the
    loader skips one it cannot find, with a warning.)"""
    out = probe("keep", **{name: value})
    assert not out["applied"] and out["allocator"] == recorded


@needs_glibc
def test_a_cpu_training_run_sets_it():
    """build_run on the CPU applies it (every training process: a run, a sweep cell, a DDP rank);
    with keep_host_memory=False (the bench's plain-PyTorch reference) it leaves it alone."""
    script = textwrap.dedent(f"""
        from runner.run import allocator
        from runner.run.build import build_run
        from tests.conftest import compose
        cfg = compose({[*TINY, "trainer.device=cpu"]!r})
        build_run(cfg, keep_host_memory=False)
        left = allocator.host_allocator()
        build_run(cfg)
        print(left, "|", allocator.host_allocator())
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env=clean_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f"glibc, default thresholds | {KEPT}"


def test_the_run_folder_says_which_allocator_the_run_had(tiny_run):
    """env.json (and so a suite's records) names the host allocator: timings of runs with and
    without it are not comparable."""
    run_dir, _ = tiny_run
    env = json.loads((run_dir / "env.json").read_text())
    if env["device"].startswith("cuda"):
        pytest.skip("the run trained on CUDA: the setting is CPU training's")
    assert env["host_allocator"] == cpu_training_allocator()
