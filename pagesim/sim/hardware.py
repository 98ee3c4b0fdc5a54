"""GPU presets: the handful of datasheet numbers a roofline cost model and a memory budget need.

Each ``GpuPreset`` holds, for one GPU model:

- ``memory_bytes``: total memory as ``nvidia-smi`` / ``rocm-smi`` reports it (a little under the
  marketing capacity: the H100's "80 GB" is 81,559 MiB);
- ``hbm_bytes_per_s``: peak device-memory bandwidth (HBM, or GDDR on the L-series);
- ``dense_fp16_flops``: dense fp16/bf16 tensor-core throughput;
- ``dense_fp8_flops``: dense fp8 tensor-core throughput, ``None`` on a GPU without fp8 tensor
  cores. An A100 runs an fp8 checkpoint as weight-only W8A16 (fp8 weights dequantised to bf16
  inside the GEMM, as vLLM's Marlin kernels do), so its matmuls go at bf16 speed:
  ``matmul_flops(fp8=True)`` then returns the bf16 figure;
- ``pcie_bytes_per_s``: the host link, one direction (PCIe 4.0 / 5.0 x16: 32 / 64 GB/s);
- ``interconnect_bytes_per_s``: the GPU-to-GPU link a tensor-parallel all-reduce uses, per GPU,
  one direction; PCIe where the GPU has no peer link.

"Dense" means without 2:4 structured sparsity. NVIDIA's datasheets print tensor-core peaks *with
sparsity* (footnote "With sparsity"); the dense figure is half, and half is what is stored here.
AMD prints the dense figure and the sparse one separately. Link figures are one direction: NVIDIA
quotes NVLink per GPU as the total of both directions (H100: 900 GB/s), so an entry holds half
(450 GB/s); likewise PCIe 5.0 x16's "128 GB/s" is 64 GB/s each way. These are peak figures; the
cost model applies its own efficiency factors (``pagesim.sim.cost.roofline.RooflineParams``) on top, so a
datasheet value is never silently "tuned". Each entry's ``description`` names its source.

Names: the keys of ``GPU_PRESETS`` are the canonical names. ``normalise_gpu_name`` lowercases,
trims, turns runs of spaces and underscores into one dash and drops a vendor prefix (``nvidia-``,
``amd-``), so what ``nvidia-smi --query-gpu=name`` prints, "NVIDIA H100 80GB HBM3", becomes
``h100-80gb-hbm3``; ``GPU_ALIASES`` maps such spellings to canonical names. ``resolve_gpu_name``
(for a CLI that validates without argparse ``choices``, which would reject aliases) and
``get_gpu_preset`` raise a one-line ``ValueError`` naming the nearest matches.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

MiB = 1 << 20
GB = 10**9
TFLOPS = 10**12


@dataclass(frozen=True, slots=True)
class GpuPreset:
    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    dense_fp16_flops: float  # dense fp16/bf16 tensor cores
    pcie_bytes_per_s: float  # host link, one direction
    interconnect_bytes_per_s: float  # GPU-to-GPU, per GPU, one direction (tensor parallel)
    dense_fp8_flops: float | None = None  # dense fp8 tensor cores; None where there are none
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "hbm_bytes_per_s", "dense_fp16_flops", "pcie_bytes_per_s",
                     "interconnect_bytes_per_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"GPU preset {self.name!r}: {name} must be positive, got {value!r}")
        if self.dense_fp8_flops is not None and not self.dense_fp8_flops >= self.dense_fp16_flops:
            raise ValueError(f"GPU preset {self.name!r}: dense_fp8_flops must be None or at least "
                             f"dense_fp16_flops, got {self.dense_fp8_flops!r}")

    def matmul_flops(self, fp8: bool) -> float:
        """Peak dense matmul FLOP/s: the fp8 figure for fp8 GEMMs where the GPU has fp8 tensor
        cores, else the bf16 one (an fp8 checkpoint on an A100 runs as W8A16, at bf16 speed)."""
        if fp8 and self.dense_fp8_flops is not None:
            return self.dense_fp8_flops
        return self.dense_fp16_flops


GPU_PRESETS: dict[str, GpuPreset] = {
    g.name: g
    for g in (
        # name, memory, HBM, dense bf16, host link, peer link, dense fp8, description
        GpuPreset("a100-40gb", 40_960 * MiB, 1_555 * GB, 312 * TFLOPS, 32 * GB, 300 * GB, None,
                  "A100 SXM4 40 GB: HBM2 1.56 TB/s, 312 TFLOPS fp16 dense, no fp8 tensor cores, "
                  "PCIe 4.0 x16, NVLink 3 600 GB/s. NVIDIA A100 Tensor Core GPU datasheet"),
        GpuPreset("a100-80gb", 81_920 * MiB, 2_039 * GB, 312 * TFLOPS, 32 * GB, 300 * GB, None,
                  "A100 SXM4 80 GB: HBM2e 2.04 TB/s, 312 TFLOPS fp16 dense, no fp8 tensor cores, "
                  "PCIe 4.0 x16, NVLink 3 600 GB/s. NVIDIA A100 Tensor Core GPU datasheet"),
        GpuPreset("h100-sxm", 81_559 * MiB, 3_350 * GB, 989 * TFLOPS, 64 * GB, 450 * GB, 1_979 * TFLOPS,
                  "H100 SXM5 80 GB: HBM3 3.35 TB/s, 989 / 1,979 TFLOPS bf16 / fp8 dense (1,979 / "
                  "3,958 with sparsity), PCIe 5.0 x16, NVLink 4 900 GB/s. NVIDIA H100 datasheet"),
        GpuPreset("h100-pcie", 81_559 * MiB, 2_000 * GB, 756.5 * TFLOPS, 64 * GB, 64 * GB, 1_513 * TFLOPS,
                  "H100 PCIe 80 GB: HBM2e 2 TB/s, 756.5 / 1,513 TFLOPS bf16 / fp8 dense (1,513 / "
                  "3,026 with sparsity), PCIe 5.0 x16. Peer link is PCIe: the optional NVLink bridge "
                  "(600 GB/s) joins pairs only. NVIDIA H100 datasheet (2022, H100 PCIe column), "
                  "H100 PCIe Product Brief PB-11133-001"),
        GpuPreset("h100-nvl", 95_830 * MiB, 3_900 * GB, 835.5 * TFLOPS, 64 * GB, 300 * GB, 1_670.5 * TFLOPS,
                  "H100 NVL 94 GB: HBM3 3.9 TB/s, 835.5 / 1,670.5 TFLOPS bf16 / fp8 dense (1,671 / "
                  "3,341 with sparsity), PCIe 5.0 x16, NVLink bridge 600 GB/s (pairs). NVIDIA H100 "
                  "datasheet (H100 NVL column)"),
        GpuPreset("h200", 143_771 * MiB, 4_800 * GB, 989 * TFLOPS, 64 * GB, 450 * GB, 1_979 * TFLOPS,
                  "H200 SXM 141 GB: HBM3e 4.8 TB/s, 989 / 1,979 TFLOPS bf16 / fp8 dense (1,979 / "
                  "3,958 with sparsity), PCIe 5.0 x16, NVLink 4 900 GB/s. NVIDIA H200 datasheet"),
        GpuPreset("h20", 97_871 * MiB, 4_000 * GB, 148 * TFLOPS, 64 * GB, 450 * GB, 296 * TFLOPS,
                  "H20 96 GB: HBM3 4.0 TB/s, 148 / 296 TFLOPS bf16 / fp8 dense, PCIe 5.0 x16, NVLink 4 "
                  "900 GB/s. NVIDIA publishes no H20 datasheet: figures as reported (TechPowerUp, "
                  "April 2025; Baidu Baike); measured bf16 GEMMs reach ~142 TFLOPS, so 148 is dense"),
        GpuPreset("b200", 183_359 * MiB, 7_700 * GB, 2_250 * TFLOPS, 64 * GB, 900 * GB, 4_500 * TFLOPS,
                  "B200 (HGX) 180 GB: HBM3e 7.7 TB/s, 2.25 / 4.5 PFLOPS bf16 / fp8 dense (4.5 / 9 "
                  "with sparsity), PCIe 5.0 x16, NVLink 5 1.8 TB/s. NVIDIA Blackwell Architecture "
                  "Technical Brief; HGX B200 specifications (nvidia.com/data-center/hgx)"),
        GpuPreset("l4", 23_034 * MiB, 300 * GB, 121 * TFLOPS, 32 * GB, 32 * GB, 242.5 * TFLOPS,
                  "L4 24 GB: GDDR6 300 GB/s, 121 / 242.5 TFLOPS bf16 / fp8 dense (242 / 485 with "
                  "sparsity), PCIe 4.0 x16, no NVLink. NVIDIA L4 Tensor Core GPU datasheet"),
        GpuPreset("l40s", 46_068 * MiB, 864 * GB, 362 * TFLOPS, 32 * GB, 32 * GB, 733 * TFLOPS,
                  "L40S 48 GB: GDDR6 864 GB/s, 362 / 733 TFLOPS fp16 / fp8 dense (733 / 1,466 with "
                  "sparsity), PCIe 4.0 x16, no NVLink. NVIDIA L40S datasheet"),
        GpuPreset("mi300x", 196_288 * MiB, 5_300 * GB, 1_307.4 * TFLOPS, 64 * GB, 448 * GB,
                  2_614.9 * TFLOPS,
                  "MI300X 192 GB: HBM3 5.3 TB/s, 1,307.4 / 2,614.9 TFLOPS bf16 / fp8 dense (AMD quotes "
                  "dense; twice that with sparsity), PCIe 5.0 x16, 7 Infinity Fabric links of 128 GB/s "
                  "(64 GB/s each way), one to each peer of an 8-GPU platform. AMD Instinct MI300X "
                  "data sheet and product page (amd.com)"),
    )
}

#: Devices that are not GPUs, which ``get_gpu_preset`` and ``resolve_gpu_name`` also answer for but
#: ``GPU_PRESETS`` (the GPU catalog) does not list. ``cpu`` is the engine on this machine's CPU
#: (``pagesim run --device cpu``): its figures are nominal, not a datasheet's, for the roofline a fit
#: to the engine's own CPU runs scales (``pagesim calibrate --from-measurements``); simulating a
#: CPU from them unfitted says little.
HOST_PRESETS: dict[str, GpuPreset] = {
    g.name: g
    for g in (
        GpuPreset("cpu", 16 * 1024 * MiB, 20 * GB, 48 * 10**9, 10 * GB, 10 * GB, None,
                  "nominal host CPU, not a datasheet: one x86 core's fp64 FMA peak (AVX2: two 4-wide "
                  "FMA units at 3 GHz, 48 GFLOP/s) and its DRAM bandwidth (20 GB/s), 16 GiB; copies "
                  "and peers at 10 GB/s. For fits to the engine's CPU runs"),
    )
}

# Normalised spellings (see normalise_gpu_name) -> canonical names.
GPU_ALIASES: dict[str, str] = {
    "a100": "a100-80gb",
    "a100-40g": "a100-40gb",
    "a100-80g": "a100-80gb",
    "a100-sxm4-40gb": "a100-40gb",  # nvidia-smi: "NVIDIA A100-SXM4-40GB"
    "a100-sxm4-80gb": "a100-80gb",  # nvidia-smi: "NVIDIA A100-SXM4-80GB"
    "h100": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "h100-80g": "h100-sxm",
    "h100-80gb-hbm3": "h100-sxm",  # nvidia-smi: "NVIDIA H100 80GB HBM3"
    "h100-sxm5-80gb": "h100-sxm",
    "h200-sxm": "h200",
    "h200-141gb": "h200",
    "h20-96gb": "h20",
    "b200-sxm": "b200",
    "mi300": "mi300x",
    "instinct-mi300x": "mi300x",  # rocminfo: "AMD Instinct MI300X"
    "instinct-mi300x-vf": "mi300x",  # the virtual function a cloud VM sees
}

_VENDOR_PREFIXES = ("nvidia-", "amd-")


def normalise_gpu_name(name: str) -> str:
    """Lowercase, trim, spaces and underscores to dashes, vendor prefix dropped."""
    key = re.sub(r"[\s_-]+", "-", name.strip().lower()).strip("-")
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            return key[len(prefix):]
    return key


def gpu_names() -> list[str]:
    """The canonical GPU names, in catalog order."""
    return list(GPU_PRESETS)


def resolve_gpu_name(name: str) -> str:
    """The canonical name for ``name`` (a canonical name or an alias, any case or spacing)."""
    key = normalise_gpu_name(name)
    if key in GPU_PRESETS or key in HOST_PRESETS:
        return key
    if key in GPU_ALIASES:
        return GPU_ALIASES[key]
    close = difflib.get_close_matches(key, [*GPU_PRESETS, *GPU_ALIASES], n=6)
    suggestions = list(dict.fromkeys(GPU_ALIASES.get(match, match) for match in close))[:3]
    hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
    raise ValueError(f"unknown GPU {name!r}{hint} (known: {', '.join(GPU_PRESETS)})")


def get_gpu_preset(name: str) -> GpuPreset:
    key = resolve_gpu_name(name)
    return GPU_PRESETS[key] if key in GPU_PRESETS else HOST_PRESETS[key]
