"""`deepinit train [overrides]` and `deepinit -m [overrides]`: the Hydra app.

Composes conf/ into the typed Config and calls runner.run.train.train in Hydra's output folder,
which is named by the overrides (never by a timestamp), so a second call resumes or skips.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import sys
import traceback
from pathlib import Path

import hydra
import submitit
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from runner.cli.compose import register_schemas
from runner.config import ConfigError
from runner.config.paths import config_dir
from runner.data.corpus import CorpusError
from runner.run.folder import write_result
from runner.run.train import train

# Hydra flags that take a value (the rest of its flags take none).
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
                     "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}
# Overrides that do not change a run's result stay out of folder names (see conf/train.yaml).
_NAME_EXCLUDED = ("hydra.", "hydra/", "trainer.progress=", "trainer.device=", "trainer.threads=",
                  "trainer.resume=", "trainer.tensorboard=")

_task_started = False


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra flags with their values, overrides)."""
    flags, overrides, it = [], [], iter(args)
    for arg in it:
        if arg in _FLAGS_WITH_VALUE:
            flags += [arg, next(it, "")]
        elif arg.startswith("-"):
            flags.append(arg)
        else:
            overrides.append(arg)
    return flags, overrides


def folder_name(overrides: list[str], default: str) -> str:
    """A run/sweep folder named by its overrides, never by a timestamp: the same command finds
    the same folder again (resume, skip finished cells)."""
    kept = sorted(o for o in overrides if not o.lstrip("+~").startswith(_NAME_EXCLUDED))
    name = ",".join(o.lstrip("+") for o in kept) or default
    name = re.sub(r"[^A-Za-z0-9_.,=+\-@:\[\]]", "_", name)
    if len(name) > 180:  # file names are limited to 255 bytes
        name = name[:150] + "-" + hashlib.sha1(name.encode()).hexdigest()[:12]
    return name


def with_output_dirs(args: list[str]) -> list[str]:
    """Flags first, then overrides: argparse takes the overrides as one trailing list."""
    flags, overrides = split_args(args)
    multirun = "-m" in flags or "--multirun" in flags
    given = {o.split("=", 1)[0] for o in overrides}
    extra = []
    if multirun and "hydra.sweep.dir" not in given:
        extra.append(f"hydra.sweep.dir='outputs/multirun/{folder_name(overrides, 'default')}'")
    if not multirun and "hydra.run.dir" not in given:
        extra.append(f"hydra.run.dir='outputs/runs/{folder_name(overrides, 'default')}'")
    return flags + overrides + extra


def run_task(cfg: DictConfig) -> None:
    """The Hydra task: one training run in Hydra's output dir (pickled by submitit launchers)."""
    global _task_started
    _task_started = True
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "WORLD_SIZE" not in os.environ:
        # A multi-task SLURM cell (tasks_per_node=trainer.devices): each task is one DDP rank.
        submitit.helpers.TorchDistributedEnvironment().export()
    multirun = hc.mode.name == "MULTIRUN"
    try:
        train(OmegaConf.to_object(cfg), run_dir)
    except (ConfigError, CorpusError) as err:
        logging.getLogger("deepinit.file").error("config error: %s", err)
        if multirun:
            # A sweep cell whose values are rejected: recorded as failed with the reason (not
            # left looking pending in reports; failed cells run again next call), and the
            # sweep goes on.
            write_result(run_dir, {"status": "failed", "reason": f"config: {err}"})
            sys.stderr.write(f"deepinit: error in {run_dir.name}: {err}\n")
            return
        # A user error: one line, exit 2, and nothing left in the run folder but train.log.
        _remove_hydra_files(run_dir)
        sys.stderr.write(f"deepinit: error: {err}\n")
        raise SystemExit(2)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a crash: recorded as failed, the sweep goes on
        logging.getLogger("deepinit.file").error("run failed:\n%s", traceback.format_exc())
        write_result(run_dir, {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"})
        if not multirun:
            sys.stderr.write(f"deepinit: run failed: {type(exc).__name__}: {exc} "
                             f"(traceback in {run_dir / 'train.log'})\n")
            raise SystemExit(1)
        return None
    return None


def _remove_hydra_files(run_dir: Path) -> None:
    shutil.rmtree(run_dir / ".hydra", ignore_errors=True)


def main(args: list[str]) -> int:
    register_schemas()
    sys.argv = [sys.argv[0], *with_output_dirs(args)]
    try:
        # config_path is resolved at call time so editable installs and wheels both work.
        hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="train")(run_task)()
    except SystemExit as exit_:
        # Hydra reports composition errors (unknown key, wrong type) and exits 1 before any
        # task starts: those are user errors, exit code 2.
        if exit_.code == 1 and not _task_started:
            raise SystemExit(2)
        raise
    return 0
