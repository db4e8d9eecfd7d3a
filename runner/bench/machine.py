"""The machine a bench runs on: the cores other processes use while a block runs (it may be
shared), this process's memory, and the report's description of the machine."""
from __future__ import annotations

import os
import platform
import time

import torch

from runner.run.folder import cpu_name


def busy_cpu_seconds() -> float:
    """CPU seconds every process on the machine has used (user+nice+system+irq+softirq+steal)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


class LoadProbe:
    """Cores used by other processes while a block ran (the machine may be shared)."""

    @staticmethod
    def _own_cpu() -> float:  # this process and its waited-for children (the peer's scripts)
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def __enter__(self):
        self.busy, self.cpu, self.t0 = busy_cpu_seconds(), self._own_cpu(), time.perf_counter()
        self.loadavg_before = os.getloadavg()[0]
        return self

    def __exit__(self, *exc):
        wall = max(time.perf_counter() - self.t0, 1e-9)
        own = self._own_cpu() - self.cpu
        self.other_cores = max(0.0, (busy_cpu_seconds() - self.busy - own) / wall)
        self.loadavg_after = os.getloadavg()[0]

    def as_dict(self) -> dict:
        return {"other_cores": round(self.other_cores, 3),
                "loadavg_1min": [round(self.loadavg_before, 2), round(self.loadavg_after, 2)]}


def rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def machine_info(device: str, threads: int) -> dict:
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    name = torch.cuda.get_device_name() if cuda else (cpu_name() or platform.machine())
    return {"device": "cuda" if cuda else "cpu", "device_name": name, "torch": torch.__version__,
            "cpus": os.cpu_count(), "threads": threads or torch.get_num_threads(),
            "hostname": platform.node(), "python": platform.python_version(),
            "loadavg_start": os.getloadavg()}

