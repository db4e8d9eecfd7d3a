"""The `deepinit` command: a thin dispatcher, one module per verb, no ML logic.

    deepinit train [overrides]      one run (Hydra); `deepinit [overrides]` is the same
    deepinit -m [overrides]         a sweep (Hydra multirun; launchers in conf/hydra/launcher)
    deepinit eval RUN_DIR ...       decode and score a finished run
    deepinit report SWEEP_DIR       tables and plots of a sweep
    deepinit sweep status SWEEP_DIR each cell's status (queued, running, ok, failed, ...)
    deepinit analyze WHAT ...       the papers' diagnostic figures
    deepinit data download NAME     fetch a corpus (multi30k, iwslt14, wmt14-en-de)
    deepinit data prepare NAME ...  prepare a corpus (downloading it first without --raw)
    deepinit bench ...              throughput benchmark
    deepinit reproduce TARGET ...   a paper's table (what `make reproduce-TARGET` runs)

Verb modules are imported when their verb runs, so `deepinit eval` does not pay for Hydra and
`deepinit train` does not pay for matplotlib.
"""
from __future__ import annotations

import importlib
import os
import select
import signal
import sys

VERBS = {
    "train": "runner.cli.train",
    "eval": "runner.cli.eval",
    "report": "runner.cli.report",
    "sweep": "runner.cli.sweep",
    "analyze": "runner.cli.analyze",
    "data": "runner.cli.data",
    "bench": "runner.cli.bench",
    "reproduce": "runner.cli.reproduce",
}


def _take_back_sigint() -> None:
    """deepinit's stops arrive as SIGINT: Ctrl-C, and `kill PID`, which a sweep or suite forwards
    to its cells as SIGINT. A shell without job control (a script's `nohup deepinit ...
    &`) starts background commands with SIGINT ignored, which their children inherit, so such a
    run would not stop cleanly; take the signal back, as the stop it requests is always safe."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has exited (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll() here, or stdout is not a file
        return False


def main(argv: list[str] | None = None) -> None:
    _take_back_sigint()
    args = list(sys.argv[1:] if argv is None else argv)
    verb = args[0] if args and args[0] in VERBS else "train"
    if args and args[0] == verb:
        args = args[1:]
    try:
        code = importlib.import_module(VERBS[verb]).main(args)
        sys.stdout.flush()  # a reader that went away shows here, where it can still be handled
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        # `deepinit --help | head`: stop quietly with the status of a process killed by SIGPIPE,
        # as Unix tools do; stdout goes to /dev/null so that the exit's own flush cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 128 + signal.SIGPIPE
    except KeyboardInterrupt as exc:
        # Ctrl-C where no verb handles it (a running job and a sweep do: they mark what they
        # stop), e.g. while torch and Hydra import: one line, not a traceback. SIGTERM arrives
        # as a KeyboardInterrupt that carries its number (runner.sweep.cells.Interrupted).
        sys.stderr.write("deepinit: interrupted\n")
        code = 128 + getattr(exc, "signum", signal.SIGINT)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
