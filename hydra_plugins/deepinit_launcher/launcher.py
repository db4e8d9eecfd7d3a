"""deepinit's sweep launchers: `hydra/launcher=local` and `hydra/launcher=slurm`.

Both are built on hydra-submitit-launcher (each Hydra job pickled and run by submitit) and both:
- skip cells whose run folder already holds a finished result.json (ok/diverged), without
  starting a job for them (the trainer would skip them too, after a job's start-up cost);
- append each submitted cell's job id to SWEEP_DIR/.submitit/jobs.jsonl, which
  `deepinit sweep status` reads (runner/sweep/cells.py);
- record a cell whose job died without a result (killed, out of memory, cancelled) in its own
  run folder (result.json failed + error.txt, or interrupted.json), and tell Hydra the job
  completed, so one bad cell never aborts the sweep: run folders hold the outcomes, and
  `deepinit -m` sums them up at the end (runner/sweep/status.py).

`local`: submitit's local executor starts every job at once and gives each one
`CUDA_VISIBLE_DEVICES=0..k-1` (submitit/local/local.py, facebookresearch/hydra#2757), so this
launcher submits a cell only when a slot of disjoint GPUs is free and exports that slot's
devices to the cell itself (runner/sweep/gpus.py holds the assignment logic). Stopped by
SIGINT/SIGTERM (or any error), it stops every worker process (processes.py), marks the cells that
were running as interrupted, and re-raises; the same command resumes them.

`slurm`: one job array per sweep. With `wait: false` it returns once the array is queued;
`deepinit sweep status SWEEP_DIR` follows it. A cell whose last job is still queued or running
is not submitted again.
"""
from __future__ import annotations

import logging
import os
import shlex
import signal
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence

import submitit
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import OmegaConf, open_dict

from hydra_plugins.deepinit_launcher import config as _config  # noqa: F401 (registers slurm's schema)
from hydra_plugins.deepinit_launcher.processes import cmdline, stop_tree
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from runner.config import ConfigError
from runner.console import progress_bar
from runner.run import attempt, folder
from runner.run.status import ACTIVE
from runner.sweep import cells
from runner.sweep.gpus import SlotPool, cuda_visible_devices, detect_devices, make_slots
from runner.sweep.status import run_dirs_by_overrides

log = logging.getLogger(__name__)

# keys of conf/hydra/launcher/local.yaml that this launcher consumes instead of submitit
_OWN_KEYS = ("gpus", "gpus_per_cell", "cpu_parallelism", "poll_s", "setup", "submitit_folder",
             "max_num_timeout", "stop_grace_s")
_FALSE = ("false", "0", "no", "off")
_CONTROLLER = "submitit.local._local"  # submitit's per-job controller (and its `sh -c` wrapper)
# SLURM states of a job that ended without returning (killed from outside, or by the machine):
# submitit would still wait its _results_timeout_s (15 s) for a result file, per cell in turn
# (a cancelled 100-cell array: 25 minutes).
_NO_RESULT_STATES = ("CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE", "NODE_FAIL", "OUT_OF_MEMORY",
                     "BOOT_FAIL")
# SLURM states of a job whose processes may still run (squeue's; COMPLETING: a cancelled job's
# processes get the cluster's KillWait, and submitit's ignore the SIGTERM that starts it)
_LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED")


def _wait_until_gone(job_id: str, limit_s: float = 300.0) -> None:
    """Until SLURM no longer lists the job as live (at most `limit_s`), so that the driver reports
    a cancelled cell once its processes have ended, not while they still write its folder."""
    deadline = time.time() + limit_s
    while cells.slurm_states([job_id]).get(job_id, "") in _LIVE_STATES and time.time() < deadline:
        time.sleep(1.0)


def _completed(overrides: Sequence[str], note: Any = None) -> JobReturn:
    """What Hydra's sweeper is told about a cell: it ran (its outcome is in its run folder)."""
    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = note
    return ret


