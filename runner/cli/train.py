"""`deepinit train [overrides]` and `deepinit -m [overrides]`: the Hydra app.

Composes conf/ into the typed Config and calls runner.run.train.train in Hydra's output folder,
which is named by the overrides (never by a timestamp), so a second call resumes or skips.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Optional, Sequence

import hydra
import submitit
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from runner.cli.compose import register_schemas
from runner.config import Config, ConfigError
from runner.config.paths import config_dir
from runner.data.corpus import CorpusError
from runner.init import get_scheme
from runner.run.folder import folder_name, write_result
from runner.run.train import train

# Hydra flags that take a value (the rest of its flags take none).
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
                     "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}
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


def scheme_warmup(cfg: Config, choices, task_overrides: Sequence[str]) -> Optional[str]:
    """An init scheme that trains without warmup (T-Fixup) gets its own warmup.updates when the
    user set none: no `warmup=...` choice, no `warmup.*` override, and the default group's value
    (a sweep preset that writes another value counts as explicit). Returns the log line, or None
    when nothing changed."""
    wanted = get_scheme(cfg.init.name).warmup_updates
    if wanted is None or cfg.warmup.updates == wanted:
        return None
    default = OmegaConf.load(config_dir() / "warmup" / "default.yaml").updates
    explicit = (choices.get("warmup", "default") != "default" or cfg.warmup.updates != default
                or any(o.lstrip("+~").startswith("warmup") for o in task_overrides))
    if explicit:
        return None
    cfg.warmup.updates = wanted
    return (f"init={cfg.init.name} trains without warmup: warmup.updates={wanted} (set "
            "warmup.updates=N to use one)")


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
        typed = OmegaConf.to_object(cfg)
        note = scheme_warmup(typed, hc.runtime.choices, hc.overrides.task)
        if note:
            logging.getLogger("deepinit").info(note)
            # .hydra/config.yaml says what runs
            OmegaConf.save(OmegaConf.structured(typed), run_dir / ".hydra" / "config.yaml")
        train(typed, run_dir)
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
