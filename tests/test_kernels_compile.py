"""The kernels' compiled (GPU) path builds for Hopper, without a GPU, and uses the hardware as meant.

The interpreter tests never compile the kernels, so an error in the native fp16/bf16 path, or a
change that turns 16-byte loads into scalar ones or spills registers, would only show on a GPU.
``pagesim.kernels.offline_compile`` compiles for sm_90 (H100/H200) with Triton's bundled ptxas; this test
runs it in a subprocess (compilation needs the kernels built outside the interpreter) on the main
variants and checks: every variant compiles, none spills registers, and the 16-bit attention
kernels use tensor-core instructions and 16-byte loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = [
    "decode bf16 d128 g4 bs16",  # Llama 3 8B, with and without split-KV
    "prefill bf16 d128 g4 bs16",
    "decode fp16 d80 g4 bs16",  # a padded head dim
    "prefill fp32 d256",  # the largest float32 tiles
    "decode fp32 d256 g8 bs16 split",
    "combine bf16",
    "write_kv_cache bf16",
    "copy_blocks bf16",
]


def _nvidia_tools() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists()


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    if not _nvidia_tools():
        pytest.skip("Triton's NVIDIA backend tools (ptxas, cuobjdump) are not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    cmd = [sys.executable, "-m", "pagesim.kernels.offline_compile", "--arch", "90", "--json"]
    for dtype in ("bf16", "fp16", "fp32"):
        cmd += ["--dtype", dtype]
    for v in VARIANTS:
        cmd += ["--only", v]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return {r["name"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])}


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
def test_every_variant_compiles_for_sm90(reports):
    for wanted in VARIANTS:
        assert any(wanted in name for name in reports), f"no compiled variant matches {wanted!r}"


def test_no_register_spills(reports):
    spilled = {name: r["spill_bytes"] for name, r in reports.items() if r["spill_bytes"]}
    assert not spilled, f"register spills (bytes): {spilled}"


def test_attention_uses_tensor_cores_and_wide_loads(reports):
    for name, r in reports.items():
        if not name.startswith(("decode bf16", "decode fp16", "prefill bf16")):
            continue
        ops = r["instructions"]
        assert any(op.startswith(("HMMA", "HGMMA")) for op in ops), f"{name}: no tensor-core instruction in {ops}"
        assert any(op.startswith("LDG") and op.endswith(".128") for op in ops), f"{name}: no 16-byte loads in {ops}"


def test_block_copy_moves_16_bytes_at_a_time(reports):
    ops = next(r for name, r in reports.items() if name.startswith("copy_blocks"))["instructions"]
    assert any(op.startswith("LDG") and op.endswith(".128") for op in ops), ops
    assert not any(op.endswith(".U16") for op in ops), f"element-wise copies: {ops}"
