"""Experiment trackers: where a run's params, metrics and result go besides metrics.jsonl.

The `logger` config group (conf/logger/, lightning-hydra-template's names) picks them:
logger=tensorboard (the default), csv, mlflow, wandb, a list (logger=[csv,mlflow]) or
many_loggers (all four); ~logger turns them all off. Each is a small class with the same four
methods, and `MetricsLog` (runner/run/folder.py) fans every record out to them:

    log_params(params)    the flattened config ({"model.dim": 64, ...}), once, when a run starts
    log_metrics(record)   every metrics.jsonl record (train windows, validations, telemetry)
    log_result(result)    result.json's content, when the run ends
    close(status)         ok | diverged | failed | interrupted

mlflow and wandb are optional packages, imported only when chosen; `check_available` turns a
missing one into one line naming the package and its `pip install` before any data loads.
A tracker that cannot start, or fails while the run trains, is dropped with a warning
(here and in runner/run/folder.py): it never fails a run. A resumed run continues the same
MLflow / wandb run (their ids are kept in the run folder's loggers.json); MLflow keeps the
metrics a killed attempt logged after its last checkpoint, so those steps appear twice there
(metrics.jsonl, CSV and TensorBoard drop them).
"""
from __future__ import annotations

import csv
import importlib.util
import json
import logging
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Optional

from runner.config import Config, ConfigError
from runner.config.schema import TensorBoardLoggerConfig
from runner.console import log
from runner.files import atomic_open, atomic_write_text
from runner.run.folder import read_metrics, scalars, write_result
from runner.run.status import FAILED, INTERRUPTED

NAMES = ("tensorboard", "csv", "mlflow", "wandb")
STATE = "loggers.json"  # the run folder's record of tracker run ids (resume continues them)
# logger name -> (module to import, what to install)
PACKAGES = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "mlflow": ("mlflow", "pip install 'deepinit[mlflow]' (or pip install mlflow)"),
    "wandb": ("wandb", "pip install 'deepinit[wandb]' (or pip install wandb)"),
}


# ----------------------------------------------------------------------------- choosing
def selected(cfg: Config) -> dict[str, Any]:
    """The chosen loggers' configs by name, with the old trainer.tensorboard switch applied
    (false: no TensorBoard; true: TensorBoard too)."""
    chosen = {name: getattr(cfg.logger, name) for name in NAMES
              if getattr(cfg.logger, name).enabled}
    alias = cfg.trainer.tensorboard
    if alias is False:
        chosen.pop("tensorboard", None)
    elif alias is True and "tensorboard" not in chosen:
        chosen["tensorboard"] = TensorBoardLoggerConfig(enabled=True)
    return {name: chosen[name] for name in NAMES if name in chosen}


