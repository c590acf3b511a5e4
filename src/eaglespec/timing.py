"""Wall-clock laps that wait for the device, so that each lap is the work done in it, and the
facts about the machine that every figure is quoted with."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

from eaglespec.models.kernels import bf16_linear_unit, quantized_inputs


class Clock:
    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        self.last = self.now()

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self) -> float:
        """Seconds since the previous lap (or since the clock was made)."""
        now = self.now()
        elapsed, self.last = now - self.last, now
        return elapsed


def work_seconds(device: torch.device | str = "cpu") -> float:
    """The clock that training budgets and extraction costs count. On a CPU: the process's CPU time
    per thread, which equals wall time on a quiet machine and does not count the time other
    processes take from it (or a stopped process's pause), so work that shares the CPU is still
    measured fairly; on a GPU: wall time."""
    if torch.device(device).type == "cuda":
        return time.monotonic()
    return time.process_time() / torch.get_num_threads()


def machine(device: torch.device | str = "cpu") -> dict:
    cpuinfo = Path("/proc/cpuinfo")
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")), "") if cpuinfo.exists() else platform.processor()
    import transformers

    facts = {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
             # the vector instructions torch's kernels use here (AVX2, AVX512, ...): machines of one
             # name differ, and bf16 arithmetic is native only on some
             "cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "bf16_native": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
             "torch": torch.__version__, "transformers": transformers.__version__,
             "python": platform.python_version()}
    if torch.device(device).type == "cpu":
        facts["bf16_linears"] = bf16_linear_unit()  # what verifying a tree costs there depends on it most
        facts["quantized_inputs"] = {kind: quantized_inputs(kind) for kind in ("int4", "int8")}
    if torch.device(device).type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(device)
    return facts
