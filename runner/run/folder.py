"""The run folder: everything a run reads and writes on disk, in one place.

    .hydra/            the composed config (written by Hydra)
    train.log          the log (Hydra's file handler)
    init.json          the init scheme's report
    env.json           versions, device, precision, git commit, data sizes (`environment`)
    metrics.jsonl      one JSON record per log window and per validation (`MetricsLog`)
    checkpoint_*.pt    atomic, self-describing checkpoints (`save_checkpoint`, `load_checkpoint`)
    result.json        written last: a run whose result says ok or diverged is finished
                       (runner/run/status.py: the statuses and what they mean)

Every JSON file is written atomically (a temporary file, then a rename), so a killed run never
leaves a torn file. Checkpoints are loaded with weights_only=True: opening a checkpoint someone
sent you cannot run their code.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import signal
import socket
import subprocess
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
from omegaconf import OmegaConf

from runner import __version__
from runner.console import log
from runner.files import atomic_open, atomic_path, atomic_write_text, remove_stale
from runner.run.status import is_finished_result

LAST = "checkpoint_last.pt"
NUMBERED = re.compile(r"checkpoint_(\d+)\.pt$")


def _stop_signals() -> tuple[int, ...]:
    """SIGINT, SIGTERM and the signal submitit sends a job at its time limit or preemption
    (SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL names another, as submitit reads it)."""
    preempt = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
    return (signal.SIGINT, signal.SIGTERM, *([int(preempt)] if preempt is not None else []))


def _raise_each(signums: Sequence[int]) -> None:
    # Every held signal gets its handler, even when an earlier one's raises.
    if signums:
        try:
            signal.raise_signal(signums[0])
        finally:
            _raise_each(signums[1:])


@contextlib.contextmanager
def signals_held(signums: Optional[Sequence[int]] = None) -> Iterator[None]:
    """Stop signals (`_stop_signals`) that arrive inside the block are held and raised again, in
    order of arrival, when it ends.

    An interrupt inside torch.save would otherwise surface as torch's own error from the
    half-written zip ("unexpected pos ..."), so that a stopped run read as a crash instead of as
    interrupted. Held this way, the checkpoint is written whole, then the signal's handler runs
    (KeyboardInterrupt, the launcher's Interrupted, submitit's requeue, or the default action).
    Python runs signal handlers in the main thread only, so a save in another thread is never
    interrupted by them and holds nothing. A handler installed outside Python (getsignal() is
    None) or an ignored signal is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    replaced: dict[int, Any] = {}
    for signum in dict.fromkeys(_stop_signals() if signums is None else signums):
        previous = signal.getsignal(signum)
        if previous is None or previous == signal.SIG_IGN:
            continue
        replaced[signum] = previous
        signal.signal(signum, lambda received, frame: held.append(received))
    try:
        yield
    finally:
        for signum, previous in replaced.items():
            signal.signal(signum, previous)
        _raise_each(list(dict.fromkeys(held)))


def wait_interruptibly(proc: subprocess.Popen, poll_s: float = 0.5) -> tuple[Any, Any]:
    """proc.communicate(), in slices of poll_s seconds. A signal sent to this process can be
    delivered to any of its threads (torch's, a load probe's); Python then runs the handler in
    the main thread only once that thread runs Python code again, so a main thread blocked in
    one long wait would not see a Ctrl-C or a time limit's SIGINT until the child ended."""
    while True:
        try:
            return proc.communicate(timeout=poll_s)
        except subprocess.TimeoutExpired:
            continue


def save_checkpoint_file(obj: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, then rename: a kill at any moment
    leaves either the old checkpoint or the new one, never a torn file; SIGINT/SIGTERM meanwhile
    are held until the file is in place (`signals_held`)."""
    with signals_held():
        _save_checkpoint_file(obj, Path(path))


def _save_checkpoint_file(obj: dict[str, Any], path: Path) -> None:
    remove_stale(path)  # left by an attempt killed mid-write (one process writes a run's checkpoints)
    with atomic_open(path, "wb", fsync=True) as f:
        torch.save(obj, f)


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=map_location, weights_only=True)


def checkpoint_step(path: Path) -> Optional[int]:
    """The update a checkpoint was saved at (a resume continues after it), read without loading
    its tensors; None when there is no readable checkpoint there."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"])
    except Exception:  # missing, torn, not a checkpoint
        return None


