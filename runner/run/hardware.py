"""Hardware peaks, the denominator of model FLOPs utilization (MFU): the datasheet bf16 peaks of
NVIDIA GPUs, a measured fp32 matmul peak for CPUs (and for GPUs not in the table), and MFU itself
(model FLOPs from runner/model/flops.py)."""
from __future__ import annotations

import os
import re
import statistics
import time

import torch

# bf16 dense tensor-core peaks from NVIDIA's datasheets, TFLOP/s (no sparsity).
CUDA_BF16_PEAK_TFLOPS = {"H100 SXM": 989.4, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.4,
                         "H200 NVL": 835.0, "H200": 989.4, "GH200": 989.4, "A100": 312.0,
                         "L40S": 362.0, "L40": 181.0, "L4": 121.0, "A10": 125.0}


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or a SLURM allocation's
    cpuset) where the OS has one, never more than os.cpu_count()."""
    count = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        count = min(count, len(os.sched_getaffinity(0)) or count)
    return max(1, count)


def gpu_visible() -> bool:
    """Whether torch sees a CUDA GPU; a broken CUDA install counts as none."""
    try:
        return torch.cuda.is_available()
    except Exception:
        return False


def mfu(tokens_per_s: float, flops_per_token: float, peak_gflops: float) -> float:
    """Model FLOPs utilization: the model FLOPs per second (tokens/s x FLOPs per token) over the
    peak (GFLOP/s), as a fraction."""
    return tokens_per_s * flops_per_token / 1e9 / peak_gflops


def cpu_matmul_peak(threads: int, seconds: float = 1.5) -> dict:
    """The machine's fp32 matmul GFLOP/s (median over repeats, best of a few square sizes)
    with the benchmark's thread count: the denominator of CPU MFU."""
    if threads:
        torch.set_num_threads(threads)
    sizes = {}
    for n in (1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        c = torch.empty(n, n)
        for _ in range(2):
            torch.matmul(a, b, out=c)
        times = []
        end = time.perf_counter() + seconds
        while len(times) < 3 or time.perf_counter() < end:
            t0 = time.perf_counter()
            torch.matmul(a, b, out=c)
            times.append(time.perf_counter() - t0)
        sizes[str(n)] = 2 * n ** 3 / statistics.median(times) / 1e9
    return {"gflops": max(sizes.values()), "by_size": sizes, "dtype": "fp32",
            "threads": torch.get_num_threads(), "source": "measured"}


def cuda_bf16_peak(name: str) -> dict:
    """The bf16 peak of the GPU called `name`: its datasheet row, or measured when it has none."""
    # the longest key that is a whole word of the name: "L40" is not the L4, nor "A10G" the A10
    for key in sorted(CUDA_BF16_PEAK_TFLOPS, key=len, reverse=True):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name):
            return {"gflops": CUDA_BF16_PEAK_TFLOPS[key] * 1e3, "dtype": "bf16",
                    "source": f"datasheet ({key})"}

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    return {"gflops": 20 * 2 * 8192 ** 3 / (time.perf_counter() - t0) / 1e9, "dtype": "bf16",
            "source": "measured (GPU not in the datasheet table)"}
