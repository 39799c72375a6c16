"""What a worker generates on: the accelerator (name, memory) or the CPU, in one line.

Shown to the contributor before anything is staked (a machine that cannot hold the model is
better found out for free) and declared to the orchestrator at registration for its status page.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Literal

NativePrecision = Literal["bf16", "fp32"]


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


def _cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 `flags`, Arm `Features`); empty where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16(flags: set[str] | None = None) -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX on x86, the BF16
    extension on Arm). Without it torch emulates bf16 matmuls, measured here at 2.3x the CPU
    of fp32 for the same generation (a 128-row batch of the tiny model: 190 ms against 82 ms)."""
    flags = _cpu_flags() if flags is None else flags
    if platform.machine() in ("aarch64", "arm64"):
        return "bf16" in flags
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def native_precision(device: str) -> NativePrecision:
    """The precision `--precision auto` generates in: bf16 where the device computes it
    natively, else fp32, which there is both faster and closer to the validator's numbers.
    fp16 is never picked on its own: bf16-trained weights can overflow it."""
    if device.startswith("cuda"):
        import torch

        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_native_bf16() else "fp32"


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


def device_class(device: str) -> str:
    """The class of device whose arithmetic `device` shares: `cuda-sm90` for an H100 or H200;
    for a CPU its architecture and the kernels torch and oneDNN dispatch to on it
    (`cpu-x86_64-avx2`, `cpu-x86_64-avx512-avx512bf16`), since those change the numbers: honest
    bf16 proofs from torch's default kernels were 1.2-1.4 ulp from an AVX2 validator's, four
    times the same-class limit. A worker declares it with every submission; a suspect is
    settled by a second opinion recomputed on the same class (libs/rollout/verify.settle)."""
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":", 1)[1]) if ":" in device else 0
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda-sm{major}{minor}"
    return "-".join(["cpu", platform.machine().lower() or "unknown", *cpu_kernels()])


def cpu_kernels() -> list[str]:
    """torch's CPU capability (ATEN_CPU_CAPABILITY caps it) and, where the CPU has bf16 matrix
    instructions, oneDNN's (ONEDNN_MAX_CPU_ISA caps it): the kernels a bf16 forward runs."""
    import torch

    kernels = [torch.backends.cpu.get_cpu_capability().lower()]
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().lower()
    flags = _cpu_flags()
    matrix = "amx" if "amx_bf16" in flags else "avx512bf16" if "avx512_bf16" in flags else ""
    if cap and cap != "all":
        kernels.append(f"onednn_{cap}")
    elif matrix:
        kernels.append(matrix)
    return kernels