class _CellsMixin:
    """What both launchers do around submitit: skip finished cells, find and mark run folders."""

    config: Any
    hydra_context: Any

    def _sweep_dir(self) -> Path:
        return Path(str(self.config.hydra.sweep.dir))

    def _resume(self, overrides: Sequence[str]) -> bool:
        for o in overrides:
            if o.lstrip("+").startswith("trainer.resume="):
                return o.split("=", 1)[1].strip().lower() not in _FALSE
        return bool(OmegaConf.select(self.config, "trainer.resume", default=True))

    def _finished(self, job_overrides: Sequence[Sequence[str]]) -> dict[int, Path]:
        """Cells whose run folder says ok or diverged (and that do not ask to retrain)."""
        found = run_dirs_by_overrides(self._sweep_dir())
        out = {}
        for i, overrides in enumerate(job_overrides):
            run_dir = found.get(frozenset(overrides))
            if run_dir is not None and self._resume(overrides) and folder.is_finished(run_dir):
                out[i] = run_dir
        return out

    def _cell_dir(self, overrides: Sequence[str], idx: int) -> Optional[Path]:
        """A cell's run folder: the existing one, else the one Hydra would make for it."""
        found = run_dirs_by_overrides(self._sweep_dir()).get(frozenset(overrides))
        if found is not None:
            return found
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg.hydra.job):
                cfg.hydra.job.num = idx
            saved = HydraConfig.instance().cfg
            HydraConfig.instance().set_config(cfg)
            try:
                return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
            finally:
                HydraConfig.instance().cfg = saved
        except Exception as e:  # noqa: BLE001 (a name for the log only)
            log.error(f"could not name the run folder of {' '.join(overrides)}: {e}")
            return None

    def _collect(self, job: Any, overrides: Sequence[str], idx: int) -> JobReturn:
        """The cell's JobReturn; a job that ended without one is recorded in its run folder."""
        try:
            job.wait()
            ended = str(getattr(job, "state", "") or "").split(" ")[0].upper()
            if ended in _NO_RESULT_STATES and not job.paths.result_pickle.exists():
                _wait_until_gone(str(job.job_id))
                raise submitit.core.utils.UncompletedJobError(f"job {job.job_id} {ended} before returning")
            ret = job.results()[0]
            if ret.status != JobStatus.FAILED:
                return ret
            error: BaseException = ret._return_value
        except Exception as e:  # the job died (killed, OOM, cancelled) before returning
            error = e
        state = str(getattr(job, "state", "") or "").split(" ")[0].upper()
        run_dir = self._cell_dir(overrides, idx)
        lst = " ".join(overrides)
        if state in ("CANCELLED", "PREEMPTED", "TIMEOUT", "DEADLINE"):
            log.error(f"cell {lst}: job {job.job_id} {state}")
            if run_dir is not None:
                attempt.mark_interrupted(run_dir, f"job {job.job_id} {state}")
        else:
            reason = f"its job {job.job_id} ended without a result ({type(error).__name__}, state {state or '?'})"
            log.error(f"cell {lst}: {reason}: {error}")
            if run_dir is not None:
                attempt.record_failure(run_dir, reason, f"{reason}\n\n{error}\n\nlauncher logs: "
                                     f"{job.paths.stdout}, {job.paths.stderr}", overrides)
        return _completed(overrides, error)


# The first line of every local cell's setup: submitit's controller (and the `sh -c` around it)
# ignore SIGINT. A Ctrl-C in a terminal reaches every process of the sweep; the controllers would
# each print a KeyboardInterrupt traceback and kill their cell a second later, before it could
# save. The driver stops the cells itself (`_stop`), and each cell takes SIGINT back (`__call__`).
_IGNORE_SIGINT = "trap '' INT"


