"""`deepinit train [overrides]` and `deepinit -m [overrides]`: the Hydra app.

Composes conf/ into the typed Config and calls runner.run.train.train in Hydra's output folder,
which is named by the overrides (never by a timestamp), so a second call resumes or skips.

A sweep (`-m`) ends with a table of its cells' statuses and exits by the rule in
runner/sweep/status.py: 0 when every cell finished (diverged counts: it is a result), 1 when any
cell failed or was interrupted (each failed cell's RUN_DIR/error.txt says why; the other cells'
results are kept), 128+N when the driver was stopped by signal N. SIGTERM is handled like Ctrl-C:
unfinished cells are marked interrupted and the same command resumes them.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

import hydra
import submitit
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.hydra_config import HydraConfig
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.cli.compose import compose, describe_error, register_schemas, with_option_classes
from runner.config import ConfigError
from runner.config.paths import config_dir
from runner.data.corpus import CorpusError
from runner.run import attempt
from runner.run.build import resolve_config
from runner.run.folder import folder_name
from runner.run.status import ACTIVE, FINISHED
from runner.run.train import train
from runner.sweep.status import exit_code, render, sweep_states

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


def method_group_options(defaults) -> dict[str, str]:
    """The groups a config's defaults list picks, {group: option}, from its `[optional] override
    /group[@package]: option` entries (`_self_` and other plain entries pick none)."""
    out = {}
    for entry in defaults or []:
        if not isinstance(entry, dict) or len(entry) != 1:
            continue
        (key, option), = entry.items()
        group = key.split()[-1].lstrip("/").split("@")[0]  # drops "optional", "override", "@pkg"
        out[group] = str(option)
    return out


def method_groups_replaced(choices) -> Optional[str]:
    """`method=X` picks groups (conf/method/X.yaml's `override /group: option`), and a sweep
    preset or a later override merged after it can pick others: then the run is not method X as
    conf/method describes it. Returns the warning line, or None when every group is X's."""
    method = choices.get("method")
    path = config_dir() / "method" / f"{method}.yaml"
    if not method or not path.is_file():
        return None
    raw = OmegaConf.to_container(OmegaConf.load(path))
    replaced = []
    for group, option in method_group_options(raw.get("defaults") if isinstance(raw, dict) else None).items():
        if str(choices.get(group)) != str(option):
            replaced.append((f"{group}={option}", f"{group}={choices.get(group)}"))
    if not replaced:
        return None
    return (f"method={method} sets {', '.join(m for m, _ in replaced)}, but this run has "
            f"{', '.join(r for _, r in replaced)} (a sweep preset or override, merged after the method)")


def cfg_print_note(args: list[str]) -> Optional[str]:
    """`--cfg job|all` prints the config as composed, before the run fills in what it leaves to
    the init scheme (warmup=auto; runner/run/build.py `resolve_config`): a trailing YAML comment
    says what the run would change (None when nothing, or for `-m`, `--package` and another
    config name or folder, whose output is not the whole config of this app's run)."""
    try:  # Hydra's own parser (private: a release that moves it only loses this note), so every
        # spelling it accepts (--cfg=job, -cjob) reads the same
        from hydra._internal.utils import get_args_parser  # noqa: PLC0415 (private: see above)

        ns = get_args_parser().parse_args(args)
    except (ImportError, SystemExit):
        return None
    if (ns.cfg not in ("job", "all") or ns.multirun or ns.package is not None
            or ns.config_name or ns.config_dir or ns.config_path):
        return None
    try:
        note = resolve_config(compose(ns.overrides))
    except ConfigError:  # Hydra has printed the config; a note that cannot be worked out is left off
        return None
    return f"# when the run starts: {note}" if note else None


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
    attempt.begin_attempt(run_dir)  # a rerun cell reads as running, not as its last failure
    try:
        typed = with_option_classes(OmegaConf.to_object(cfg))  # the scheme's and placement's options classes
        try:  # a note for the reader: it must never be what fails a run
            replaced = method_groups_replaced(hc.runtime.choices)
        except Exception as exc:  # noqa: BLE001
            replaced = None
            logging.getLogger("deepinit.file").debug("method check skipped: %s", exc)
        if replaced:
            logging.getLogger("deepinit").warning(replaced)
        train(typed, run_dir)  # it fills in the warmup left to the init scheme, and says so
    except (ConfigError, CorpusError) as err:
        logging.getLogger("deepinit.file").error("config error: %s", err)
        if multirun:
            # A sweep cell whose values are rejected: recorded as failed with the reason (not
            # left looking pending in reports; failed cells run again next call), and the
            # sweep goes on.
            attempt.record_failure(run_dir, f"config: {err}")
            sys.stderr.write(f"deepinit: error in {run_dir.name}: {err}\n")
            return
        # A user error: one line, exit 2, and nothing left in the run folder but train.log.
        _remove_hydra_files(run_dir)
        sys.stderr.write(f"deepinit: error: {err}\n")
        raise SystemExit(2)
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM (attempt.Interrupted, loop.Stopped)
        name = attempt.signal_name(attempt.signal_of(exc))
        attempt.mark_interrupted(run_dir, name)
        if not multirun:
            resume = bool(OmegaConf.select(cfg, "trainer.resume", default=True))
            sys.stderr.write(f"deepinit: interrupted ({name}); {attempt.resume_note(run_dir, resume)}\n")
        raise
    except submitit.core.utils.UncompletedJobError as exc:  # out of time and out of requeues
        logging.getLogger("deepinit.file").error("interrupted: %s", exc)
        attempt.mark_interrupted(run_dir, str(exc))
        return None
    except Exception as exc:  # a crash: recorded as failed, the sweep goes on
        trace = traceback.format_exc()
        logging.getLogger("deepinit.file").error("run failed:\n%s", trace)
        attempt.record_failure(run_dir, f"{type(exc).__name__}: {exc}", trace)
        where = run_dir / attempt.ERROR_FILE
        if not multirun:
            sys.stderr.write(f"deepinit: run failed: {type(exc).__name__}: {exc} (traceback in {where})\n")
            raise SystemExit(1)
        sys.stderr.write(f"deepinit: cell {run_dir.name} failed: {type(exc).__name__}: {exc} "
                         f"(traceback in {where})\n")
        return None
    return None


def _remove_hydra_files(run_dir: Path) -> None:
    shutil.rmtree(run_dir / ".hydra", ignore_errors=True)


def sweep_dir_of(args: list[str]) -> Optional[Path]:
    """The hydra.sweep.dir of a `-m` command line (with_output_dirs always gives one); None when
    it is only known at run time (an interpolation such as ${now:...})."""
    _, overrides = split_args(with_output_dirs(args))
    given = [o for o in overrides if o.startswith("hydra.sweep.dir=")]
    if not given:
        return None
    try:
        value = str(OverridesParser.create().parse_overrides([given[-1]])[0].value())
    except Exception:  # Hydra rejects it itself, with a better message
        return None
    return None if "${" in value else Path(value)


def sweep_summary(sweep_dir: Optional[Path], started: float, signum: Optional[int] = None) -> int:
    """The end of `deepinit -m`: a table of this call's cells (multirun.yaml) and the exit code
    (runner/sweep/status.py). Nothing when no sweep was launched."""
    stopped = 128 + signum if signum else 0
    marker = sweep_dir / "multirun.yaml" if sweep_dir is not None else None
    if marker is None or not marker.exists() or marker.stat().st_mtime < started - 2:
        return stopped
    try:  # the launcher's `wait` (slurm.yaml), as the sweep saw it
        wait = OmegaConf.select(OmegaConf.load(marker), "hydra.launcher.wait", default=True)
    except Exception:
        wait = True
    waited = str(wait).lower() not in ("false", "0", "no")
    states = sweep_states(sweep_dir, include_other=False)
    render(states, sweep_dir, title=f"sweep {sweep_dir}")
    if signum:
        sys.stderr.write(f"deepinit: stopped by {attempt.signal_name(signum)}; run the same command "
                         "again to resume the unfinished cells\n")
        return stopped
    code = exit_code(states, waited=waited)
    if code:
        bad = [s for s in states if s.status not in FINISHED + ACTIVE]
        sys.stderr.write(f"deepinit: {len(bad)} of {len(states)} cells did not finish (a failed "
                         f"cell's error.txt says why); the other cells' results are kept; run the "
                         "same command again to rerun only those\n")
    elif not waited:
        print(f"submitted; follow it with `deepinit sweep status {sweep_dir}` and collect finished "
              f"cells with `deepinit report {sweep_dir}`")
    return code


# A file-system error in the driver (creating the run or sweep folder, writing Hydra's files in
# it) that the user can fix: a folder without write permission, a read-only or full disk.
_USER_OS_ERRORS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                   errno.ENAMETOOLONG, errno.ENOTDIR)


def user_error(exc: BaseException, multirun: bool) -> Optional[str]:
    """The one line for an error of the driver (outside a run's own task) that the user can fix:
    Hydra's composition and override errors, a config or corpus the launcher rejects, an output
    folder that cannot be written. None for anything else (a bug)."""
    if isinstance(exc, (HydraException, OmegaConfBaseException)):
        return describe_error(exc)
    if isinstance(exc, (ConfigError, CorpusError)):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno in _USER_OS_ERRORS:
        where = exc.filename if exc.filename is not None else "the output folder"
        key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        return (f"cannot write {where}: {exc.strerror or exc} (choose a writable folder with "
                f"{key}=PATH)")
    return None


@contextlib.contextmanager
def one_repository_for_group_listing():
    """Hydra's app help (`deepinit --help`) lists the options of every config group, and copies
    the whole config repository for each of its ~120 queries (ConfigLoaderImpl.get_group_options
    builds a fresh caching repository each time): ~4 s of a 5 s help. Nothing changes the
    repository while help prints, so the queries without overrides share one copy here."""
    original = ConfigLoaderImpl.get_group_options
    shared: dict[int, object] = {}

    def get_group_options(self, group_name, results_filter=ObjectType.CONFIG, config_name=None,
                          overrides=None):
        if config_name is not None or overrides:
            return original(self, group_name, results_filter, config_name, overrides)
        if id(self) not in shared:
            shared[id(self)] = self._parse_overrides_and_create_caching_repo(None, [])[1]
        return shared[id(self)].get_group_options(group_name, results_filter)

    ConfigLoaderImpl.get_group_options = get_group_options
    try:
        yield
    finally:
        ConfigLoaderImpl.get_group_options = original


def main(args: list[str]) -> int:
    with attempt.sigterm_raises():  # SIGTERM stops a run or a sweep like Ctrl-C does
        return _main(args)


def _main(args: list[str]) -> int:
    register_schemas()
    sys.argv = [sys.argv[0], *with_output_dirs(args)]
    flags, _ = split_args(args)
    multirun = "-m" in flags or "--multirun" in flags
    sweep_dir = sweep_dir_of(args) if multirun else None
    started = time.time()
    # Hydra prints its errors itself, several lines each (a traceback for some), unless
    # HYDRA_FULL_ERROR is set: then they reach this function, which words them in one line. A
    # user who set HYDRA_FULL_ERROR=1 gets Hydra's full traceback, as Hydra documents.
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        # config_path is resolved at call time so editable installs and wheels both work.
        app_help = "--help" in flags or "-h" in flags
        with one_repository_for_group_listing() if app_help else contextlib.nullcontext():
            hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="train")(run_task)()
    except KeyboardInterrupt as exc:
        signum = attempt.signal_of(exc)
        if multirun:
            return sweep_summary(sweep_dir, started, signum)
        if not _task_started:
            sys.stderr.write(f"deepinit: interrupted ({attempt.signal_name(signum)})\n")
        return 128 + signum
    except SystemExit as exit_:
        # Hydra reports composition errors (unknown key, wrong type) and exits 1 before any
        # task starts: those are user errors, exit code 2.
        if exit_.code == 1 and not _task_started:
            raise SystemExit(2)
        raise
    except Exception as exc:
        if full_error == "1":
            raise
        if isinstance(exc, ValueError) and str(exc).startswith("Only one of"):
            # Hydra's check of its own flags (e.g. `-m ... --cfg job`), raised before composing
            sys.stderr.write(f"deepinit: {exc} (got: {' '.join(flags)})\n")
            return 2
        line = user_error(exc, multirun)
        if line is None:
            raise  # a bug: runner.cli.main writes the traceback to a file and exits 1
        sys.stderr.write(f"deepinit: error: {line}\n")
        return 2
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error
    if not multirun and (note := cfg_print_note(args)):
        print(note)
    return sweep_summary(sweep_dir, started) if multirun else 0
