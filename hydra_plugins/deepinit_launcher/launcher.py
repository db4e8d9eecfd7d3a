"""`hydra/launcher=local`: run sweep cells in parallel on this machine, one GPU set per cell.

Built on hydra-submitit-launcher's local launcher, which pickles each Hydra job, runs it in a
subprocess and reruns it in place on a timeout. What differs: submitit's local executor starts
every job at once and gives each one `CUDA_VISIBLE_DEVICES=0..k-1` (submitit/local/local.py,
facebookresearch/hydra#2757), so this launcher submits a cell only when a slot of disjoint GPUs is
free and exports that slot's devices to the cell itself (runner/sweep/gpus.py holds the assignment
logic).
"""
from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence

import submitit
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from runner.sweep.gpus import SlotPool, cuda_visible_devices, detect_devices, make_slots

log = logging.getLogger(__name__)

# keys of conf/hydra/launcher/local.yaml that this launcher consumes instead of submitit
_OWN_KEYS = ("gpus", "gpus_per_cell", "cpu_parallelism", "poll_s", "setup", "submitit_folder",
             "max_num_timeout")


class LocalSweepLauncher(BaseSubmititLauncher):
    _EXECUTOR = "local"

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

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Local sweep output dir : {sweep_dir} ({pool.capacity} cells at a time)")

        pending: List[int] = list(range(len(job_overrides)))
        running: dict = {}  # slot index -> (cell index, job)
        results: List[Optional[JobReturn]] = [None] * len(job_overrides)
        try:
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
                        setup=[f"export CUDA_VISIBLE_DEVICES={shlex.quote(devices)}"] + user_setup)
                    lst = " ".join(filter_overrides(job_overrides[i]))
                    log.info(f"\t#{idx} : {lst}  [CUDA_VISIBLE_DEVICES={devices!r}]")
                    job = executor.submit(self, list(job_overrides[i]), "hydra.sweep.dir", idx,
                                          f"job_id_for_{idx}", Singleton.get_state())
                    running[slot_idx] = (i, job)
                finished = [s for s, (_, job) in running.items() if job.done()]
                for slot_idx in finished:
                    i, job = running.pop(slot_idx)
                    pool.release(slot_idx)
                    results[i] = self._collect(job, job_overrides[i])
                if not finished:
                    time.sleep(float(params.get("poll_s", 1.0)))
        except BaseException:
            for _, job in running.values():
                job.cancel(check=False)
            raise
        return [r for r in results if r is not None]

    @staticmethod
    def _collect(job: Any, overrides: Sequence[str]) -> JobReturn:
        try:
            return job.results()[0]
        except Exception as e:  # the job process died (killed, OOM) before returning
            log.error(f"cell {' '.join(overrides)} ended without a result: {e}")
            ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
            ret._return_value = e
            return ret