def check_available(cfg: Config) -> None:
    """ConfigError, one line, when a chosen logger's package is not installed (nothing is
    imported here)."""
    for name in selected(cfg):
        if name in PACKAGES:
            module, install = PACKAGES[name]
            if importlib.util.find_spec(module) is None:
                raise ConfigError(f"logger={name} needs the {module} package, which is not "
                                  f"installed: {install}; or choose another logger (~logger for none)")


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys ({"model": {"dim": 64}} -> {"model.dim": 64})."""
    if not isinstance(obj, dict):
        return {prefix: obj} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def config_params(cfg: Config) -> dict[str, Any]:
    """The params every logger records: the flattened config."""
    return flatten(asdict(cfg))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def make_loggers(cfg: Config, run_dir: Path, resumed_at: Optional[int],
                 only: Optional[list[str]] = None) -> list:
    """The chosen loggers, opened for this run (resumed_at: the update a resumed run restarts
    from, None for a fresh run); `only`: those of them with these names, added beside the ones
    that recorded the run already (their state in loggers.json is kept)."""
    check_available(cfg)
    run_dir = Path(run_dir)
    state = read_state(run_dir) if resumed_at is not None else {}
    kept = read_state(run_dir) if only is not None else {}
    made = []
    for name, options in selected(cfg).items():
        if only is not None and name not in only:
            continue
        cls = {"tensorboard": TensorBoardLogger, "csv": CsvLogger, "mlflow": MlflowLogger,
               "wandb": WandbLogger}[name]
        try:
            made.append(cls(options, run_dir, resumed_at, state.get(name)))
        except Exception as exc:  # a store or server that cannot be reached: not the run's failure
            log.warning("logger %s could not start (%s: %s); the run goes on without it",
                        name, type(exc).__name__, exc)
    if any(logger.state() for logger in made):
        write_state(run_dir, {**kept, **{logger.name: logger.state() for logger in made if logger.state()}})
    return made


def recorded(run_dir: Path, result: dict) -> list[str]:
    """The loggers that recorded a finished run: result.json's list, or for a run finished before
    result.json kept one, those whose files are in the run folder (TensorBoard's events, csv/)
    or whose run ids are in loggers.json (MLflow, wandb)."""
    if result.get("loggers") is not None:
        return list(result["loggers"])
    run_dir = Path(run_dir)
    found = list(read_state(run_dir))
    if any(run_dir.glob("events.out.tfevents.*")):
        found.append("tensorboard")
    if (run_dir / "csv").is_dir():
        found.append("csv")
    return [name for name in NAMES if name in found]


def record_finished(cfg: Config, run_dir: Path, result: dict) -> list[str]:
    """A finished run is not trained again. Loggers chosen now that did not record it get what it
    logged: its config, every metrics.jsonl record and its result (a tracker that fails is left
    out with a warning, as during training). Returns the lines that say so."""
    new = [name for name in selected(cfg) if name not in recorded(run_dir, result)]
    if not new:
        return []
    try:
        made = make_loggers(cfg, run_dir, None, only=new)
    except ConfigError as err:  # its package is missing: say so, the run stays as it was
        return [f"logger={','.join(new)} did not record this finished run: {err}"]
    records = read_metrics(run_dir)
    done = []
    for logger in made:
        try:
            logger.log_params(config_params(cfg))
            for record in records:
                logger.log_metrics(record)
            logger.log_result(result)
            logger.close(result.get("status", "ok"))
            done.append(logger.name)
        except Exception as exc:  # a tracker's failure is not the run's
            log.warning("logger %s failed while recording the finished run (%s: %s)",
                        logger.name, type(exc).__name__, exc)
    if not done:
        return []
    write_result(run_dir, {**result, "loggers": [*recorded(run_dir, result), *done]})
    return [f"this run had finished before: it is not trained again; its {len(records)} metrics "
            f"records, config and result were written to {', '.join(done)} now"]


def read_state(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / STATE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def write_state(run_dir: Path, state: dict) -> None:
    path = Path(run_dir) / STATE
    atomic_write_text(path, json.dumps(state, indent=2) + "\n")


class Logger:
    """The interface (every method optional)."""

    name = "logger"

    def state(self) -> Optional[dict]:
        """What a resumed run needs to continue this tracker's run (kept in loggers.json)."""
        return None

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, record: dict) -> None: ...

    def log_result(self, result: dict) -> None: ...

    def close(self, status: str) -> None: ...


