"""Where the packaged configuration lives."""
from __future__ import annotations

from pathlib import Path


def config_dir() -> Path:
    """conf/ inside an installed wheel (runner/conf), else the checkout's top-level conf/."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise SystemExit("deepinit: cannot find its conf/ folder (broken install?)")


def sweeps_dir() -> Path:
    """sweeps/ in a checkout, runner/conf/sweep in a wheel (conf/sweep links to ../sweeps)."""
    return config_dir() / "sweep"
