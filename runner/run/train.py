"""train(cfg, run_dir) -> result: one training run in its folder, as a plain function tests call.

Builds the run (runner/run/build.py), resumes it from checkpoint_last.pt when there is one, hands
the train loop its callbacks (metrics and TensorBoard, checkpoints, validation BLEU), and writes
result.json last. A run whose result.json says ok or diverged is finished and skipped.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Iterator, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from runner.config import Config, ConfigError, config_from_dict, is_resolved
from runner.console import Overview, console, file_log, log, overview_text, print_summary, progress_lines
from runner.data.corpus import CorpusError
from runner.data.lm import bits_key
from runner.init import options_class
from runner.model.sublayer import norm_options_class
from runner.run import folder, loggers
from runner.run.allocator import host_allocator
from runner.run.build import RunParts, build_run, check_config, resolve_device
from runner.run.evaluate import check_dictionaries, final_scores, split_bleu
from runner.run.sample import check_saved_vocab, save_vocab
from runner.run.status import OK, run_status
from runner.run.telemetry import Telemetry
from runner.train.lm_loop import LMTrainer
from runner.train.loop import Callback, Outcome, Stopped, Trainer


# ----------------------------------------------------------------------------- callbacks
class MetricsCallback(Callback):
    """metrics.jsonl and TensorBoard (main rank only)."""

    def __init__(self, metrics: folder.MetricsLog):
        self.metrics = metrics

    def on_record(self, trainer: Trainer, record: dict) -> None:
        self.metrics.write(record)


class CheckpointCallback(Callback):
    """checkpoint_last.pt (+ numbered ones to keep) at every save, checkpoint_best.pt at every
    new best validation (main rank only)."""

    def __init__(self, run_dir: Path, keep: int):
        self.run_dir, self.keep = run_dir, keep

    def on_checkpoint(self, trainer: Trainer) -> None:
        # an extra save (time-based, or on a stop) rewrites checkpoint_last.pt alone: the numbered
        # checkpoints that are averaged stay those of the scheduled saves
        keep = self.keep if trainer.checkpoint_numbered else 0
        folder.save_checkpoint(self.run_dir, trainer.state_dict(), trainer.state.step, keep)
        if not trainer.checkpoint_numbered:
            file_log.info("saved %s at update %d", folder.LAST, trainer.state.step)

    def on_best(self, trainer: Trainer) -> None:
        folder.save_checkpoint_file(trainer.state_dict(), self.run_dir / "checkpoint_best.pt")


class ValidBleu:
    """The trainer's valid_bleu scorer: tokenized BLEU of the valid split at every validation
    (trainer.valid_bleu, or best_checkpoint_metric=bleu), the Validation's `bleu`. Every rank
    decodes the whole split: the same score, no communication."""

    def __init__(self, parts: RunParts):
        self.parts = parts

    def __call__(self, trainer: Trainer) -> float:
        p, cfg = self.parts, self.parts.cfg
        bleu = split_bleu(
            p.model, p.valid_split, p.data.references[cfg.data.valid_split], p.data.tgt_dict,
            p.data.bpe_symbol, cfg.trainer, cfg.data.max_tokens, p.device)
        p.model.train()
        return bleu


# ----------------------------------------------------------------------------- stopping
REPEAT_S = 2.0  # a second stop signal later than this after the first stops at once


@contextlib.contextmanager
def stop_after_the_update(trainer: Trainer) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM while the trainer runs ask it to stop: it finishes the update
    under way (and the validation that follows it, if one is due), saves checkpoint_last.pt and
    raises Stopped. The same signal again within REPEAT_S seconds is the same request (a terminal's
    Ctrl-C and a sweep launcher's SIGINT arrive together); later, it stops at once, without
    saving (the run then resumes from its last checkpoint). Only in the main thread; a signal
    that is ignored, handled outside Python, or handled by submitit (a SLURM job's SIGTERM,
    which submitit's requeueing relies on) is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[float] = []

    def handler(signum, frame):
        if trainer.stop_signal is None:
            trainer.stop_signal = signum
            first.append(time.monotonic())
            # os.write: no lock that the interrupted code could hold
            os.write(2, (f"deepinit: {signal.Signals(signum).name}: stopping after the update "
                         f"under way, once it is saved (the same again after {REPEAT_S:.0f} s: "
                         "stop at once, without saving)\n").encode())
        elif time.monotonic() - first[0] > REPEAT_S:
            raise Stopped(signum, None)

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler_before = signal.getsignal(signum)
        if (handler_before is not None and handler_before != signal.SIG_IGN
                and not str(getattr(handler_before, "__module__", "")).startswith("submitit")):
            previous[signum] = handler_before
            signal.signal(signum, handler)
    try:
        yield
        if trainer.stop_signal is not None:  # it came after the last update: all is saved
            raise Stopped(trainer.stop_signal, trainer.state.step)
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)


# ----------------------------------------------------------------------------- the run
def overview(parts: RunParts, run_dir: Path, env: dict, trackers: list,
             resumed_at: Optional[int]) -> list[tuple[str, str]]:
    """The start summary's rows: model size, data sizes, device and precision, where it logs,
    the run folder (the full config is in .hydra/config.yaml and train.log)."""
    cfg, d = parts.cfg, parts.data
    m = cfg.model
    stats = parts.data_stats
    if cfg.task == "lm":
        return lm_overview(parts, run_dir, env, trackers, resumed_at)
    test = d.splits.get(cfg.data.test_split)
    pairs = (f"{stats['train_pairs']:,} train / {stats['valid_pairs']:,} valid"
             + (f" / {len(test):,} test" if test is not None else "") + " pairs")
    if stats.get("train_filtered"):
        pairs += f" ({stats['train_filtered']:,} too long left out)"
    vocab = (f"vocab {len(d.src_dict):,} joined" if d.src_dict is d.tgt_dict
             else f"vocab {len(d.src_dict):,} src / {len(d.tgt_dict):,} tgt")
    device = device_line(parts, env)
    updates = f"{cfg.trainer.max_updates:,} updates"
    if resumed_at is not None:
        updates += f", resuming at {resumed_at:,}"
    return [
        ("model", f"{parts.parameters:,} parameters: {m.num_encoder_layers}+{m.num_decoder_layers} "
                  f"layers, dim {m.dim}, {m.heads} heads; norm={cfg.norm.placement} "
                  f"init={cfg.init.name} optim={cfg.optim.name} lr={cfg.optim.lr:g}"),
        ("data", f"{cfg.data.name}: {pairs}; {vocab}"),
        ("device", device),
        ("training", f"{updates}, {stats.get('batches_per_epoch', '?'):,} batches per epoch"),
        ("logging", ", ".join(["metrics.jsonl", *(t.name for t in trackers)])
                    + " (full config: train.log, .hydra/config.yaml)"),
        ("run folder", str(run_dir)),
    ]


def log_config(cfg: Config) -> None:
    """The full config: into train.log, and on the console only at DEBUG
    (hydra.verbose=deepinit)."""
    text = OmegaConf.to_yaml(OmegaConf.structured(cfg)).rstrip()
    if log.isEnabledFor(logging.DEBUG):
        log.debug("config:\n%s", text)
    else:
        file_log.info("config:\n%s", text)


def result_record(parts: RunParts, trainer: Trainer, outcome: Outcome, resumed: bool) -> dict:
    """result.json: the outcome, losses, throughput and where it ran."""
    s, t = trainer.state, parts.cfg.trainer
    valid = s.last_valid or {}
    stall_line = parts.valid_unigram_nll - t.divergence.stall_margin
    stalled = (outcome.status == OK and s.best_valid_nll is not None
               and s.best_valid_nll > stall_line)
    if stalled:
        log.warning("stalled: best valid NLL %.3f is not below the unigram NLL %.3f minus %.2f",
                    s.best_valid_nll, parts.valid_unigram_nll, t.divergence.stall_margin)
    return {
        "status": outcome.status, "reason": outcome.reason, "diverged_step": outcome.diverged_step,
        "updates": s.step, "epochs": s.pos.epoch,
        "train_loss": s.last_train_loss, "valid_loss": valid.get("loss"),
        "valid_nll_loss": valid.get("nll_loss"), "valid_ppl": valid.get("ppl"),
        "best_valid_loss": s.best_valid_loss, "best_valid_nll": s.best_valid_nll,
        "valid_unigram_nll": parts.valid_unigram_nll, "stalled": stalled,
        # update 1's loss under the initial weights, and the first train record's
        "initial_loss": s.initial_loss, "first_logged_loss": s.first_logged_loss,
        # trainer.early_stop: whether it ended the run, at which update, with which settings
        "stopped_early": s.stopped_early, "stop_update": s.step if s.stopped_early else None,
        "early_stop": ({**asdict(t.early_stop), "last_improvement": s.stop_reference_step}
                       if t.early_stop.window > 0 else None),
        "tokens_per_s": s.train_tokens / max(s.train_seconds, 1e-9),
        "train_tokens": s.train_tokens,
        "seconds_per_update": s.train_seconds / s.step if s.step else None,
        # the CUDA caching allocator's high-water mark of this process (None on CPU)
        "peak_memory_mb": (torch.cuda.max_memory_allocated(parts.device) / 2 ** 20
                           if parts.device.type == "cuda" else None),
        "wall_s": trainer.wall_s(),
        "resumed": resumed, "parameters": parts.parameters, "bleu": None,
        "device": str(parts.device), "precision": parts.precision,
    }


def train(cfg, run_dir: Path) -> dict:
    """Validate, then train (or skip a finished run), and write result.json last."""
    if not isinstance(cfg, Config):
        cfg = config_from_dict(cfg, options_class, norm_options_class)
    resolving = not is_resolved(cfg)
    check_config(cfg)  # fills in what the config left to the run (warmup=auto), then checks it
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if resolving and (run_dir / ".hydra" / "config.yaml").exists():
        folder.write_config(run_dir, cfg)  # .hydra/config.yaml says what runs
    previous = folder.is_finished(run_dir)
    if cfg.trainer.resume and previous:
        status = run_status(previous)
        log.info("run already finished (%s): %s", status, run_dir / "result.json")
        print_summary(previous, str(run_dir), status, loggers.record_finished(cfg, run_dir, previous))
        return previous
    if cfg.trainer.devices > 1 and "WORLD_SIZE" not in os.environ:
        return spawn_ddp(cfg, run_dir)
    loggers.check_available(cfg)  # a missing mlflow/wandb: one line before any data loads

    last = run_dir / folder.LAST
    resume = cfg.trainer.resume and last.exists()
    parts = build_run(cfg, initialize=not resume)
    main = parts.rank == 0
    callbacks: list[Callback] = []
    valid_bleu = (ValidBleu(parts) if cfg.trainer.valid_bleu or cfg.trainer.best_checkpoint_metric == "bleu"
                  else None)
    if main:
        callbacks.append(CheckpointCallback(run_dir, cfg.trainer.keep_checkpoints))
    telemetry = None
    if cfg.trainer.telemetry_interval > 0:
        telemetry = Telemetry(parts.model, cfg.trainer.telemetry_interval, parts.pad,
                              fp16=parts.precision == "fp16")
        callbacks.append(telemetry)
    trainer = (LMTrainer if cfg.task == "lm" else Trainer)(parts, callbacks, valid_bleu=valid_bleu)
    if resume:
        # the data is rebuilt on every start: it must give the vocabulary the checkpoint learned
        if cfg.task == "lm":
            check_saved_vocab(run_dir, parts.data.vocab, parts.data.unit)
        else:
            check_dictionaries(run_dir, parts.data.src_dict, parts.data.tgt_dict, CorpusError)
        trainer.load_state_dict(folder.load_checkpoint(last, map_location=parts.device))
        log.info("resumed from %s at update %d", last, trainer.state.step)
    elif main:
        folder.write_json(run_dir / "init.json", parts.init_report)
        if cfg.task == "lm":  # the vocabulary `deepinit sample` decodes with
            save_vocab(run_dir, parts.data.vocab, parts.data.unit)
        else:  # the vocabularies the model is trained on: eval checks its rebuilt data against them
            parts.data.src_dict.save(run_dir / "dict.src.txt")
            parts.data.tgt_dict.save(run_dir / "dict.tgt.txt")
    metrics = None
    if main:
        env = folder.environment(parts.device, parts.precision)
        folder.write_json(run_dir / "env.json", {
            **env, "compile": bool(cfg.trainer.compile),
            "compile_scope": cfg.trainer.compile_scope if cfg.trainer.compile else None,
            "host_allocator": host_allocator(), "parameters": parts.parameters,
            "unpad": parts.unpad, "data": parts.data_stats, "world_size": parts.world})
        resumed_at = trainer.state.step if resume else None
        metrics = folder.MetricsLog(run_dir, resumed_at,
                                    loggers.make_loggers(cfg, run_dir, resumed_at))
        trainer.callbacks.insert(0, MetricsCallback(metrics))
    try:
        if main:
            rows = overview(parts, run_dir, env, metrics.loggers, resumed_at)
            console.print(Overview("deepinit train", rows))
            file_log.info(overview_text("deepinit train", rows))
            log_config(cfg)
            metrics.log_params(loggers.config_params(cfg))
        with stop_after_the_update(trainer):
            outcome = trainer.run()
    except BaseException as exc:
        if metrics is not None:
            metrics.close("interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
        raise
    result = result_record(parts, trainer, outcome, resume)
    result["world_size"] = parts.world
    if cfg.task == "lm":  # the NLL in bits per character or per token (runner/train/lm_loop.py)
        # blocks at random offsets: no epochs; the summary shows the tokens trained on instead
        result.update(task="lm", epochs=None)
        bits = bits_key(parts.data.unit)
        for key, nll in ((f"valid_{bits}", result["valid_nll_loss"]), (f"best_valid_{bits}", result["best_valid_nll"])):
            result[key] = None if nll is None else nll / math.log(2.0)
    if telemetry is not None:  # where the first nan/inf appeared (docs/training.md "Telemetry")
        result["first_nonfinite"] = telemetry.first_nonfinite()
        telemetry.remove()
    if main and cfg.trainer.final_bleu and result["status"] == OK:
        try:
            with progress_lines(log.info):  # no bar on a pipe or in a sweep: log lines instead
                result.update(final_scores(cfg, run_dir, parts.device))
            averaged = result["eval"][cfg.data.test_split]["averaged"]
            if cfg.trainer.eval_average_last > 1 and averaged < cfg.trainer.eval_average_last:
                log.warning("final BLEU averaged %d checkpoint(s), not trainer.eval_average_last=%d: "
                            "the run keeps %d numbered checkpoint(s) (trainer.keep_checkpoints)",
                            averaged, cfg.trainer.eval_average_last, cfg.trainer.keep_checkpoints)
        except Exception as exc:  # scoring must not turn a finished run into a failed one
            log.warning("final BLEU failed: %s: %s", type(exc).__name__, exc)
            result["bleu_error"] = f"{type(exc).__name__}: {exc}"
    if main:
        result["loggers"] = [tracker.name for tracker in metrics.loggers]  # which ones recorded it
        folder.write_result(run_dir, result)
        metrics.log_result(result)
        metrics.close(result["status"])
        print_summary(result, str(run_dir), run_status(result), end_notes(parts, run_dir, result))
    if parts.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return result


def device_line(parts: RunParts, env: dict) -> str:
    device = f"{parts.device} ({env.get('device_name') or '?'}), {parts.precision}"
    if parts.device.type == "cpu":
        threads = torch.get_num_threads()
        device += f", {threads} thread{'s' if threads != 1 else ''}"
    if parts.world > 1:
        device += f", {parts.world} processes"
    return device


def lm_overview(parts: RunParts, run_dir: Path, env: dict, trackers: list,
                resumed_at: Optional[int]) -> list[tuple[str, str]]:
    """The start summary of a task=lm run."""
    cfg, stats, m = parts.cfg, parts.data_stats, parts.cfg.model
    updates = f"{cfg.trainer.max_updates:,} updates of {cfg.data.batch_size} x {cfg.data.block_size} tokens"
    if resumed_at is not None:
        updates += f", resuming at {resumed_at:,}"
    return [
        ("model", f"{parts.parameters:,} parameters: decoder-only, {m.num_decoder_layers} layers, "
                  f"dim {m.dim}, {m.heads} heads; norm={cfg.norm.placement} init={cfg.init.name} "
                  f"optim={cfg.optim.name} lr={cfg.optim.lr:g}"),
        ("data", f"{cfg.data.name}: {stats['train_tokens']:,} train / {stats['valid_tokens']:,} valid "
                 f"tokens ({'characters' if parts.data.unit == 'character' else 'byte-level BPE'}); "
                 f"vocab {len(parts.data):,}"),
        ("device", device_line(parts, env)),
        ("training", updates),
        ("logging", ", ".join(["metrics.jsonl", *(t.name for t in trackers)])
                    + " (full config: train.log, .hydra/config.yaml)"),
        ("run folder", str(run_dir)),
    ]


def end_notes(parts: RunParts, run_dir: Path, result: dict) -> list[str]:
    """Lines after the end-of-run summary: how to get the BLEU the run did not compute (a
    language model: how to sample from it)."""
    cfg = parts.cfg
    if cfg.task == "lm":
        unit, bits = parts.data.unit, bits_key(parts.data.unit)
        return ([f"bits per {unit}: {result[f'valid_{bits}']:.3f} (best {result[f'best_valid_{bits}']:.3f}); "
                 f"sample from it with: deepinit sample {run_dir}"]
                if result.get(f"valid_{bits}") is not None else [])
    if (result.get("bleu") is None and result["status"] == OK
            and cfg.data.test_split in parts.data.splits):
        why = ("it failed, see train.log" if result.get("bleu_error") else
               "trainer.final_bleu=false")
        return [f"BLEU: not computed ({why}); score the {cfg.data.test_split} split with: "
                f"deepinit eval {run_dir}"]
    return []


# ----------------------------------------------------------------------------- local DDP
def _ddp_worker(rank: int, world: int, port: int, cfg: Config, run_dir: Path) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if rank == 0:  # a spawned interpreter has no Hydra logging: log to train.log directly
        handler = logging.FileHandler(run_dir / "train.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(logging.INFO)
    try:
        train(cfg, run_dir)
    except (ConfigError, CorpusError) as err:
        # torch.multiprocessing hands the parent a traceback's text only: leave it the user error,
        # which it reports in one line (each rank its own file, written before it raises)
        folder.write_json(run_dir / f"{USER_ERROR}.rank{rank}.json",
                          {"type": "CorpusError" if isinstance(err, CorpusError) else "ConfigError",
                           "message": str(err)})
        raise


USER_ERROR = ".user-error"  # a DDP rank's ConfigError / CorpusError, for spawn_ddp


def _rank_user_error(run_dir: Path) -> Optional[ValueError]:
    """The ConfigError / CorpusError a spawned rank left (the files removed), or None."""
    found = None
    for path in sorted(Path(run_dir).glob(f"{USER_ERROR}.rank*.json")):
        record = folder.read_json(path) or {}
        path.unlink(missing_ok=True)
        if found is None and record.get("message"):
            kind = CorpusError if record.get("type") == "CorpusError" else ConfigError
            found = kind(record["message"])
    return found


def spawn_ddp(cfg: Config, run_dir: Path) -> dict:
    """trainer.devices=N without a launcher: start N local processes (gloo on CPU, NCCL on
    CUDA) and return rank 0's result."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if resolve_device(cfg.trainer.device).type == "cuda" and torch.cuda.device_count() < cfg.trainer.devices:
        raise ConfigError(f"trainer.devices={cfg.trainer.devices} but only "
                          f"{torch.cuda.device_count()} CUDA devices are visible")
    _rank_user_error(run_dir)  # a killed attempt's leftovers must not name this attempt's error
    context = mp.start_processes(_ddp_worker, args=(cfg.trainer.devices, port, cfg, run_dir),
                                 nprocs=cfg.trainer.devices, join=False, start_method="spawn")
    # A stop signal to this process goes to every rank (a terminal's Ctrl-C reaches them anyway:
    # they take the two as one request), and this process waits for them to save and end.
    stops: list[int] = []

    def forward(signum, frame):
        stops.append(signum)
        for process in context.processes:
            if process.is_alive():
                os.kill(process.pid, signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(signum)
            if handler is not None and handler != signal.SIG_IGN:
                previous[signum] = handler
                signal.signal(signum, forward)
    try:
        while not context.join(timeout=0.5):
            pass
    except mp.ProcessRaisedException:
        # join has stopped and joined every rank by now
        error = _rank_user_error(run_dir)
        if error is None:
            raise
        raise error from None
    finally:
        _rank_user_error(run_dir)  # whatever ended the ranks, no file outlives this attempt
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    result = folder.read_result(run_dir)
    if result is None and stops:  # the ranks stopped (they swallow KeyboardInterrupt) and saved
        raise Stopped(stops[0], folder.checkpoint_step(run_dir / folder.LAST))
    return result
