"""Every kernel refuses unsupported input with a KernelArgumentError naming the argument, on both backends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pagesim.kernels import (
    KernelArgumentError,
    copy_blocks,
    paged_decode_attention,
    paged_prefill_attention,
    resolve_backend,
    swap_blocks,
    write_kv_cache,
)

BACKENDS = ["torch", "triton"]


def decode_args(**over):
    args = dict(
        query=torch.randn(2, 8, 64),
        key_cache=torch.randn(10, 16, 2, 64),
        value_cache=torch.randn(10, 16, 2, 64),
        block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        context_lens=torch.tensor([20, 32], dtype=torch.int32),
        scale=0.125,
    )
    args.update(over)
    return args


DECODE_CASES = {
    "block_tables int64": (dict(block_tables=torch.tensor([[0, 1], [2, 3]])), "block_tables must be one of int32, got int64"),
    "context_lens int64": (dict(context_lens=torch.tensor([20, 32])), "context_lens must be one of int32"),
    "integer query": (dict(query=torch.ones(2, 8, 64, dtype=torch.int32)), "query must be one of float32, float16, bfloat16, float64"),
    "query 2-D": (dict(query=torch.randn(2, 512)), "query must have 3 dimensions"),
    "query not a tensor": (dict(query=[[1.0]]), "query must be a torch.Tensor, got list"),
    "cache dtype differs": (dict(key_cache=torch.randn(10, 16, 2, 64).half(), value_cache=torch.randn(10, 16, 2, 64).half()), "key_cache has dtype torch.float16 but query has torch.float32"),
    "value dtype differs": (dict(value_cache=torch.randn(10, 16, 2, 64).half()), "value_cache has dtype torch.float16 but key_cache has torch.float32"),
    "value shape differs": (dict(value_cache=torch.randn(10, 8, 2, 64)), "value_cache has shape"),
    "heads not a multiple": (dict(query=torch.randn(2, 6, 64), key_cache=torch.randn(10, 16, 4, 64), value_cache=torch.randn(10, 16, 4, 64)), "6 heads are not a multiple of key_cache's 4 KV heads"),
    "head_dim too large": (dict(query=torch.randn(2, 8, 512), key_cache=torch.randn(4, 16, 2, 512), value_cache=torch.randn(4, 16, 2, 512)), r"head_dim \(key_cache.shape\[3\]\) must be in 1..256"),
    "head_dim mismatch": (dict(query=torch.randn(2, 8, 128)), r"query.shape\[2\] must equal head_dim of key_cache \(64\)"),
    "strided cache": (dict(key_cache=torch.randn(10, 2, 16, 64).transpose(1, 2)), "key_cache must be contiguous"),
    "zero context": (dict(context_lens=torch.tensor([0, 32], dtype=torch.int32)), "context_lens must be >= 1, got 0 at index 0"),
    "context past table": (dict(context_lens=torch.tensor([20, 33], dtype=torch.int32)), r"context_lens\[1\] = 33 exceeds what block_tables can address \(2 blocks x block size 16 = 32\)"),
    "block id past cache": (dict(block_tables=torch.tensor([[0, 1], [2, 10]], dtype=torch.int32)), "block id 10 within a sequence's length; the cache has 10 blocks"),
    "negative block id": (dict(block_tables=torch.tensor([[0, -1], [2, 3]], dtype=torch.int32)), "block id -1"),
    "table rows": (dict(block_tables=torch.tensor([[0, 1]], dtype=torch.int32)), r"block_tables.shape\[0\] must equal the number of sequences \(2\)"),
    "cache on another device": (dict(key_cache=torch.empty(10, 16, 2, 64, device="meta"), value_cache=torch.empty(10, 16, 2, 64, device="meta")), "key_cache is on meta but query is on cpu; all must be on one device"),
    "strided context_lens": (dict(context_lens=torch.tensor([[20, 0], [32, 0]], dtype=torch.int32)[:, 0]), "context_lens must be contiguous"),
    "nan scale": (dict(scale=float("nan")), "scale must be a finite positive number"),
    "negative scale": (dict(scale=-1.0), "scale must be a finite positive number"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_decode_refuses(case, backend):
    over, message = DECODE_CASES[case]
    with pytest.raises(KernelArgumentError, match=message) as info:
        paged_decode_attention(**decode_args(**over), backend=backend)
    assert str(info.value).startswith("paged_decode_attention: ")


def test_unused_table_entries_may_hold_anything():
    """Entries past a sequence's blocks are padding: junk there is not an error."""
    args = decode_args(block_tables=torch.tensor([[0, 1, -7], [2, 3, 99]], dtype=torch.int32))
    out = paged_decode_attention(**args, backend="torch")
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(backend="cuda"), "backend must be one of auto, triton, torch, got 'cuda'"),
        (dict(num_splits=0), "num_splits must be a positive int or None"),
        (dict(max_context_len=31), r"max_context_len=31 is below the longest context \(32\)"),
    ],
)
def test_decode_refuses_options(kwargs, message):
    with pytest.raises(KernelArgumentError, match=message):
        paged_decode_attention(**decode_args(), **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_refuses(backend):
    args = decode_args(query=torch.randn(5, 8, 64))
    base = (args["query"], args["key_cache"], args["value_cache"], args["block_tables"])
    lens = torch.tensor([3, 32], dtype=torch.int32)
    cases = [
        (torch.tensor([0, 5], dtype=torch.int32), r"query_start_loc.shape\[0\] must equal the number of sequences \+ 1 \(3\)"),
        (torch.tensor([1, 2, 5], dtype=torch.int32), "query_start_loc must start at 0 and end at query.shape"),
        (torch.tensor([0, 4, 5], dtype=torch.int32), "sequence 0 has 4 query tokens but seq_lens"),
        (torch.tensor([0, 3, 5]), "query_start_loc must be one of int32"),
        (torch.tensor([[0, 9], [3, 9], [5, 9]], dtype=torch.int32)[:, 0], "query_start_loc must be contiguous"),
    ]
    for starts, message in cases:
        with pytest.raises(KernelArgumentError, match=message):
            paged_prefill_attention(*base, starts, lens, 0.125, backend=backend)
    with pytest.raises(KernelArgumentError, match=r"max_query_len=1 is below the longest chunk \(3\)"):
        paged_prefill_attention(*base, torch.tensor([0, 2, 5], dtype=torch.int32), lens, 0.125, backend=backend,
                                max_query_len=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_refuses(backend):
    cache = torch.zeros(4, 8, 2, 64)
    kv = torch.randn(3, 2, 64)
    cases = [
        (dict(slot_mapping=torch.tensor([0, 1, 32])), "slot 32 is outside the cache's 32 slots"),
        (dict(slot_mapping=torch.tensor([0, -2, 3])), "slot -2 is outside"),
        (dict(slot_mapping=torch.tensor([5, 1, 5])), "slot_mapping names a slot twice"),
        (dict(slot_mapping=torch.tensor([0.0, 1.0, 2.0])), "slot_mapping must be one of int32, int64"),
        (dict(slot_mapping=torch.tensor([[0, 9], [1, 9], [2, 9]])[:, 0]), "slot_mapping must be contiguous"),
        (dict(key=kv.half()), "key has dtype torch.float16 but key_cache has torch.float32"),
        (dict(key=torch.randn(3, 4, 64), value=torch.randn(3, 4, 64)), r"key.shape\[1\] must equal num_kv_heads of key_cache \(2\)"),
    ]
    for over, message in cases:
        args = dict(key=kv, value=kv, key_cache=cache, value_cache=cache.clone(), slot_mapping=torch.tensor([0, 1, 2]))
        args.update(over)
        with pytest.raises(KernelArgumentError, match=message):
            write_kv_cache(**args, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_refuses(backend):
    caches = [torch.zeros(8, 16, 1, 64) for _ in range(2)]
    cases = [
        ([caches[0]], [caches[1]], torch.tensor([[0, 1], [2, 1]]), "a destination block appears twice"),
        ([caches[0]], [caches[1]], torch.tensor([[0, 1], [1, 2]]), "both a source and a destination"),
        ([caches[0]], [caches[1]], torch.tensor([[0, 8]]), "destination block 8 is outside 0..7"),
        ([caches[0], torch.zeros(8, 8, 1, 64)], [caches[1], torch.zeros(8, 8, 1, 64)], torch.tensor([[0, 1]]), r"key_caches\[1\] differs from key_caches\[0\]"),
        ([], [], torch.tensor([[0, 1]]), "need one key and one value cache per layer"),
        ([caches[0]], [caches[1]], torch.tensor([0, 1]), "block_mapping must have 2 dimensions"),
        ([caches[0]], [torch.empty(8, 16, 1, 64, device="meta")], torch.tensor([[0, 1]]),
         r"value_caches\[0\] is on meta but key_caches\[0\] is on cpu"),
    ]
    for keys, values, mapping, message in cases:
        with pytest.raises(KernelArgumentError, match=message):
            copy_blocks(keys, values, mapping, backend=backend)


def test_float64_is_for_the_torch_backend_only():
    """float64 (the engine's exact reference checks) runs on torch; Triton says so."""
    single_args = decode_args()
    args = {k: (v.double() if k in ("query", "key_cache", "value_cache") else v) for k, v in single_args.items()}
    with pytest.raises(KernelArgumentError, match="paged_decode_attention: float64 runs on the torch backend only"):
        paged_decode_attention(**args, backend="triton")
    out = paged_decode_attention(**args, backend="torch")
    assert out.dtype == torch.float64
    single = paged_decode_attention(**single_args, backend="torch")
    torch.testing.assert_close(out.float(), single, rtol=1e-5, atol=1e-5)


def test_swap_refuses():
    gpu = [torch.zeros(8, 16, 1, 64)]
    with pytest.raises(KernelArgumentError, match=r"src_caches\[0\] blocks are \(16, 1, 64\) but dst_caches\[0\] blocks are \(8, 1, 64\)"):
        swap_blocks(gpu, [torch.zeros(4, 8, 1, 64)], torch.tensor([[0, 0]]))
    with pytest.raises(KernelArgumentError, match="destination block 4 is outside 0..3"):
        swap_blocks(gpu, [torch.zeros(4, 16, 1, 64)], torch.tensor([[0, 4]]))


def test_auto_backend_is_torch_on_cpu():
    assert resolve_backend("f", "auto", torch.device("cpu")) == "torch"
    assert resolve_backend("f", "torch", torch.device("cpu")) == "torch"


def test_triton_on_cpu_without_interpreter_says_how():
    """Outside the interpreter, the Triton backend on CPU tensors explains what to set."""
    code = (
        "import torch\n"
        "from pagesim.kernels import paged_decode_attention, KernelArgumentError\n"
        "from tests.test_kernels_validation import decode_args\n"
        "try:\n"
        "    paged_decode_attention(**decode_args(), backend='triton')\n"
        "except KernelArgumentError as e:\n"
        "    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert "backend='triton' on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1" in out.stdout, out.stderr
