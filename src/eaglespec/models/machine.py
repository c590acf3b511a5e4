"""The facts about the machine that every figure is quoted with: the CPU, its vector units, the
kernels our linears run on, the library versions."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch
import transformers

from eaglespec.models.kernels import bf16_linear_unit, quantized_inputs


def machine(device: torch.device | str = "cpu") -> dict:
    cpuinfo = Path("/proc/cpuinfo")
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")), "") if cpuinfo.exists() else platform.processor()
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
