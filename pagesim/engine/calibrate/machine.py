"""The machine a profile is measured on: its device (``device_info``: the CUDA device's name,
memory and capability, or the CPU's model name and the threads used) and its software
(``versions``: Python, torch, the platform, pagesim, Triton, numpy and CUDA).

A calibration records both in every profile it writes (``pagesim.engine.calibrate.calibrate``); a
later run compares them with its own machine's, as the profile's fingerprint
(``pagesim.engine.calibrate.probe.fingerprint_differences``), and resuming a calibration requires
the same device.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def device_info(device: torch.device, threads: int) -> dict:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "memory_bytes": props.total_memory,
                "capability": f"{props.major}.{props.minor}"}
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"type": "cpu", "name": name, "threads": threads}


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()}
    for name in ("pagesim", "triton", "numpy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
    return out
