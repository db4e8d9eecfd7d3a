"""Shared helpers: compose configs exactly as the CLI does, and run the real `deepinit`."""
from __future__ import annotations

import inspect
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEEPINIT = Path(sys.executable).parent / "deepinit"
TINY = ["model=ci", "warmup.updates=5", "trainer.max_updates=20", "trainer.log_interval=5",
        "trainer.valid_interval=10", "trainer.save_interval=10", "trainer.tensorboard=false",
        "data.toy.train_size=600", "data.toy.valid_size=50", "data.toy.test_size=50"]


_composed: dict = {}


def compose(overrides: list[str] = ()):
    """The typed Config (dataclasses) for these overrides, composed from conf/ by the CLI's own
    composition (a bad override raises ConfigError). Kept per overrides and DEEPINIT_* environment
    (the only variables conf/ and the presets read: oc.env) for the rest of the session, since
    many tests compose the same configs (Hydra's composition: a large part of a second each);
    each call gets its own copy."""
    import copy

    from runner.cli.compose import compose as cli_compose

    key = (tuple(overrides), tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("DEEPINIT_"))))
    if key not in _composed:
        _composed[key] = cli_compose(list(overrides))
    return copy.deepcopy(_composed[key])


def run_cli(args: list[str], cwd: Path, timeout: float = 300, env: dict | None = None,
            **kwargs) -> subprocess.CompletedProcess:
    env = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([str(DEEPINIT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)


def run_cli_all(commands: dict, timeout: float = 300) -> dict[object, subprocess.CompletedProcess]:
    """run_cli for each {key: (args, cwd)}, each in its own process, as many at a time as there are
    CPU cores: for tests that each check one command at the process boundary (exit code, stderr),
    whose commands are independent. {key: the command's CompletedProcess}."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = {key: pool.submit(run_cli, args, cwd, timeout) for key, (args, cwd) in commands.items()}
        return {key: future.result() for key, future in futures.items()}


class _Stdio(io.StringIO):
    """A text stream for sys.stdout/sys.stderr that reads like the pipe `run_cli` gives the
    command: not a terminal, and with no file descriptor of its own."""

    def isatty(self) -> bool:
        return False


def run_cli_here(args: list[str], cwd: Path, env: dict | None = None,
                 columns: int = 200) -> subprocess.CompletedProcess:
    """`deepinit args` as `run_cli` runs it (cwd, environment with OMP_NUM_THREADS=1 (torch: one
    thread) and COLUMNS=columns, stdout and stderr captured as text, the exit code), but in this
    process through runner.cli.main, the function the `deepinit` script calls, without a new
    interpreter's start-up (torch and Hydra imports: seconds per call). For tests whose subject is
    what a command does, not the process boundary (those keep `run_cli`). The process state a
    command changes is put back: cwd, os.environ, sys.argv, signal handlers, logging handlers
    (Hydra's job logging), torch's thread count, Hydra's global state (GlobalHydra, HydraConfig),
    and the rich consoles, which read COLUMNS afresh. Not put back: glibc's malloc thresholds,
    which a CPU training run fixes for the rest of the process (runner/run/allocator.py; they
    change where memory comes from, never a value)."""
    import logging

    import rich
    import torch
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    import runner.cli
    import runner.cli.train as cli_train
    from runner import console as console_module

    env = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1", "COLUMNS": str(columns)}
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv[:]
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    saved_threads = torch.get_num_threads()
    loggers = [logging.root] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                if isinstance(lg, logging.Logger)]
    saved_logging = {lg: (lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers}
    saved_consoles = rich._console, console_module.console._width, console_module.console._height
    saved_stdio, saved_hydra_config = (sys.stdout, sys.stderr), HydraConfig.instance().cfg
    out, err = _Stdio(), _Stdio()
    code = 0
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        GlobalHydra.instance().clear()
        cli_train._task_started = False  # module state of one `deepinit train` process
        rich._console = None  # Hydra's RichHandler console: made afresh, at this COLUMNS
        console_module.console._width = console_module.console._height = None
        torch.set_num_threads(1)  # what OMP_NUM_THREADS=1 gives a new process
        sys.stdout, sys.stderr = out, err
        try:
            runner.cli.main(list(args))
        except SystemExit as exit_:  # main always ends so
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        else:
            raise AssertionError("runner.cli.main returned instead of exiting")
    finally:
        sys.stdout, sys.stderr = saved_stdio
        for lg, (handlers, level, propagate, disabled) in saved_logging.items():
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()
            lg.handlers[:] = handlers
            lg.level, lg.propagate, lg.disabled = level, propagate, disabled
        for lg in logging.Logger.manager.loggerDict.values():  # loggers the command made
            if isinstance(lg, logging.Logger) and lg not in saved_logging:
                for handler in lg.handlers[:]:
                    handler.close()
                    lg.removeHandler(handler)
                lg.level, lg.propagate, lg.disabled = logging.NOTSET, True, False
        logging.Logger.manager._clear_cache()  # the levels were set without setLevel
        rich._console = saved_consoles[0]
        console_module.console._width, console_module.console._height = saved_consoles[1:]
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = saved_hydra_config
        torch.set_num_threads(saved_threads)
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        sys.argv[:] = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["deepinit", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One `deepinit train` of the TINY run (TensorBoard on, the last 2 numbered checkpoints kept),
    made once per session for the tests that each read another part of it (folder contents, the
    start summary, `analyze dependency`, telemetry off): (run folder, the command's output). They
    only read the folder."""
    root = tmp_path_factory.mktemp("tiny_run")
    run_dir = root / "run"
    proc = run_cli_here(["train", *TINY, "trainer.tensorboard=true", "trainer.keep_checkpoints=2",
                         f"hydra.run.dir={run_dir}"], cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir, proc


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


def _shakespeare_missing() -> str:
    """Why the tinyshakespeare corpus cannot be read where data=shakespeare_char looks for it
    (the data root's tinyshakespeare/, or downloads/ beside it), or "" when it can."""
    from runner.data.corpus import CorpusError
    from runner.data.lm import shakespeare_file

    try:
        shakespeare_file(None)
    except CorpusError as err:
        return str(err)
    return ""


_SHAKESPEARE_MISSING = _shakespeare_missing()
needs_shakespeare = pytest.mark.skipif(bool(_SHAKESPEARE_MISSING), reason=_SHAKESPEARE_MISSING or "found")


@pytest.fixture(autouse=True)
def _no_internet(monkeypatch):
    """No test reaches the internet: downloads go to a closed local port unless a test serves
    its own files (tests/data/test_download.py sets the mirror to its 127.0.0.1 server)."""
    monkeypatch.setenv("DEEPINIT_DOWNLOAD_MIRROR", "http://127.0.0.1:9")


# The signals whose handlers decide how a run stops (runner.run.train, runner.run.folder), and
# the handlers Python starts with when the shell does not ignore them. A test that leaves one
# changed (SIGINT ignored, say) silently changes what every later test in the same worker sees.
_STOP_SIGNALS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


def _reset_stop_signals() -> dict:
    """Put Python's own handlers of the stop signals back; {signal: handler found} of those that
    differed."""
    changed = {s: h for s, start in _STOP_SIGNALS.items() if (h := signal.getsignal(s)) != start}
    for s in changed:
        signal.signal(s, _STOP_SIGNALS[s])
    return changed


_reset_stop_signals()  # a shell without job control starts pytest with SIGINT ignored


@pytest.fixture(autouse=True)
def _signal_handlers_left_as_found():
    """Each test starts with Python's own handlers of the stop signals and must leave them so: a
    test that does not fails, naming the signal and the handler it left. A change made outside
    any test's own scope (a module fixture) is undone before the next test, with a warning."""
    if found := _reset_stop_signals():
        import warnings

        warnings.warn("a stop signal's handler was changed between tests and is put back: " + ", ".join(
            f"{signal.Signals(s).name}={h!r}" for s, h in found.items()))
    yield
    if left := _reset_stop_signals():
        pytest.fail("the test left signal handlers changed: " + ", ".join(
            f"{signal.Signals(s).name}={h!r} (expected {_STOP_SIGNALS[s]!r})" for s, h in left.items()))


# ----------------------------------------------------------------------------- pytest-xdist
# Module- and session-scoped fixtures whose tests cost far more than the fixture: their tests are
# better spread over the workers (each worker building its own copy) than queued on one.
_SPREAD_FIXTURES = {"paper_data"}


def _shared_fixture_group(item) -> str | None:
    """The xdist_group that keeps `item` on the worker that builds its shared fixture: for the
    first module- or session-scoped fixture of tests/ it uses (a module's trained run, a sweep, a
    bench), the module that defines it (one group for all of a module's fixtures) or, for one of
    this file's session fixtures, its name. None for a test that uses none."""
    tests = Path(__file__).resolve().parent
    defs = item._fixtureinfo.name2fixturedefs if hasattr(item, "_fixtureinfo") else {}
    for name in item.fixturenames:
        if name in _SPREAD_FIXTURES:
            continue
        for fixturedef in defs.get(name, ()):
            if fixturedef.scope not in ("module", "session"):
                continue
            try:
                source = Path(inspect.getfile(fixturedef.func)).resolve()
            except (TypeError, OSError):
                continue
            if tests in source.parents:
                where = source.relative_to(tests).as_posix()
                return f"{where}::{name}" if fixturedef.scope == "session" else where
    return None


def _group_of(item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return _shared_fixture_group(item)


@pytest.hookimpl(trylast=True)  # after xdist's own
def pytest_collection_modifyitems(config, items):
    """In a pytest-xdist worker (make test: -n CORES+1 --dist loadgroup), whose collection is the same
    in all workers: the tests marked slow or slurm come first, so that no long test starts last
    while the other workers have run out of work (the groups are handed out first, largest first,
    then one test at a time in this order); and {node id: group} of the tests goes to the file the
    controller named (_XdistGroups), before the worker reports its collection."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    items.sort(key=lambda item: item.get_closest_marker("slow") is None
               and item.get_closest_marker("slurm") is None)
    file = getattr(config, "workerinput", {}).get("deepinit_xdist_groups")
    if file:
        import json

        groups = {item.nodeid: group for item in items if (group := _group_of(item)) is not None}
        tmp = Path(f"{file}.{os.environ['PYTEST_XDIST_WORKER']}")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, file)  # every worker writes the same map


class _XdistGroups:
    """--dist loadgroup that works with this pytest: pytest-xdist 3.8 groups tests by a suffix it
    writes into the node ids, which pytest 9.2's structured ids no longer take, so the xdist_group
    marks are silently ignored (pytest-dev/pytest-xdist#1386). Here each worker writes its tests'
    groups to a file the controller names (its xdist_group mark, or the shared module- or
    session-scoped fixture of tests/ it uses: the fixture is then built once, as in one process),
    and the controller's scheduler (xdist's LoadGroupScheduling) reads its work units from it. The
    SLURM tests are one group: one queue, one node."""

    def __init__(self):
        import tempfile

        self.folder = Path(tempfile.mkdtemp(prefix="deepinit-xdist-groups-"))

    def pytest_configure_node(self, node):  # controller: each worker gets the file's path
        node.workerinput["deepinit_xdist_groups"] = str(self.folder / "groups.json")

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadgroup":
            return None
        import json

        from xdist.scheduler import LoadGroupScheduling

        file = self.folder / "groups.json"

        class Scheduling(LoadGroupScheduling):
            groups: dict | None = None

            def _split_scope(self, nodeid: str) -> str:
                if self.groups is None:  # called once every worker has collected
                    self.groups = json.loads(file.read_text()) if file.is_file() else {}
                group = self.groups.get(nodeid)
                return f"group:{group}" if group is not None else super()._split_scope(nodeid)

        return Scheduling(config, log)

    def pytest_unconfigure(self, config):
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput") \
            and getattr(config.option, "numprocesses", None):
        config.pluginmanager.register(_XdistGroups(), "deepinit-xdist-groups")
