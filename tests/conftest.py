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
    """The typed Config (dataclasses) for these overrides, composed from conf/ like the CLI."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from runner.cli import config_dir
    from runner.config import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=list(overrides))
    return OmegaConf.to_object(cfg)


def run_cli(args: list[str], cwd: Path, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([str(DEEPINIT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)


@pytest.fixture
def tiny_overrides():
    return list(TINY)