# ----------------------------------------------------------------------------- TensorBoard
class TensorBoardLogger(Logger):
    """Scalars "split/key" per record (runner.run.records.scalars), the config as text, the
    result's numbers as "result/key" at the last update. A resumed run purges the events after
    its checkpoint, so its files equal an uninterrupted run's."""

    name = "tensorboard"

    def __init__(self, options, run_dir: Path, resumed_at: Optional[int], state: Optional[dict]):
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 (+0.4 s at import; only with logger=tensorboard)

        self.writer = SummaryWriter(log_dir=str(options.save_dir or run_dir),
                                    purge_step=None if resumed_at is None else resumed_at + 1)
        self.step = resumed_at or 0
        self.resumed = resumed_at is not None

    def log_params(self, params: dict[str, Any]) -> None:
        if self.resumed:  # the first attempt wrote it
            return
        lines = "\n".join(f"    {key}: {_text(value)}" for key, value in params.items())
        self.writer.add_text("config", lines, 0)
        self.writer.flush()

    def log_metrics(self, record: dict) -> None:
        for tag, value in scalars(record):
            self.writer.add_scalar(tag, value, record["step"])
        self.step = record["step"]
        self.writer.flush()

    def log_result(self, result: dict) -> None:
        step = result.get("updates") or self.step
        for key, value in flatten(result).items():
            if _is_number(value):
                self.writer.add_scalar(f"result/{key}", value, step)
        self.writer.add_text("result", "    " + json.dumps(result, default=str), step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


# ----------------------------------------------------------------------------- CSV
class CsvLogger(Logger):
    """<save_dir>/<split>.csv: one row per record, columns step, epoch and the record's scalars
    (a column that appears later rewrites the file with the wider header); params.csv and
    result.csv: key,value rows. A resumed run drops the rows after its checkpoint."""

    name = "csv"

    def __init__(self, options, run_dir: Path, resumed_at: Optional[int], state: Optional[dict]):
        self.dir = Path(options.save_dir) if options.save_dir else Path(run_dir) / "csv"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.columns: dict[str, list[str]] = {}
        for path in self.dir.glob("*.csv"):
            if path.stem in ("params", "result"):
                continue
            header, rows = self._read(path)
            if resumed_at is not None:
                rows = [r for r in rows if r.get("step") and int(r["step"]) <= resumed_at]
            else:
                rows = []
            self._rewrite(path, header, rows)
            self.columns[path.stem] = header

    @staticmethod
    def _read(path: Path) -> tuple[list[str], list[dict]]:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            return list(reader.fieldnames or []), rows

    @staticmethod
    def _rewrite(path: Path, header: list[str], rows: list[dict]) -> None:
        with atomic_open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header, restval="")
            writer.writeheader()
            writer.writerows(rows)

    def log_metrics(self, record: dict) -> None:
        split = record["split"]
        prefix = f"{split}/"
        row = {"step": record["step"], "epoch": record.get("epoch", "")}
        row.update({tag[len(prefix):]: value for tag, value in scalars(record)})
        path = self.dir / f"{split}.csv"
        header = self.columns.get(split)
        if header is None or not path.exists():
            header = list(row)
            self._rewrite(path, header, [])
        elif any(key not in header for key in row):
            header = header + [key for key in row if key not in header]
            self._rewrite(path, header, self._read(path)[1])
        self.columns[split] = header
        with open(path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=header, restval="").writerow(row)

    def _key_values(self, name: str, values: dict[str, Any]) -> None:
        path = self.dir / f"{name}.csv"
        with atomic_open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["key", "value"])
            writer.writerows((key, "" if value is None else value) for key, value in values.items())

    def log_params(self, params: dict[str, Any]) -> None:
        self._key_values("params", {k: _text(v) if isinstance(v, (list, dict)) else v
                                    for k, v in params.items()})

    def log_result(self, result: dict) -> None:
        self._key_values("result", {k: _text(v) if isinstance(v, (list, dict)) else v
                                    for k, v in flatten(result).items()})


