"""The GPU catalog: names people type resolve to one entry, and the entries hold datasheet numbers.

The expected values below are written by hand from the sources named in each entry's description
(dense = half the "with sparsity" figure NVIDIA prints; links one direction), not copied from
``pagesim/sim/hardware.py``, so a typo in the table fails here.
"""

from __future__ import annotations

import pytest

from pagesim.sim.hardware import (
    GPU_ALIASES,
    GPU_PRESETS,
    GpuPreset,
    get_gpu_preset,
    gpu_names,
    normalise_gpu_name,
    resolve_gpu_name,
)

MiB = 1 << 20

# The five presets as they were before fp8 and aliases: (memory, HBM, fp16, PCIe, peer link).
OLD_PRESETS = {
    "a100-40gb": (40_960 * MiB, 1_555e9, 312e12, 32e9, 300e9),
    "a100-80gb": (81_920 * MiB, 2_039e9, 312e12, 32e9, 300e9),
    "h100-sxm": (81_559 * MiB, 3_350e9, 989e12, 64e9, 450e9),
    "h200": (143_771 * MiB, 4_800e9, 989e12, 64e9, 450e9),
    "l40s": (46_068 * MiB, 864e9, 362e12, 32e9, 32e9),
}


@pytest.mark.parametrize("name", sorted(OLD_PRESETS))
def test_existing_presets_keep_their_values(name):
    g = GPU_PRESETS[name]
    assert (g.memory_bytes, g.hbm_bytes_per_s, g.dense_fp16_flops, g.pcie_bytes_per_s,
            g.interconnect_bytes_per_s) == OLD_PRESETS[name]


# ------------------------------------------------------------------------------ names
def test_gpu_names_are_the_catalog_keys():
    assert gpu_names() == list(GPU_PRESETS)
    assert {"h100-pcie", "h20", "b200", "l4", "mi300x"} <= set(gpu_names())
    for name in gpu_names():
        assert resolve_gpu_name(name) == name
        assert get_gpu_preset(name) is GPU_PRESETS[name]


def test_alias_table_is_normalised_and_points_at_entries():
    for alias, target in GPU_ALIASES.items():
        assert normalise_gpu_name(alias) == alias, alias
        assert alias not in GPU_PRESETS, alias
        assert target in GPU_PRESETS, (alias, target)


@pytest.mark.parametrize(("alias", "target"), sorted(GPU_ALIASES.items()))
def test_every_alias_resolves_to_its_entry(alias, target):
    assert resolve_gpu_name(alias) == target
    assert get_gpu_preset(alias) is GPU_PRESETS[target]


@pytest.mark.parametrize(("typed", "canonical"), [
    # what nvidia-smi --query-gpu=name / rocminfo print
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H20", "h20"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("AMD Instinct MI300X", "mi300x"),
    ("AMD Instinct MI300X VF", "mi300x"),
    # case, spacing, underscores, vendor prefix
    ("  H100  ", "h100-sxm"),
    (" A100-40GB ", "a100-40gb"),
    ("h100_sxm5", "h100-sxm"),
    ("H100 SXM", "h100-sxm"),
    ("nvidia-h100", "h100-sxm"),
    ("Nvidia_H100", "h100-sxm"),
    ("h100--pcie", "h100-pcie"),
    ("A100", "a100-80gb"),
    ("a100-40g", "a100-40gb"),
    ("A100-80G", "a100-80gb"),
    ("h200-SXM", "h200"),
    ("MI300", "mi300x"),
    ("B200-SXM", "b200"),
])
def test_typed_names_resolve(typed, canonical):
    assert resolve_gpu_name(typed) == canonical
    assert get_gpu_preset(typed) is GPU_PRESETS[canonical]


def test_unknown_name_is_one_line_with_close_matches_and_the_known_list():
    with pytest.raises(ValueError) as info:
        get_gpu_preset("h10")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("unknown GPU 'h10'; did you mean h100-sxm")
    assert message.endswith(f"(known: {', '.join(GPU_PRESETS)})")
    # an alias that is close is suggested by the name it stands for, once
    with pytest.raises(ValueError, match=r"did you mean mi300x\? \(known: "):
        resolve_gpu_name("mi30")
    with pytest.raises(ValueError, match=r"^unknown GPU 'zzz' \(known: a100-40gb, "):
        resolve_gpu_name("zzz")