def numbered_checkpoints(run_dir: Path) -> list[Path]:
    """checkpoint_<step>.pt files, oldest first."""
    found = [(int(m.group(1)), p) for p in Path(run_dir).glob("checkpoint_*.pt")
             if (m := NUMBERED.search(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(run_dir: Path, state: dict[str, Any], step: int, keep: int) -> None:
    """checkpoint_last.pt always; with keep > 0 also checkpoint_<step>.pt (for averaging), as a
    hard link to the same bytes, pruning all but the newest `keep`. An interrupt meanwhile is
    held until the files are in place (`signals_held`)."""
    with signals_held():
        _save_checkpoint(Path(run_dir), state, step, keep)


def _save_checkpoint(run_dir: Path, state: dict[str, Any], step: int, keep: int) -> None:
    last = run_dir / LAST
    save_checkpoint_file(state, last)
    if keep > 0:
        numbered = run_dir / f"checkpoint_{step}.pt"
        with atomic_path(numbered) as tmp:
            os.link(last, tmp)
        for old in numbered_checkpoints(run_dir)[:-keep]:
            old.unlink(missing_ok=True)


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """fairseq's scripts/average_checkpoints.py: the mean of every floating-point tensor of the
    models' state_dicts (accumulated in float64, returned in the tensor's own dtype); other
    tensors (integer buffers) are taken from the last checkpoint."""
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    sums: dict[str, torch.Tensor] = {}
    last: dict[str, torch.Tensor] = {}
    for i, path in enumerate(paths):
        state = load_checkpoint(path, map_location="cpu")
        model = state["model"] if "model" in state else state
        if i == 0:
            keys = list(model)
        elif set(model) != set(keys):
            raise ValueError(f"{path}: its parameters differ from {paths[0]}'s")
        for key, value in model.items():
            if value.is_floating_point():
                if i == 0:
                    sums[key] = value.detach().to(torch.float64).clone()
                else:
                    if value.shape != sums[key].shape:
                        raise ValueError(f"{path}: {key} has shape {tuple(value.shape)}, "
                                         f"{paths[0]} has {tuple(sums[key].shape)}")
                    sums[key] += value.detach().to(torch.float64)
        last = model
    return {key: (sums[key] / len(paths)).to(value.dtype) if key in sums else value.clone()
            for key, value in last.items()}


# Overrides that do not change a run's result stay out of folder names.
_NAME_EXCLUDED = ("hydra.", "hydra/", "trainer.progress=", "trainer.device=", "trainer.threads=",
                  "trainer.resume=", "trainer.tensorboard=", "logger=", "logger.", "logger/",
                  "trainer.compile=", "trainer.compile_scope=")
# A sweep cell's folder lies in the sweep's folder, which the preset (+sweep=NAME) names already.
_CELL_EXCLUDED = ("sweep=",)
NAME_LIMIT = 250  # characters (ASCII, after the replacements below); a file name may have 255 bytes
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=+\-@:\[\]]")


def folder_name(overrides: Sequence[str], default: str, cell: bool = False) -> str:
    """The folder of a run, a sweep or a sweep cell (cell=True), named by its overrides and never
    by a timestamp, so that the same command finds the same folder again (resume, skip finished
    cells). One flat name: `key=value` items, sorted and joined by commas, with every character
    other than letters, digits and `_.,=+-@:[]` (a `/` in a path, say) replaced by `_`. An item is
    never cut: when they do not all fit in NAME_LIMIT characters, the longest are left out until
    the rest fit, and the name ends with `+N_more-HASH`, HASH a digest of the whole list (.hydra/overrides.yaml in
    the run folder holds every override)."""
    excluded = _NAME_EXCLUDED + (_CELL_EXCLUDED if cell else ())
    kept = sorted(str(o) for o in overrides if not str(o).lstrip("+~").startswith(excluded))
    items = [_UNSAFE.sub("_", o.lstrip("+")) for o in kept]
    name = ",".join(items) or default
    if len(name) <= NAME_LIMIT:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    widest_tail = f"+{len(items)}_more-{digest}"
    left_out: set[int] = set()
    for i in sorted(range(len(items)), key=lambda i: -len(items[i])):  # the longest go first
        if len(",".join([*(x for j, x in enumerate(items) if j not in left_out), widest_tail])) <= NAME_LIMIT:
            break
        left_out.add(i)
    shown = [x for j, x in enumerate(items) if j not in left_out]
    return ",".join([*shown, f"+{len(left_out)}_more-{digest}"])


# ----------------------------------------------------------------------------- JSON files
def _jsonable(obj):
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return obj.tolist()
    return str(obj)


def write_json(path: Path, obj: Any, indent: int = 2) -> None:
    """Atomic: a temporary file in the same folder, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(obj, indent=indent, default=_jsonable) + "\n")


def read_json(path: Path) -> Optional[Any]:
    """The parsed file, or None when it is missing or torn."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_config(run_dir: Path, cfg: Any, overrides: Optional[Sequence[str]] = None) -> None:
    """.hydra/config.yaml: the run's typed Config, as Hydra writes the composed one; with
    `overrides`, also .hydra/overrides.yaml (the overrides that name the run, as Hydra records a
    run's task overrides), for a run folder prepared without Hydra (`python -m runner.run`)."""
    hydra_dir = Path(run_dir) / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(hydra_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    if overrides is not None:
        listed = OmegaConf.to_yaml(OmegaConf.create([str(o) for o in overrides]))
        atomic_write_text(hydra_dir / "overrides.yaml", listed)


def read_result(run_dir: Path) -> Optional[dict]:
    return read_json(Path(run_dir) / "result.json")


def write_result(run_dir: Path, result: dict) -> None:
    write_json(Path(run_dir) / "result.json", result)


def is_finished(run_dir: Path) -> Optional[dict]:
    """The result of a finished run (runner/run/status.py `is_finished_result`), else None."""
    result = read_result(run_dir)
    return result if is_finished_result(result) else None


# ----------------------------------------------------------------------------- metrics
def scalars(record: dict) -> Iterator[tuple[str, float]]:
    """A record's TensorBoard scalars: "split/key" for numbers; for lists (telemetry's per-layer
    values, aligned with record["sublayers"] when it has them) "split/key/name" per item and
    "split/key/name/hJ" per item of a nested list (per head); None items are skipped."""
    split, names = record["split"], record.get("sublayers")
    for key, value in record.items():
        if key in ("split", "step", "epoch", "sublayers"):
            continue
        if isinstance(value, (int, float)):
            yield f"{split}/{key}", value
        elif isinstance(value, list):
            for i, item in enumerate(value):
                label = names[i] if names is not None and len(names) == len(value) else str(i)
                if isinstance(item, (int, float)):
                    yield f"{split}/{key}/{label}", item
                elif isinstance(item, list):
                    for j, sub in enumerate(item):
                        yield f"{split}/{key}/{label}/h{j}", sub


class MetricsLog:
    """metrics.jsonl (one JSON record per line, flushed), fanned out to the run's experiment
    trackers (runner/run/loggers.py: TensorBoard, CSV, MLflow, wandb).

    On resume, the lines a killed attempt logged after its last checkpoint are dropped first (and
    TensorBoard and CSV drop theirs), so a resumed run's files equal an uninterrupted one's. A
    tracker that raises is dropped with one warning: it never fails the run."""

    def __init__(self, run_dir: Path, resumed_at: Optional[int] = None, loggers: Sequence = ()):
        path = Path(run_dir) / "metrics.jsonl"
        if resumed_at is not None:
            truncate_metrics(path, resumed_at)
        self.file = open(path, "a")
        self.loggers = list(loggers)

    def _each(self, method: str, *args) -> None:
        for logger in list(self.loggers):
            try:
                getattr(logger, method)(*args)
            except Exception as exc:  # a tracker's failure (a server gone, a full disk) is not the run's
                log.warning("logger %s failed in %s (%s: %s); the run goes on without it",
                            logger.name, method, type(exc).__name__, exc)
                self.loggers.remove(logger)
                if method != "close":
                    try:
                        logger.close("failed")
                    except Exception:
                        pass

    def log_params(self, params: dict) -> None:
        """The flattened config, once when the run starts (trackers only: .hydra/ has it)."""
        self._each("log_params", params)

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        self._each("log_metrics", record)

    def log_result(self, result: dict) -> None:
        """result.json's content, when the run ends (trackers only)."""
        self._each("log_result", result)

    def close(self, status: str = "ok") -> None:
        if not self.file.closed:
            self.file.close()
        self._each("close", status)
        self.loggers = []


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records; a line being written while it is read is skipped."""
    try:
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the records of updates up to `step` (atomic rewrite)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if line.strip() and json.loads(line)["step"] <= step]
    atomic_write_text(path, "".join(kept))


# ----------------------------------------------------------------------------- environment
def git_commit() -> Optional[str]:
    # A copy of the checkout can carry an older .git than the code it holds (a GPU machine's copy
    # does): DEEPINIT_GIT_COMMIT, set by whoever made the copy, names the commit that runs.
    if os.environ.get("DEEPINIT_GIT_COMMIT"):
        return os.environ["DEEPINIT_GIT_COMMIT"]
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _version(package: str) -> Optional[str]:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def cpu_name() -> Optional[str]:
    """The CPU's model name (Linux /proc/cpuinfo), None elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def environment(device: torch.device, precision: str) -> dict[str, Any]:
    """What env.json records about where and with what a run ran."""
    return {
        "deepinit": __version__, "python": platform.python_version(),
        "torch": torch.__version__, "hydra": _version("hydra-core"),
        "omegaconf": _version("omegaconf"),
        "cuda": torch.version.cuda, "device": str(device), "precision": precision,
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else cpu_name() or platform.processor() or platform.machine()),
        "threads": torch.get_num_threads(), "hostname": socket.gethostname(),
        "git_commit": git_commit(), "platform": platform.platform(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
