"""What a worker generates on: the accelerator (name, memory) or the CPU, in one line.

Shown to the contributor before anything is staked (a machine that cannot hold the model is
better found out for free) and declared to the orchestrator at registration for its status page.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    kind: str  # "cuda" or "cpu"
    name: str
    memory_gib: float
    count: int = 1

    def describe(self) -> str:
        many = f"{self.count}× " if self.count > 1 else ""
        return f"{many}{self.name}, {self.memory_gib:.0f} GiB"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


def _ram_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


def detect(device: str) -> Hardware:
    """The hardware behind `device` ("cpu", "cuda", "cuda:N"). Raises ValueError when a CUDA
    device is asked for and none is visible."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"no CUDA device is visible for {device}")
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"{device}: only {torch.cuda.device_count()} CUDA device(s)")
        props = torch.cuda.get_device_properties(index)
        return Hardware("cuda", props.name, props.total_memory / 2**30)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Hardware("cpu", f"{_cpu_name()} ({cores or 1} cores)", _ram_gib())
