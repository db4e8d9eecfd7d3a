"""`python -m runner.run RUN_DIR`: train a run whose folder its caller prepared, in a process of
its own, without the CLI.

Composing conf/ is the CLI's (Hydra lives there: runner/cli/compose.py), so the caller composes
the run's config and writes it into the folder first (`runner.run.folder.write_config`:
.hydra/config.yaml, and .hydra/overrides.yaml naming the run). This process then does what
`deepinit train` does with a composed config: it logs as the Hydra app does (the console, and
RUN_DIR/train.log: conf/hydra/job_logging/deepinit.yaml), trains (`runner.run.train.train`:
resume, skip a finished run, the init scheme's warmup) and marks the folder as `deepinit train`
marks a single run (runner/run/attempt.py). Exit codes: 0 trained (or already finished), 1 a
crash (result.json failed, error.txt with the traceback), 2 a config or corpus the run rejects
(one line), 128+N stopped by signal N (interrupted.json; the same call resumes it).

The paper tables' suites run each cell this way (runner/tables/suite.py): one process per cell,
for isolation.
"""
from __future__ import annotations

import logging
import logging.config
import sys
import traceback
from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf

from runner.config import ConfigError, config_from_yaml
from runner.config.paths import config_dir
from runner.console import file_log
from runner.data.corpus import CorpusError
from runner.init import options_class
from runner.model.sublayer import norm_options_class
from runner.run import attempt
from runner.run.train import train

USAGE = "usage: python -m runner.run RUN_DIR (RUN_DIR/.hydra/config.yaml: the run's composed config)"


def log_to(run_dir: Path) -> None:
    """The Hydra app's logging (conf/hydra/job_logging/deepinit.yaml), its file in RUN_DIR/train.log."""
    spec = OmegaConf.load(config_dir() / "hydra" / "job_logging" / "deepinit.yaml")
    spec.handlers.file.filename = str(run_dir / "train.log")
    logging.config.dictConfig(OmegaConf.to_container(spec, resolve=True))


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.stderr.write(USAGE + "\n")
        return 2
    run_dir = Path(argv[0]).resolve()
    if not (run_dir / ".hydra" / "config.yaml").is_file():
        sys.stderr.write(f"deepinit: error: {run_dir / '.hydra' / 'config.yaml'}: no such file; {USAGE}\n")
        return 2
    with attempt.sigterm_raises():  # SIGTERM stops the run like Ctrl-C does
        log_to(run_dir)
        attempt.begin_attempt(run_dir)  # a rerun reads as running, not as its last failure
        resume = True
        try:
            cfg = config_from_yaml(run_dir / ".hydra" / "config.yaml", options_class, norm_options_class)
            resume = cfg.trainer.resume
            train(cfg, run_dir)
        except (ConfigError, CorpusError) as err:
            file_log.error("config error: %s", err)
            sys.stderr.write(f"deepinit: error: {err}\n")
            return 2
        except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM (attempt.Interrupted, loop.Stopped)
            signum = attempt.signal_of(exc)
            name = attempt.signal_name(signum)
            attempt.mark_interrupted(run_dir, name)
            sys.stderr.write(f"deepinit: interrupted ({name}); {attempt.resume_note(run_dir, resume)}\n")
            return 128 + signum
        except Exception as exc:  # a crash: recorded as failed
            trace = traceback.format_exc()
            file_log.error("run failed:\n%s", trace)
            attempt.record_failure(run_dir, f"{type(exc).__name__}: {exc}", trace)
            sys.stderr.write(f"deepinit: run failed: {type(exc).__name__}: {exc} "
                             f"(traceback in {run_dir / attempt.ERROR_FILE})\n")
            return 1
        return 0