class LocalSweepLauncher(_CellsMixin, BaseSubmititLauncher):
    _EXECUTOR = "local"

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        """A cell, in its own process: SIGINT stops it again (its controller ignores it)."""
        if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        return super().__call__(*args, **kwargs)

    def _slots(self) -> list:
        gpus = self.params.get("gpus")
        devices = detect_devices() if gpus is None else [str(g) for g in gpus]
        per_cell = int(self.params.get("gpus_per_cell") or 0)
        return make_slots(devices, gpus_per_cell=per_cell if devices else 0,
                          cpu_parallelism=int(self.params.get("cpu_parallelism") or 1))

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:

        assert self.config is not None
        params = self.params
        pool = SlotPool(self._slots())
        executor = submitit.LocalExecutor(folder=params["submitit_folder"],
                                          max_num_timeout=int(params.get("max_num_timeout", 3)))
        base = {k: v for k, v in params.items() if k not in _OWN_KEYS and k != "name"}
        user_setup = list(params.get("setup") or [])

        sweep_dir = self._sweep_dir()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Local sweep output dir : {sweep_dir} ({pool.capacity} cells at a time)")

        results: List[Optional[JobReturn]] = [None] * len(job_overrides)
        for i, run_dir in self._finished(job_overrides).items():
            log.info(f"\t#{initial_job_idx + i} : {' '.join(filter_overrides(job_overrides[i]))}  "
                     "[finished, skipped]")
            results[i] = _completed(job_overrides[i], "finished before")
        pending: List[int] = [i for i in range(len(job_overrides)) if results[i] is None]
        running: dict = {}  # slot index -> (cell index, job)
        # cells finished / total with an ETA, in a terminal (the workers' own bars are off:
        # their output goes to the submitit logs)
        bar = progress_bar(None)
        task = bar.add_task("sweep cells", total=len(job_overrides),
                            completed=len(job_overrides) - len(pending))
        try:
            bar.start()
            while pending or running:
                while pending and pool.has_free():
                    i = pending.pop(0)
                    idx = initial_job_idx + i
                    slot_idx, slot = pool.acquire(i)
                    devices = cuda_visible_devices(slot)
                    # submitit sets CUDA_VISIBLE_DEVICES from range(gpus_per_node) for the
                    # controller; the setup line runs after that and wins.
                    executor.update_parameters(
                        **base, gpus_per_node=len(slot),
                        setup=[_IGNORE_SIGINT, f"export CUDA_VISIBLE_DEVICES={shlex.quote(devices)}"]
                        + user_setup)
                    lst = " ".join(filter_overrides(job_overrides[i]))
                    log.info(f"\t#{idx} : {lst}  [CUDA_VISIBLE_DEVICES={devices!r}]")
                    job = executor.submit(self, list(job_overrides[i]), "hydra.sweep.dir", idx,
                                          f"job_id_for_{idx}", Singleton.get_state())
                    running[slot_idx] = (i, job)
                    cells.log_jobs(sweep_dir, [{"overrides": list(job_overrides[i]),
                                                "launcher": "local", "job_id": job.job_id}])
                finished = [s for s, (_, job) in running.items() if job.done()]
                for slot_idx in finished:
                    i, job = running.pop(slot_idx)
                    pool.release(slot_idx)
                    results[i] = self._collect(job, job_overrides[i], initial_job_idx + i)
                    bar.advance(task)
                    log.info(f"\t#{initial_job_idx + i} ended "
                             f"({len(job_overrides) - len(pending) - len(running)} of "
                             f"{len(job_overrides)} cells ended)")
                if not finished:
                    time.sleep(float(params.get("poll_s", 1.0)))
        except BaseException as exc:
            bar.stop()
            self._stop(running, job_overrides, initial_job_idx, exc)
            raise
        bar.stop()
        return [r for r in results if r is not None]

    def _stop(self, running: dict, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
              exc: BaseException) -> None:
        """Stop every worker, then mark the cells that were running as interrupted."""
        if isinstance(exc, KeyboardInterrupt):
            why = f"{attempt.signal_name(attempt.signal_of(exc))} to the local launcher"
        else:
            why = f"the local launcher stopped on {type(exc).__name__}: {exc}"
        log.warning(f"stopping {len(running)} running cells: {why}")
        popens = [job._process for _, job in running.values() if getattr(job, "_process", None)]
        killed = stop_tree(os.getpid(), popens, float(self.params.get("stop_grace_s", 10.0)),
                           interrupt=lambda pid: _CONTROLLER not in cmdline(pid))
        if killed:
            log.warning(f"killed {len(killed)} worker processes that outlived the grace period")
        for i, _ in running.values():
            run_dir = self._cell_dir(job_overrides[i], initial_job_idx + i)
            if run_dir is not None:
                attempt.mark_interrupted(run_dir, why)


