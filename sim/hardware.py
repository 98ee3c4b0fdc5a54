"""GPU presets: the handful of datasheet numbers a roofline cost model and a memory budget need.

Each ``GpuPreset`` holds, for one GPU model: total memory (bytes, as ``nvidia-smi`` reports it),
HBM bandwidth, dense fp16/bf16 tensor-core throughput (no sparsity), the host link (PCIe, one
direction, as specified) and the GPU-to-GPU link used by tensor-parallel all-reduces (NVLink per
GPU, one direction; PCIe where there is none). These are peak figures; the cost model applies its
own efficiency factors (``sim.cost.roofline.RooflineParams``) on top, so a datasheet value is
never silently "tuned".

Sources: NVIDIA's A100, H100, H200 and L40S datasheets (SXM form factors for A100/H100/H200).
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
GB = 10**9
TFLOPS = 10**12


@dataclass(frozen=True, slots=True)
class GpuPreset:
    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    dense_fp16_flops: float
    pcie_bytes_per_s: float  # host link, one direction
    interconnect_bytes_per_s: float  # GPU-to-GPU, one direction (tensor parallel)
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "hbm_bytes_per_s", "dense_fp16_flops", "pcie_bytes_per_s",
                     "interconnect_bytes_per_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"GPU preset {self.name!r}: {name} must be positive, got {value!r}")


GPU_PRESETS: dict[str, GpuPreset] = {
    g.name: g
    for g in (
        GpuPreset("a100-40gb", 40_960 * MiB, 1_555 * GB, 312 * TFLOPS, 32 * GB, 300 * GB,
                  "A100 SXM4 40 GB: HBM2 1.56 TB/s, 312 TFLOPS fp16, PCIe 4.0 x16, NVLink 3"),
        GpuPreset("a100-80gb", 81_920 * MiB, 2_039 * GB, 312 * TFLOPS, 32 * GB, 300 * GB,
                  "A100 SXM4 80 GB: HBM2e 2.04 TB/s, 312 TFLOPS fp16, PCIe 4.0 x16, NVLink 3"),
        GpuPreset("h100-sxm", 81_559 * MiB, 3_350 * GB, 989 * TFLOPS, 64 * GB, 450 * GB,
                  "H100 SXM5 80 GB: HBM3 3.35 TB/s, 989 TFLOPS bf16, PCIe 5.0 x16, NVLink 4"),
        GpuPreset("h200", 143_771 * MiB, 4_800 * GB, 989 * TFLOPS, 64 * GB, 450 * GB,
                  "H200 SXM 141 GB: HBM3e 4.8 TB/s, 989 TFLOPS bf16, PCIe 5.0 x16, NVLink 4"),
        GpuPreset("l40s", 46_068 * MiB, 864 * GB, 362 * TFLOPS, 32 * GB, 32 * GB,
                  "L40S 48 GB: GDDR6 864 GB/s, 362 TFLOPS fp16, PCIe 4.0 x16, no NVLink"),
    )
}


def get_gpu_preset(name: str) -> GpuPreset:
    key = name.strip().lower()
    try:
        return GPU_PRESETS[key]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; choose one of {', '.join(GPU_PRESETS)}") from None
