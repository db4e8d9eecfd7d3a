"""runner/run/allocator.py: a CPU training process keeps its freed memory instead of mapping it
again (and taking a page fault per page) every update. Each check runs in a child process, since
the setting is the process's for the rest of its life."""
from __future__ import annotations

import ctypes.util
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None,
                                reason="glibc's mallopt: Linux only")

# The allocation pattern of a training step, made deterministic with malloc itself: blocks under
# glibc's smallest mmap threshold (128 KiB), 80 MB of them, touched, then freed together. Under
# the default thresholds the freed top of the heap exceeds the trim threshold (at most 64 MiB), so
# every cycle hands the pages back and faults them in again.
PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, resource, sys
    from runner.run.allocator import keep_freed_memory
    applied = keep_freed_memory() if sys.argv[1] == "keep" else False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    def cycle():
        blocks = [libc.malloc(100_000) for _ in range(800)]
        for b in blocks:
            ctypes.memset(b, 1, 100_000)
        for b in reversed(blocks):
            libc.free(b)
    cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        cycle()
    print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
""")


def faults_per_cycle(mode: str, env: dict | None = None) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=env, check=True).stdout.split()
    return out[0] == "True", float(out[1])


def test_kept_memory_cuts_the_page_faults_of_a_training_allocation_pattern():
    applied_default, default = faults_per_cycle("default")
    applied, kept = faults_per_cycle("keep")
    assert not applied_default and applied
    # 80 MB is about 19,500 pages: measured ~17,700 faults per cycle by default, 0 kept
    assert default > 10_000, default
    assert kept < 100, kept


def test_the_users_own_glibc_setting_wins(monkeypatch):
    """MALLOC_TRIM_THRESHOLD_ (or GLIBC_TUNABLES's malloc thresholds) set: nothing is changed."""
    import os

    for name, value in (("MALLOC_TRIM_THRESHOLD_", "100000000"),
                        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=100000000")):
        applied, _ = faults_per_cycle("keep", env={**os.environ, name: value})
        assert not applied, name


def test_a_cpu_training_run_sets_it():
    """build_run on the CPU applies it (every training process: a run, a sweep cell, a DDP rank)."""
    script = textwrap.dedent("""
        from runner.run import allocator
        from runner.run.build import build_run
        from tests.conftest import compose
        assert not allocator._applied
        build_run(compose(["task=lm", "data=shakespeare_char", "trainer.device=cpu"]))
        print(allocator._applied)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "True"


def test_the_run_folder_says_which_allocator_the_run_had(tiny_run):
    """env.json (and so a suite's records) names the host allocator: timings of runs with and
    without it are not comparable."""
    import json

    run_dir, _ = tiny_run
    assert json.loads((run_dir / "env.json").read_text())["host_allocator"] == "glibc, freed memory kept"