class SlurmSweepLauncher(_CellsMixin, BaseSubmititLauncher):
    _EXECUTOR = "slurm"

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None
        params = dict(self.params)
        wait = str(params.pop("wait", True)).strip().lower() not in _FALSE
        sweep_dir = self._sweep_dir()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        log.info(f"SLURM sweep output dir : {sweep_dir}")

        results: List[Optional[JobReturn]] = [None] * len(job_overrides)
        for i in self._finished(job_overrides):
            results[i] = _completed(job_overrides[i], "finished before")
            log.info(f"\t#{initial_job_idx + i} : {' '.join(filter_overrides(job_overrides[i]))}  "
                     "[finished, skipped]")
        # a cell whose last job is still queued or running is not submitted twice
        last = cells.latest_jobs(sweep_dir)
        mine = {i: last[frozenset(o)] for i, o in enumerate(job_overrides)
                if results[i] is None and frozenset(o) in last}
        states = cells.job_states(mine.values()) if mine else {}
        for i, entry in mine.items():
            state = states.get(str(entry.get("job_id")), "")
            if cells.cell_status(None, entry, state)[0] in ACTIVE:
                results[i] = _completed(job_overrides[i], f"job {entry['job_id']} {state}")
                log.info(f"\t#{initial_job_idx + i} : {' '.join(filter_overrides(job_overrides[i]))}  "
                         f"[job {entry['job_id']} {state.lower()}, not resubmitted]")
        todo = [i for i in range(len(job_overrides)) if results[i] is None]
        if not todo:
            log.info("nothing to submit")
            return [r for r in results if r is not None]

        if submitit.SlurmExecutor.affinity() <= 0:  # submitit's own test: `srun` on PATH
            raise ConfigError("hydra/launcher=slurm needs SLURM, and this machine has no `srun` on "
                              "PATH: run the sweep on a SLURM login node, or here with "
                              "hydra/launcher=local")
        # executor and parameters as hydra-submitit-launcher's BaseSubmititLauncher.launch builds them
        executor = submitit.AutoExecutor(cluster="slurm", folder=params.pop("submitit_folder"),
                                         slurm_max_num_timeout=params.pop("max_num_timeout", 0))
        base_keys = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base_keys else f"slurm_{k}": v
                                      for k, v in params.items()})
        job_params = []
        for i in todo:
            idx = initial_job_idx + i
            log.info(f"\t#{idx} : {' '.join(filter_overrides(job_overrides[i]))}")
            job_params.append((list(job_overrides[i]), "hydra.sweep.dir", idx, f"job_id_for_{idx}",
                               Singleton.get_state()))
        jobs = executor.map_array(self, *zip(*job_params))
        cells.log_jobs(sweep_dir, [{"overrides": list(job_overrides[i]), "launcher": "slurm",
                                    "job_id": j.job_id, "folder": str(j.paths.folder)}
                                   for i, j in zip(todo, jobs)])
        array = jobs[0].job_id.split("_")[0]
        log.info(f"submitted {len(jobs)} cells as SLURM job array {array}")
        if not wait:
            for i, j in zip(todo, jobs):
                results[i] = _completed(job_overrides[i], f"job {j.job_id} queued")
            return [r for r in results if r is not None]
        try:
            for i, j in zip(todo, jobs):
                results[i] = self._collect(j, job_overrides[i], initial_job_idx + i)
        except KeyboardInterrupt:
            log.warning(f"the driver stops waiting; job array {array} keeps running on SLURM "
                        f"(`deepinit sweep status {sweep_dir}`; `scancel {array}` stops it)")
            raise
        return [r for r in results if r is not None]
