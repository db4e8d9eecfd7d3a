"""`deepinit bench --profile N`: torch.profiler over N training updates that follow an entry's
timed windows, so the throughput figures carry no profiler overhead. It writes the operator
table (self time, the device's on a GPU) and a Chrome/Perfetto trace, and keeps the top
operators in the bench JSON."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
from torch.profiler import ProfilerActivity

from runner.train.loop import Callback

TABLE_ROWS = 30  # rows of the written operator table
TOP_ROWS = 10  # operators kept in the bench JSON
# On the CPU, the step annotation's own time is the update's time spent outside every operator.
OUTSIDE = "(outside operators: Python, batching, the loop)"


class OperatorProfile(Callback):
    """Profiles updates skip+2 .. skip+1+updates of a training run: the first `skip` are not
    recorded, the next one warms the profiler up (its first recorded step is distorted by its
    own start-up), then `updates` are recorded. The trainer calls `on_step_end` once per
    update; use as a context manager around `trainer.run()`."""

    def __init__(self, skip: int, updates: int, stem: Path, cuda: bool):
        self.updates, self.stem, self.cuda = updates, Path(stem), cuda
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.profiler = torch.profiler.profile(
            activities=activities, on_trace_ready=self._write,
            schedule=torch.profiler.schedule(wait=skip, warmup=1, active=updates, repeat=1))
        self.summary: Optional[dict[str, Any]] = None

    @property
    def sort_key(self) -> str:
        return "self_device_time_total" if self.cuda else "self_cpu_time_total"

    def __enter__(self) -> "OperatorProfile":
        self.profiler.start()
        return self

    def __exit__(self, *exc) -> None:
        self.profiler.stop()

    def on_step_end(self, trainer, out) -> None:
        self.profiler.step()

    def _write(self, prof: torch.profiler.profile) -> None:
        averages = prof.key_averages()
        table_path = Path(f"{self.stem}.profile.txt")
        trace_path = Path(f"{self.stem}.trace.json")
        table_path.parent.mkdir(parents=True, exist_ok=True)
        table_path.write_text(f"{self.updates} training updates, sorted by {self.sort_key}\n"
                              + averages.table(sort_by=self.sort_key, row_limit=TABLE_ROWS) + "\n")
        prof.export_chrome_trace(str(trace_path))
        self.summary = top_operators(averages, self.sort_key, self.updates)
        self.summary.update(table=str(table_path), trace=str(trace_path))


def top_operators(averages, sort_key: str, updates: int) -> dict[str, Any]:
    """The operators with the most self time, per update, with their share of the total.

    On the CPU the total is every operator's self CPU time (the profiled wall time spent in
    operators), and the step annotation's own time is the update's time outside them. On CUDA
    the total is the GPU's busy time, the sum over its kernels; the operators are ranked by the
    GPU time of the kernels they launched (kernel rows would count that time twice, and the
    annotations' device time is their span, not work), and `step_ms_per_update` is the profiled
    update's CPU span, beside `device_busy_ms_per_update`: their gap is time the GPU waited."""
    if sort_key == "self_device_time_total":
        from torch.autograd import DeviceType  # noqa: PLC0415

        # as torch.profiler's own table totals it: device events, less the GPU-side copies of
        # user annotations (the step, Optimizer.step), whose device time is their span
        kernels = [e for e in averages if e.device_type != DeviceType.CPU and not e.is_user_annotation]
        step = [e for e in averages if e.key.startswith("ProfilerStep")]
        operators = [e for e in averages if e.device_type == DeviceType.CPU and not e.is_user_annotation
                     and not e.key.startswith("ProfilerStep")]
        total_us = sum(e.self_device_time_total for e in kernels)
        extra = {"device_busy_ms_per_update": total_us / 1e3 / updates,
                 "step_ms_per_update": (sum(e.cpu_time_total for e in step) / 1e3 / updates) if step else None}
    else:
        operators, extra = list(averages), {}
        total_us = sum(getattr(e, sort_key) for e in averages)
    ranked = sorted(operators, key=lambda e: getattr(e, sort_key), reverse=True)[:TOP_ROWS]
    return {"updates": updates, "sort_by": sort_key, "self_ms_per_update": total_us / 1e3 / updates,
            **extra,
            "top": [{"name": OUTSIDE if e.key.startswith("ProfilerStep") else e.key,
                     "calls_per_update": e.count / updates,
                     "self_ms_per_update": getattr(e, sort_key) / 1e3 / updates,
                     "share": getattr(e, sort_key) / total_us if total_us else None}
                    for e in ranked]}
