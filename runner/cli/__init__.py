"""The `deepinit` command: a thin dispatcher, one module per verb, no ML logic.

    deepinit train [overrides]      one run (Hydra); `deepinit [overrides]` is the same
    deepinit -m [overrides]         a sweep (Hydra multirun; launchers in conf/hydra/launcher)
    deepinit eval RUN_DIR ...       decode and score a finished run
    deepinit sample RUN_DIR ...     text from a language model run (task=lm)
    deepinit report SWEEP_DIR       tables and plots of a sweep
    deepinit sweep status SWEEP_DIR each cell's status (queued, running, ok, failed, ...)
    deepinit analyze WHAT ...       the papers' diagnostic figures
    deepinit data download NAME     fetch a corpus (multi30k, iwslt14, wmt14-en-de, tinyshakespeare)
    deepinit data prepare NAME ...  prepare a corpus (downloading it first without --raw)
    deepinit bench ...              throughput benchmark
    deepinit reproduce TARGET ...   a paper's table (what `make reproduce-TARGET` runs)

Verb modules are imported when their verb runs, so `deepinit eval` does not pay for Hydra and
`deepinit train` does not pay for matplotlib.
"""
from __future__ import annotations

import difflib
import importlib
import os
import select
import signal
import sys
import tempfile
import traceback

VERBS = {
    "train": "runner.cli.train",
    "eval": "runner.cli.eval",
    "report": "runner.cli.report",
    "sweep": "runner.cli.sweep",
    "analyze": "runner.cli.analyze",
    "data": "runner.cli.data",
    "bench": "runner.cli.bench",
    "reproduce": "runner.cli.reproduce",
    "sample": "runner.cli.sample",
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


# Words people type for a verb that is spelled otherwise here (or that is a verb's sub-command).
ALIASES = {"evaluate": ["eval"], "test": ["eval"], "score": ["eval"],
           "status": ["sweep status", "reproduce status"], "download": ["data download"],
           "prepare": ["data prepare"], "benchmark": ["bench"], "analyse": ["analyze"],
           "fit": ["train"], "run": ["train"], "help": ["--help"]}


def unknown_verb(word: str) -> str | None:
    """The error line for a first argument that is neither a verb nor an override (key=value,
    +key=value, ~key) nor a flag; None when it is one of those."""
    if word in VERBS or word.startswith(("-", "+", "~")) or "=" in word:
        return None
    near = ALIASES[word] if word in ALIASES else difflib.get_close_matches(word, list(VERBS), n=2)
    hint = f" (did you mean {' or '.join(f'`deepinit {n}`' for n in near)}?)" if near else ""
    return (f"deepinit: error: unknown command '{word}'{hint}; commands: {', '.join(VERBS)}; "
            "a run's settings are key=value overrides (deepinit --help)")


def _report_bug(exc: BaseException) -> int:
    """An error that is not the user's to fix: one line on stderr naming a file with the
    traceback (the run folder's error.txt when a run crashed; here, a temporary file), exit 1."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        fd, path = tempfile.mkstemp(prefix="deepinit-traceback-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(f"deepinit {' '.join(sys.argv[1:])}\n\n{text}")
        where = f"traceback in {path}"
    except OSError:  # nowhere to write it: the traceback it is, then
        sys.stderr.write(text)
        where = "traceback above"
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    sys.stderr.write(f"deepinit: internal error: {type(exc).__name__}: {first} ({where}; "
                     "please report it)\n")
    return 1


def main(argv: list[str] | None = None) -> None:
    _take_back_sigint()
    args = list(sys.argv[1:] if argv is None else argv)
    if args and (line := unknown_verb(args[0])):
        sys.stderr.write(line + "\n")
        raise SystemExit(2)
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
        # as a KeyboardInterrupt that carries its number (runner.run.attempt.Interrupted).
        sys.stderr.write("deepinit: interrupted\n")
        code = 128 + getattr(exc, "signum", signal.SIGINT)
    except Exception as exc:  # a bug (every user error is reported by its verb, exit 2)
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or os.environ.get("DEEPINIT_TRACEBACK") == "1":
            raise
        code = _report_bug(exc)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
