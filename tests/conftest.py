"""Shared helpers: compose configs exactly as the CLI does, and run the real `deepinit`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEEPINIT = Path(sys.executable).parent / "deepinit"
TINY = ["model=ci", "warmup.updates=5", "trainer.max_updates=20", "trainer.log_interval=5",
        "trainer.valid_interval=10", "trainer.save_interval=10", "trainer.tensorboard=false",
        "data.toy.train_size=600", "data.toy.valid_size=50", "data.toy.test_size=50"]


def compose(overrides: list[str] = ()):
    """The typed Config (dataclasses) for these overrides, composed from conf/ by the CLI's own
    composition (a bad override raises ConfigError)."""
    from runner.cli.compose import compose as cli_compose

    return cli_compose(list(overrides))


def run_cli(args: list[str], cwd: Path, timeout: float = 300, env: dict | None = None,
            **kwargs) -> subprocess.CompletedProcess:
    env = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([str(DEEPINIT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)


@pytest.fixture
def tiny_overrides():
    return list(TINY)


def staged_data(folder: str) -> Path:
    """A real corpus folder (e.g. "multi30k") under the data root: $DEEPINIT_DATA_ROOT (`make test
    DATA_ROOT=PATH` sets it), else deepinit's per-user default."""
    from runner.data.corpus import default_data_root

    return default_data_root() / folder


def needs_staged(folder: str, what: str):
    """A skipif mark for tests that read `staged_data(folder)`; the reason names the folder."""
    path = staged_data(folder)
    return pytest.mark.skipif(
        not path.is_dir(),
        reason=f"{what} not found at {path}: set DEEPINIT_DATA_ROOT to the folder that holds "
               f"{folder.split('/')[0]}/ (or run make test DATA_ROOT=PATH)")


@pytest.fixture(autouse=True)
def _no_internet(monkeypatch):
    """No test reaches the internet: downloads go to a closed local port unless a test serves
    its own files (tests/data/test_download.py sets the mirror to its 127.0.0.1 server)."""
    monkeypatch.setenv("DEEPINIT_DOWNLOAD_MIRROR", "http://127.0.0.1:9")
