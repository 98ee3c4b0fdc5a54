"""Compile the Triton kernels for a GPU without having one: does the native path build, and what does it use?

The CPU tests run the kernels in Triton's interpreter, which never compiles them; the compiled path
(fp16/bf16 operands on the matrix units, software-pipelined loads) is only exercised on a GPU. Triton
ships its NVIDIA backend with ``ptxas`` and ``cuobjdump``, so any machine can compile a kernel for a
given architecture and read the result: registers, spilled bytes, shared memory, and which load and
matrix instructions the SASS holds (``LDGSTS...128`` = 16-byte asynchronous copies; ``HMMA`` /
``HGMMA`` = tensor cores).

Each variant is specialised as Triton's JIT would specialise a real launch: pointers and the strides
and sizes that are multiples of 16 carry ``tt.divisibility=16`` (without it the compiler cannot prove
alignment and falls back to 2-byte scalar loads). The block-table row stride is left unhinted, since
it is whatever ``max_blocks_per_seq`` is.

Must run without ``TRITON_INTERPRET`` (interpreted kernels cannot be compiled): ``python -m
kernels.offline_compile`` prints the table; ``tests/test_kernels_compile.py`` runs it in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

DTYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}
INSTRUCTION = re.compile(r"\b((?:LDGSTS|LDG|STG|HMMA|HGMMA)[.A-Z0-9]*)")
# Arguments never hinted divisible: the block-table row stride and run-time counts.
UNHINTED = {"stride_bs", "stride_m0", "stride_m1", "num_splits", "scale_log2"}


@dataclass
class Report:
    name: str
    arch: int
    registers: int | None
    spill_bytes: int | None
    shared_bytes: int
    instructions: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.instructions.items()))
        return (f"{self.name:<44} sm_{self.arch}  regs {self.registers!s:>4}  spill {self.spill_bytes!s:>4} B  "
                f"smem {self.shared_bytes:>6} B  {ops}")


def variants(dtype: str = "bf16") -> dict[str, tuple[str, dict, dict]]:
    """name -> (kernel, pointer element types, constexprs), at the launchers' choices for Llama-like shapes."""
    from pagesim.kernels.triton_attention import decode_tile, prefill_tile

    t = DTYPES[dtype]
    f32 = dtype == "fp32"
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    attn = {"q_ptr": t, "k_cache_ptr": t, "v_cache_ptr": t, "out_ptr": t, "block_tables_ptr": "i32",
            "context_lens_ptr": "i32", "query_start_loc_ptr": "i32", "seq_lens_ptr": "i32",
            "part_out_ptr": "fp32", "part_lse_ptr": "fp32"}
    out: dict[str, tuple[str, dict, dict]] = {}
    for head_dim, group, block_size in ((128, 4, 16), (128, 8, 8), (64, 1, 128), (80, 4, 16), (256, 8, 16)):
        pad = max(16, 1 << (head_dim - 1).bit_length())
        for split in (False, True):
            out[f"decode {dtype} d{head_dim} g{group} bs{block_size}{' split' if split else ''}"] = (
                "_decode_kernel", attn,
                dict(BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, GROUP=group,
                     GROUP_PAD=max(16, group), BLOCK_N=decode_tile(pad, torch_dtype), SPLIT=split, DOT_F32=f32))
        tile = prefill_tile(pad, torch_dtype)
        out[f"prefill {dtype} d{head_dim} g{group} bs{block_size}"] = (
            "_prefill_kernel", attn,
            dict(BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, GROUP=group,
                 BLOCK_M=tile, BLOCK_N=tile, DOT_F32=f32))
    out[f"combine {dtype} d128 splits<=8"] = (
        "_combine_splits_kernel", {**attn}, dict(HEAD_DIM=128, HEAD_DIM_PAD=128, SPLITS_PAD=8))
    out[f"write_kv_cache {dtype} 8x128"] = (
        "_write_kernel", {"key_ptr": t, "value_ptr": t, "k_cache_ptr": t, "v_cache_ptr": t, "slot_ptr": "i64"},
        dict(NUM_KV_HEADS=8, HEAD_DIM=128, HEADS_PAD=8, HEAD_DIM_PAD=128))
    out[f"copy_blocks {dtype} bs16 8x128"] = (
        "_copy_blocks_kernel", {"cache_addrs_ptr": "i64", "typed_ptr": t, "mapping_ptr": "i64"},
        dict(BLOCK_NUMEL=16 * 8 * 128, CHUNK=1024, ALIGNED=True))
    return out


def _kernel(name: str):
    from pagesim.kernels import triton_attention, triton_cache

    fn = getattr(triton_attention, name, None) or getattr(triton_cache, name)
    if type(fn).__name__ != "JITFunction":
        raise RuntimeError("offline compilation needs compiled kernels: unset TRITON_INTERPRET")
    return fn


def _tool(name: str) -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def _ptxas_info(ptx: Path, arch: int) -> tuple[int | None, int | None]:
    suffix = "a" if arch == 90 else ""
    for tool in ("ptxas-blackwell", "ptxas"):
        path = _tool(tool)
        if not path.exists():
            continue
        cmd = [str(path), "-v", f"--gpu-name=sm_{arch}{suffix}", str(ptx), "-o", str(ptx.with_suffix(".o"))]
        res = subprocess.run(cmd, capture_output=True, text=True)
        regs = re.search(r"Used (\d+) registers", res.stderr)
        spill = re.search(r"(\d+) bytes spill stores", res.stderr)
        if res.returncode == 0 and regs:
            return int(regs.group(1)), int(spill.group(1)) if spill else 0
    return None, None


def compile_variant(name: str, kernel: str, pointer_types: dict, constexprs: dict, arch: int = 90) -> Report:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _kernel(kernel)
    signature = {}
    attrs = {}
    for i, arg in enumerate(fn.arg_names):
        if arg in constexprs:
            signature[arg] = "constexpr"
            continue
        if arg.endswith("_ptr"):
            signature[arg] = "*" + pointer_types[arg]
        else:
            signature[arg] = "fp32" if arg == "scale_log2" else "i32"
        if arg not in UNHINTED:
            attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32))
    with TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(compiled.asm["ptx"])
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        registers, spill = _ptxas_info(ptx, arch)
        sass = subprocess.run([str(_tool("cuobjdump")), "--dump-sass", str(cubin)], capture_output=True, text=True).stdout
    return Report(name, arch, registers, spill, compiled.metadata.shared, dict(Counter(INSTRUCTION.findall(sass))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--arch", type=int, action="append", help="compute capability x10 (default: 90 and 80)")
    ap.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="default: bf16, fp16 and fp32")
    ap.add_argument("--only", action="append", help="variants whose name contains this text (repeatable: any)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    reports = []
    for dtype in args.dtype or ["bf16", "fp16", "fp32"]:
        for name, (kernel, types, consts) in variants(dtype).items():
            if args.only and not any(text in name for text in args.only):
                continue
            for arch in args.arch or [90, 80]:
                report = compile_variant(name, kernel, types, consts, arch)
                reports.append(report)
                if not args.json:
                    print(report.line(), flush=True)
    if args.json:
        print(json.dumps([asdict(r) for r in reports]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