# ----------------------------------------------------------------------------- MLflow
def default_tracking_uri() -> str:
    """sqlite:///<working directory>/outputs/mlflow.db: one store for every run and sweep started
    from this directory (the run folders are under outputs/ too)."""
    path = Path.cwd().resolve() / "outputs" / "mlflow.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Several cells of a local sweep opening a new SQLite store at once would race to create
    its tables: serialize the opening with a lock file beside the database."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    try:
        import fcntl  # noqa: PLC0415 (POSIX only; elsewhere the opening is not serialized)
    except ImportError:
        yield
        return
    lock = Path(uri[len("sqlite:///"):] + ".lock")
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class MlflowLogger(Logger):
    """One MLflow run per deepinit run in experiment `experiment_name`, named after the run
    folder, tagged with the run folder's path (deepinit.run_dir) and the folder holding it
    (deepinit.folder: a sweep's folder for its cells). Params: the flattened config; metrics:
    "split/key" at each record's step; the result: numbers as "result/key" metrics, the rest
    as "result.key" tags, and the run's status (FINISHED for ok and diverged, FAILED)."""

    name = "mlflow"

    def __init__(self, options, run_dir: Path, resumed_at: Optional[int], state: Optional[dict]):
        from mlflow.entities import Metric, Param, RunTag  # noqa: PLC0415 (optional package, ~1 s at import; only with logger=mlflow)
        from mlflow.tracking import MlflowClient  # noqa: PLC0415 (as above)

        for noisy in ("mlflow", "alembic"):  # their INFO lines about creating the store
            logging.getLogger(noisy).setLevel(logging.WARNING)
        self.Metric, self.Param, self.RunTag = Metric, Param, RunTag
        self.uri = options.tracking_uri or default_tracking_uri()
        run_dir = Path(run_dir).resolve()
        with _store_lock(self.uri):
            self.client = MlflowClient(tracking_uri=self.uri)
            self.run_id = None
            if state and state.get("run_id") and state.get("tracking_uri") == self.uri:
                self.run_id = state["run_id"]  # a resumed run continues its MLflow run
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                experiment = self.client.get_experiment_by_name(options.experiment_name)
                experiment_id = (experiment.experiment_id if experiment is not None
                                 else self.client.create_experiment(options.experiment_name))
                tags = {"deepinit.run_dir": str(run_dir), "deepinit.folder": run_dir.parent.name,
                        **{str(k): str(v) for k, v in (options.tags or {}).items()}}
                run = self.client.create_run(experiment_id, run_name=options.run_name or run_dir.name,
                                             tags=tags)
                self.run_id = run.info.run_id
        self.resumed = resumed_at is not None and state is not None

    def state(self) -> Optional[dict]:
        return {"run_id": self.run_id, "tracking_uri": self.uri}

    def log_params(self, params: dict[str, Any]) -> None:
        if self.resumed:  # logged by the first attempt; MLflow refuses to change a param
            return
        items = [self.Param(key, _text(value)[:6000]) for key, value in params.items()]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[start:start + 100])

    def log_metrics(self, record: dict) -> None:
        now = int(time.time() * 1000)
        metrics = [self.Metric(tag, float(value), now, record["step"])
                   for tag, value in scalars(record)]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def log_result(self, result: dict) -> None:
        now, step = int(time.time() * 1000), int(result.get("updates") or 0)
        metrics, tags = [], []
        for key, value in flatten(result).items():
            if _is_number(value):
                metrics.append(self.Metric(f"result/{key}", float(value), now, step))
            else:
                tags.append(self.RunTag(f"result.{key}", _text(value)[:5000]))
        for start in range(0, max(len(metrics), len(tags)), 100):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 100],
                                  tags=tags[start:start + 100])

    def close(self, status: str) -> None:
        self.client.set_terminated(
            self.run_id, {FAILED: "FAILED", INTERRUPTED: "KILLED"}.get(status, "FINISHED"))


# ----------------------------------------------------------------------------- wandb
class WandbLogger(Logger):
    """A Weights & Biases run (offline by default: <save_dir>/wandb/offline-run-*, upload with
    `wandb sync`), named after the run folder; config = the flattened config; one wandb step
    per record step; the result in the run summary as "result/key"."""

    name = "wandb"

    def __init__(self, options, run_dir: Path, resumed_at: Optional[int], state: Optional[dict]):
        import wandb  # noqa: PLC0415 (optional package; only with logger=wandb)

        run_dir = Path(run_dir)
        run_id = (state or {}).get("id") or wandb.util.generate_id()
        save_dir = Path(options.save_dir) if options.save_dir else run_dir
        save_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=options.project, entity=options.entity,
                              name=options.name or run_dir.name, dir=str(save_dir),
                              mode=options.mode, tags=list(options.tags) or None, id=run_id,
                              resume="allow")
        self.id = run_id

    def state(self) -> Optional[dict]:
        return {"id": self.id}

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, record: dict) -> None:
        self.run.log(dict(scalars(record)), step=record["step"])

    def log_result(self, result: dict) -> None:
        self.run.summary.update({f"result/{k}": v for k, v in flatten(result).items()
                                 if _is_number(v) or isinstance(v, (str, bool))})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=1 if status in (FAILED, INTERRUPTED) else 0)
