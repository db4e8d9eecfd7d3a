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


def main(argv: list[str] | None = None) -> None:
    _take_back_sigint()
    args = list(sys.argv[1:] if argv is None else argv)
    verb = args[0] if args and args[0] in VERBS else "train"
    if args and args[0] == verb:
        args = args[1:]
    raise SystemExit(importlib.import_module(VERBS[verb]).main(args))


if __name__ == "__main__":
    main()