# ---------------------------------------------------------------------------- entries
@pytest.mark.parametrize("gpu", list(GPU_PRESETS.values()), ids=list(GPU_PRESETS))
def test_every_entry_is_positive_and_fp8_at_least_bf16(gpu):
    for value in (gpu.memory_bytes, gpu.hbm_bytes_per_s, gpu.dense_fp16_flops, gpu.pcie_bytes_per_s,
                  gpu.interconnect_bytes_per_s):
        assert value > 0
    assert gpu.dense_fp8_flops is None or gpu.dense_fp8_flops >= gpu.dense_fp16_flops
    assert any(word in gpu.description.lower() for word in ("datasheet", "data sheet", "brief")), gpu.name
    assert gpu.matmul_flops(fp8=False) == gpu.dense_fp16_flops
    assert gpu.matmul_flops(fp8=True) == (gpu.dense_fp8_flops or gpu.dense_fp16_flops)


def test_a100_has_no_fp8_and_runs_fp8_matmuls_at_bf16_speed():
    for name in ("a100-40gb", "a100-80gb"):
        g = GPU_PRESETS[name]
        assert g.dense_fp8_flops is None
        assert g.matmul_flops(fp8=True) == g.matmul_flops(fp8=False) == 312e12


def test_fp8_gpus_have_twice_the_bf16_rate():
    # Hopper, Ada, Blackwell and CDNA 3 all double the dense rate for fp8
    for g in GPU_PRESETS.values():
        if g.dense_fp8_flops is not None:
            assert g.dense_fp8_flops == pytest.approx(2 * g.dense_fp16_flops, rel=0.02), g.name


# (name, field, value): datasheet figures, halved where the source prints "with sparsity"
DATASHEET = [
    ("h100-sxm", "dense_fp16_flops", 989e12),   # 1,979 with sparsity
    ("h100-sxm", "dense_fp8_flops", 1_979e12),  # 3,958 with sparsity
    ("h200", "dense_fp8_flops", 1_979e12),
    ("h100-pcie", "memory_bytes", 81_559 * MiB),  # nvidia-smi
    ("h100-pcie", "hbm_bytes_per_s", 2_000e9),
    ("h100-pcie", "dense_fp16_flops", 756.5e12),  # 1,513 with sparsity
    ("h100-pcie", "dense_fp8_flops", 1_513e12),   # 3,026 with sparsity
    ("h100-nvl", "memory_bytes", 95_830 * MiB),
    ("h100-nvl", "dense_fp8_flops", 1_670.5e12),  # 3,341 with sparsity
    ("h20", "memory_bytes", 97_871 * MiB),
    ("h20", "hbm_bytes_per_s", 4_000e9),
    ("h20", "dense_fp16_flops", 148e12),
    ("h20", "interconnect_bytes_per_s", 450e9),  # NVLink 900 GB/s both ways
    ("b200", "memory_bytes", 183_359 * MiB),
    ("b200", "hbm_bytes_per_s", 7_700e9),
    ("b200", "dense_fp16_flops", 2_250e12),  # 4.5 PFLOPS with sparsity
    ("b200", "dense_fp8_flops", 4_500e12),   # 9 PFLOPS with sparsity
    ("b200", "interconnect_bytes_per_s", 900e9),  # NVLink 5 1.8 TB/s both ways
    ("l4", "memory_bytes", 23_034 * MiB),
    ("l4", "hbm_bytes_per_s", 300e9),
    ("l4", "dense_fp16_flops", 121e12),   # 242 with sparsity
    ("l4", "dense_fp8_flops", 242.5e12),  # 485 with sparsity
    ("l4", "interconnect_bytes_per_s", 32e9),  # no NVLink: PCIe 4.0 x16, one direction
    ("l40s", "dense_fp8_flops", 733e12),  # 1,466 with sparsity
    ("mi300x", "memory_bytes", 205_822_885_888),  # rocm-smi "VRAM Total Memory (B)"
    ("mi300x", "hbm_bytes_per_s", 5_300e9),
    ("mi300x", "dense_fp16_flops", 1_307.4e12),  # AMD quotes dense
    ("mi300x", "dense_fp8_flops", 2_614.9e12),
    ("mi300x", "interconnect_bytes_per_s", 448e9),  # 7 links x 64 GB/s each way
]


@pytest.mark.parametrize(("name", "field", "value"), DATASHEET)
def test_datasheet_values(name, field, value):
    assert getattr(GPU_PRESETS[name], field) == pytest.approx(value, rel=1e-12)


def test_preset_validation():
    args = ("x", 1, 1.0, 10.0, 1.0, 1.0)
    assert GpuPreset(*args).dense_fp8_flops is None  # old six-argument calls still work
    assert GpuPreset(*args, 20.0).matmul_flops(fp8=True) == 20.0
    with pytest.raises(ValueError, match="dense_fp8_flops must be None or at least"):
        GpuPreset(*args, 5.0)
    with pytest.raises(ValueError, match="dense_fp8_flops must be None or at least"):
        GpuPreset(*args, 0.0)
    with pytest.raises(ValueError, match="memory_bytes must be positive"):
        GpuPreset("x", 0, 1.0, 10.0, 1.0, 1.0)
