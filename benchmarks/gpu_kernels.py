"""GPU benchmark of the paged KV-cache kernels (``pagesim/kernels/``) on one NVIDIA GPU (written for an H200).

What is measured
----------------
1. *Copy bandwidth*, the ceiling for memory-bound kernels: ``dst.copy_(src)`` of a 2 GiB bfloat16
   tensor on the device; bytes = read + written (4 GiB).
2. *Decode*: ``paged_decode_attention(backend="triton")`` for batch {1, 8, 32, 128} x context
   {128, 1024, 4096, 16384} x block size {8, 16, 32, 64, 128}, Llama 3 8B shapes (32 query heads,
   8 KV heads, head dim 128, bfloat16), every sequence at the full context, random cache contents
   and randomly permuted block tables, scale 1/sqrt(128), ``max_context_len`` passed (no sync).
   Bytes moved = K and V of every sequence's context (batch * context * 8 * 128 * 2 bytes, twice)
   + query + output + the block-table entries and context lengths read; the split-KV partials
   (fp32, when ``num_splits`` > 1) are overhead and not counted. Reported: median ms, GB/s, fraction
   of the measured copy bandwidth, the flash-decoding split count (``choose_num_splits``), and
   ``paged / SDPA``: the time over ``torch.nn.functional.scaled_dot_product_attention`` on the same
   data laid out contiguously (K/V ``[batch, 8, context, 128]``, query ``[batch, 32, 1, 128]``,
   ``enable_gqa=True``; if that is refused, K/V repeated per query head outside the timing, and
   the row says which). Once per (batch, context), at block size 16, the output is checked
   against SDPA's (and against the torch backend where that fits): relative error
   ``|a - b| / |b| < 2e-2``.
3. *Prefill*: ``paged_prefill_attention`` for chunks of {512, 2048, 8192} tokens after {0, 4096}
   cached tokens, 1 and 4 sequences, block size 16; TFLOP/s = 4 * heads * head_dim * visible
   (query, key) pairs (causal within the chunk, the whole cached prefix) / time.
4. *Cache ops*: ``write_kv_cache`` for {256, 4096, 32768} tokens and ``copy_blocks`` for 32 layers x
   {16, 256} pairs at block size 16, GB/s of bytes read + written; ``swap_blocks`` GPU->CPU and
   CPU->GPU for 256 blocks x 32 layers (pinned CPU caches), GB/s of block bytes moved one way,
   beside a plain pinned host<->device copy of the same size for reference.

How
---
Kernel times are the median of ``triton.testing.do_bench(fn, warmup, rep, return_mode="median")``
(CUDA events; it zeroes a 256 MB buffer before every call, so each call starts with a cold L2).
Decode configs whose K/V fit in a few L2s also rotate among input sets in distinct regions of one
cache of >= 256 MB, so a small config cannot be served from cache. Swaps, which include host work,
are wall-clock medians around device synchronisations. Every config runs in its own try/except:
an error (a CUDA OOM frees memory first) is recorded and the run goes on; once ``--time-budget-s``
is spent no new config starts and the skipped ones are listed.

Outputs in ``--out`` (default ``$OUT``, else ``benchmarks/results/``): ``gpu_kernels.json`` (device,
versions, copy bandwidth, every row, errors, skipped, summary, wall time), ``gpu_kernels_decode.csv``,
``gpu_kernels_other.csv`` and ``table.txt``, the summary table, which is also printed last.

``--smoke`` runs tiny shapes on the CPU in Triton's interpreter (both backends, fp32, medians of
``time.perf_counter``) to check the script itself; its figures mean nothing. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import itertools
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpu_kernels_table import format_table, summarize

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
GIB = 1 << 30
CHECK_TOL = 2e-2
DECODE_SHARE = 0.6  # decode may use this share of the time budget; the other sections the rest
DECODE_FIELDS = (
    "backend", "batch", "context", "block_size", "num_splits", "n_sets", "median_ms", "bytes", "gbps",
    "frac_copy_bw", "graph_ms", "sdpa_ms", "sdpa_mode", "paged_over_sdpa", "rel_err_vs_sdpa", "rel_err_vs_torch",
    "check_ok", "error",
)


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    dtype: str
    heads: int
    kv_heads: int
    head_dim: int
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    block_sizes: tuple[int, ...]
    region: tuple[int, int]  # (min batch, min context) of the decode targets
    prefill: tuple[tuple[int, int, int], ...]  # (chunk tokens, cached tokens, sequences)
    write_tokens: tuple[int, ...]
    copy_pairs: tuple[int, ...]
    layers: int
    copy_blocks_per_layer: int
    swap_blocks: int
    swap_pool_blocks: int
    backends: tuple[str, ...]
    copy_bytes: int
    rotate_bytes: int  # decode inputs smaller than this rotate among input sets
    max_sets: int
    torch_check_tokens: int  # decode: also check against the torch backend up to batch * context
    prefill_check_bytes: int  # prefill: check against torch when one sequence's scores fit
    ref_block_size: int = 16  # decode correctness checks and the targets use this block size
    cache_block_size: int = 16  # prefill, write_kv_cache, copy_blocks, swap_blocks
    warmup_ms: int = 25
    rep_ms: int = 100
    cpu_reps: int = 3
    swap_reps: int = 5


SWEEP_SPLITS = (1, 2, 4, 8, 16, 32)  # decode split counts timed at the reference block size

GPU = Profile(
    name="gpu", dtype="bfloat16", heads=32, kv_heads=8, head_dim=128,
    batches=(1, 8, 32, 128), contexts=(128, 1024, 4096, 16384), block_sizes=(8, 16, 32, 64, 128),
    region=(32, 1024),
    prefill=tuple((c, p, s) for s in (1, 4) for p in (0, 4096) for c in (512, 2048, 8192)),
    write_tokens=(256, 4096, 32768), copy_pairs=(16, 256), layers=32, copy_blocks_per_layer=1024,
    swap_blocks=256, swap_pool_blocks=512, backends=("triton",), copy_bytes=2 * GIB,
    rotate_bytes=256 * MIB, max_sets=1024, torch_check_tokens=65536, prefill_check_bytes=2 * GIB,
)
QUICK = dataclasses.replace(
    GPU, name="gpu-quick", batches=(8, 32, 128), contexts=(1024, 4096),
    prefill=((2048, 0, 1), (2048, 4096, 4)), write_tokens=(4096,), copy_pairs=(256,), warmup_ms=10, rep_ms=40,
)
SMOKE = Profile(
    name="smoke", dtype="float32", heads=4, kv_heads=2, head_dim=64,
    batches=(1, 2), contexts=(16, 40), block_sizes=(8, 16), region=(2, 40),
    prefill=((16, 0, 1), (40, 0, 2), (16, 24, 1), (40, 24, 2)),
    write_tokens=(16, 64), copy_pairs=(2, 4), layers=2, copy_blocks_per_layer=16,
    swap_blocks=4, swap_pool_blocks=8, backends=("triton", "torch"), copy_bytes=32 * MIB,
    rotate_bytes=256 * 1024, max_sets=8, torch_check_tokens=1 << 30, prefill_check_bytes=1 << 30,
    swap_reps=3,
)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", default=None,
                    help="output folder (default: $OUT, else benchmarks/results/; a temporary folder with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU in Triton's interpreter")
    ap.add_argument("--quick", action="store_true", help="fewer GPU configs and shorter timings")
    ap.add_argument("--time-budget-s", type=float, default=330.0,
                    help="start no new config after this many seconds (default 330)")
    return ap.parse_args(argv)


def _import_kernels() -> None:
    """Import torch, triton and kernels, after main() has settled TRITON_INTERPRET."""
    global F, choose_num_splits, do_bench, do_bench_cudagraph, kernels, torch, triton
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import torch
    import torch.nn.functional as F
    import triton
    from triton.testing import do_bench, do_bench_cudagraph

    from pagesim import kernels
    from pagesim.kernels.triton_attention import choose_num_splits


# ----------------------------------------------------------------------------------------- helpers


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gbps(nbytes: float, ms: float | None) -> float | None:
    return nbytes / ms / 1e6 if ms else None


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))




def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sanitize(obj):
    """JSON-safe: non-finite floats become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v) for v in obj]
    return obj




# ----------------------------------------------------------------------------------------- runner


class Runner:
    """Holds the profile, the timers, the time budget and the results being collected."""

    def __init__(self, args: argparse.Namespace, profile: Profile):
        self.args, self.p = args, profile
        self.device = torch.device("cpu" if profile.name == "smoke" else "cuda")
        self.dtype = getattr(torch, profile.dtype)
        self.esize = torch.empty(0, dtype=self.dtype).element_size()
        self.scale = 1.0 / math.sqrt(profile.head_dim)
        self.t0 = time.perf_counter()
        self.poisoned: str | None = None
        self.out = Path(args.out)
        self.results = {
            "benchmark": "gpu_kernels", "mode": profile.name, **environment(self.device),
            "profile": dataclasses.asdict(profile), "time_budget_s": args.time_budget_s,
            "timer": self.timer_name(), "copy_bandwidth": None,
            "decode": [], "other": [], "errors": [], "skipped": [],
        }

    # --- time

    def timer_name(self) -> str:
        if self.device.type == "cuda":
            return f"triton.testing.do_bench median (warmup {self.p.warmup_ms} ms, rep {self.p.rep_ms} ms)"
        return f"time.perf_counter median of {self.p.cpu_reps} after 1 warm-up"

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over_budget(self, share: float = 1.0) -> bool:
        return self.elapsed() >= self.args.time_budget_s * share

    def blocked(self, share: float = 1.0) -> str | None:
        """Why no new config may start (CUDA context broken, or time budget spent), else None."""
        if self.poisoned:
            return f"CUDA context unusable after an earlier error ({self.poisoned})"
        if self.over_budget(share):
            what = "time budget" if share >= 1.0 else f"decode share ({share:.0%}) of the time budget"
            return f"{what} of {self.args.time_budget_s:.0f} s spent ({self.elapsed():.0f} s)"
        return None

    def cuda_alive(self) -> bool:
        """After an error: does the device still work? (An illegal address poisons the context.)"""
        if self.device.type != "cuda":
            return True
        try:
            torch.cuda.synchronize()
            torch.zeros(1, device=self.device).add_(1).item()
            return True
        except Exception:  # noqa: BLE001
            return False

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def time_ms(self, fn) -> float:
        if self.device.type == "cuda":
            return float(do_bench(fn, warmup=self.p.warmup_ms, rep=self.p.rep_ms, return_mode="median"))
        fn()
        times = []
        for _ in range(self.p.cpu_reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    def wall_ms(self, fn, reps: int) -> float:
        """Median wall time of ``fn`` between device synchronisations (host work included)."""
        fn()
        self.sync()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    # --- bookkeeping

    def skip(self, section: str, config: dict, reason: str) -> None:
        self.results["skipped"].append({"section": section, **config, "reason": reason})
        print(f"  skip {section} {config}: {reason}", flush=True)

    def attempt(self, section: str, config: dict, body, rows: list, share: float = 1.0) -> dict | None:
        """Run ``body()`` for one config unless the budget is spent; record its row or its error."""
        reason = self.blocked(share)
        if reason:
            self.skip(section, config, reason)
            return None
        row = dict(config)
        oom = False
        try:
            row.update(body())
        except Exception as exc:  # noqa: BLE001 - every failure is recorded and the run goes on
            oom = is_oom(exc)
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            self.results["errors"].append(
                {"section": section, **config, "type": type(exc).__name__, "message": str(exc)[:2000]}
            )
            if not self.cuda_alive():
                self.poisoned = row["error"][:200]
        rows.append(row)
        if oom or self.device.type == "cuda":
            free_memory()
        print(f"  {section} {describe(row)}", flush=True)
        return row

    def random(self, *shape):
        return torch.randn(*shape, dtype=self.dtype, device=self.device)

    def kv_cache(self, num_blocks: int, block_size: int):
        return self.random(num_blocks, block_size, self.p.kv_heads, self.p.head_dim)

    # --- sections

    def run(self) -> None:
        sections = (
            ("copy_bandwidth", self.measure_copy_bandwidth), ("decode", self.run_decode),
            ("prefill", self.run_prefill), ("write_kv_cache", self.run_write), ("copy_blocks", self.run_copy),
            ("swap_blocks", self.run_swap),
        )
        for name, section in sections:
            print(f"[{self.elapsed():6.1f} s] {name}", flush=True)
            if self.poisoned:
                self.skip(name, {}, f"CUDA context unusable after an earlier error ({self.poisoned})")
                continue
            try:
                section()
            except Exception as exc:  # noqa: BLE001 - a section's own setup failing must not end the run
                self.results["errors"].append({"section": name, "type": type(exc).__name__, "message": str(exc)[:2000]})
                if not self.cuda_alive():
                    self.poisoned = f"{name}: {type(exc).__name__}: {str(exc)[:160]}"
                free_memory()
            self.write()

    def measure_copy_bandwidth(self) -> None:
        n = self.p.copy_bytes // self.esize
        src = self.random(n)
        dst = torch.empty_like(src)
        ms = self.time_ms(lambda: dst.copy_(src))
        nbytes = 2 * n * self.esize
        self.results["copy_bandwidth"] = {"bytes": nbytes, "median_ms": ms, "gbps": gbps(nbytes, ms)}
        print(f"  copy bandwidth: {gbps(nbytes, ms):.0f} GB/s ({nbytes / GIB:.0f} GiB in {ms:.3f} ms)", flush=True)

    # --- decode

    def in_region(self, batch: int, context: int) -> bool:
        return batch >= self.p.region[0] and context >= self.p.region[1]

    def run_decode(self) -> None:
        pairs = sorted(itertools.product(self.p.batches, self.p.contexts),
                       key=lambda bc: (not self.in_region(*bc), bc))  # the target region first
        for batch, context in pairs:
            configs = [{"backend": be, "batch": batch, "context": context, "block_size": bs}
                       for bs in self.p.block_sizes for be in self.p.backends]
            reason = self.blocked(DECODE_SHARE)
            if reason:
                for config in configs:
                    self.skip("decode", config, reason)
                continue
            self.decode_pair(batch, context, configs)
            free_memory()

    def decode_pair(self, batch: int, context: int, configs: list[dict]) -> None:
        try:
            data = self.decode_inputs(batch, context)
        except Exception as exc:  # noqa: BLE001
            for config in configs:
                self.results["decode"].append({**config, "error": f"inputs: {type(exc).__name__}: {str(exc)[:400]}"})
            self.results["errors"].append({"section": "decode", "batch": batch, "context": context,
                                           "type": type(exc).__name__, "message": str(exc)[:2000]})
            return
        for config in configs:
            self.attempt("decode", config, lambda c=config: self.decode_row(data, c["block_size"], c["backend"]),
                         self.results["decode"], share=DECODE_SHARE)

    def decode_inputs(self, batch: int, context: int) -> dict:
        p = self.p
        data = {"batch": batch, "context": context, "q": self.random(batch, p.heads, p.head_dim),
                "k": self.random(batch, p.kv_heads, context, p.head_dim),
                "v": self.random(batch, p.kv_heads, context, p.head_dim)}
        try:
            data.update(self.sdpa(data["q"], data["k"], data["v"]))
        except Exception as exc:  # noqa: BLE001 - the paged rows are still worth having
            data["sdpa_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            self.results["errors"].append({"section": "decode-sdpa", "batch": batch, "context": context,
                                           "type": type(exc).__name__, "message": str(exc)[:2000]})
            free_memory()
        return data

    def sdpa(self, q, k, v) -> dict:
        q4 = q.unsqueeze(2)  # [batch, heads, 1, head_dim]
        try:
            out = F.scaled_dot_product_attention(q4, k, v, scale=self.scale, enable_gqa=True)
            mode, kk, vv = "enable_gqa", k, v
        except (TypeError, RuntimeError) as exc:
            if is_oom(exc):
                raise
            group = self.p.heads // self.p.kv_heads
            kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            out = F.scaled_dot_product_attention(q4, kk, vv, scale=self.scale)
            mode = "repeat_interleave"
        kwargs = {"enable_gqa": True} if mode == "enable_gqa" else {}
        ms = self.time_ms(lambda: F.scaled_dot_product_attention(q4, kk, vv, scale=self.scale, **kwargs))
        return {"sdpa_ms": ms, "sdpa_mode": mode, "sdpa_out": out.squeeze(2)}

    def n_sets(self, kv_bytes: int) -> int:
        if kv_bytes >= self.p.rotate_bytes:
            return 1
        return max(2, min(self.p.max_sets, cdiv(self.p.rotate_bytes, kv_bytes)))

    def paged_caches(self, k, v, block_size: int, n_sets: int):
        """Random caches of ``n_sets`` regions; region 0 holds ``k``/``v`` through a permuted table."""
        batch, kv_heads, context, head_dim = k.shape
        nb = cdiv(context, block_size)
        num_blocks = n_sets * batch * nb
        tables = torch.randperm(num_blocks, device=self.device).to(torch.int32).view(n_sets, batch, nb)
        ids = tables[0].reshape(-1).long()
        caches = []
        for src in (k, v):
            cache = self.kv_cache(num_blocks, block_size)
            tokens = src.transpose(1, 2)  # [batch, context, kv_heads, head_dim]
            if context % block_size:
                blocks = cache[ids].view(batch, nb * block_size, kv_heads, head_dim)
                blocks[:, :context] = tokens
            else:
                blocks = tokens.reshape(batch, nb * block_size, kv_heads, head_dim)
            cache[ids] = blocks.reshape(batch * nb, block_size, kv_heads, head_dim)
            del blocks, tokens
            caches.append(cache)
        return caches[0], caches[1], list(tables.unbind(0))

    def decode_bytes(self, batch: int, context: int, block_size: int) -> int:
        p = self.p
        kv = 2 * batch * context * p.kv_heads * p.head_dim * self.esize
        q_and_out = 2 * batch * p.heads * p.head_dim * self.esize
        return kv + q_and_out + batch * cdiv(context, block_size) * 4 + batch * 4

    def decode_row(self, data: dict, block_size: int, backend: str) -> dict:
        batch, context, q = data["batch"], data["context"], data["q"]
        n_sets = self.n_sets(2 * data["k"].numel() * self.esize)
        kc, vc, tables = self.paged_caches(data["k"], data["v"], block_size, n_sets)
        lens = torch.full((batch,), context, dtype=torch.int32, device=self.device)

        def call(i: int):
            return kernels.paged_decode_attention(
                q, kc, vc, tables[i], lens, self.scale, backend=backend, max_context_len=context)

        turn = itertools.count()
        ms = self.time_ms(lambda: call(next(turn) % n_sets))
        nbytes = self.decode_bytes(batch, context, block_size)
        splits = choose_num_splits(batch, self.p.kv_heads, context, self.device) if backend == "triton" else None
        row = {"num_splits": splits, "n_sets": n_sets, "median_ms": ms, "bytes": nbytes, "gbps": gbps(nbytes, ms),
               "frac_copy_bw": self.frac_copy(gbps(nbytes, ms)),
               "graph_ms": self.graph_ms(lambda: call(next(turn) % n_sets)),
               "sdpa_ms": data.get("sdpa_ms"), "sdpa_mode": data.get("sdpa_mode") or data.get("sdpa_error"),
               "paged_over_sdpa": ms / data["sdpa_ms"] if data.get("sdpa_ms") else None}
        if block_size == self.ref_block_size():
            row.update(self.decode_check(call(0), data, (q, kc, vc, tables[0], lens), backend))
            if backend == "triton" and self.device.type == "cuda":
                row["ms_by_num_splits"] = self.split_sweep(q, kc, vc, tables, lens, context, n_sets)
        return row

    def split_sweep(self, q, kc, vc, tables, lens, context: int, n_sets: int) -> dict:
        """Median ms at forced split counts, to tune ``choose_num_splits`` from this one run."""
        turn = itertools.count()
        times = {}
        for splits in SWEEP_SPLITS:
            times[splits] = self.time_ms(lambda n=splits: kernels.paged_decode_attention(
                q, kc, vc, tables[next(turn) % n_sets], lens, self.scale, backend="triton",
                max_context_len=context, num_splits=n))
        return times

    def graph_ms(self, fn) -> float | str | None:
        """Per-call time of ``fn`` replayed in a CUDA graph (no host overhead, no L2 flush); GPU only."""
        if self.device.type != "cuda":
            return None
        try:
            return float(do_bench_cudagraph(fn, rep=max(20, self.p.rep_ms // 4), return_mode="median"))
        except Exception as exc:  # noqa: BLE001 - a diagnostic column: its failure does not fail the row
            torch.cuda.synchronize()
            return f"{type(exc).__name__}: {str(exc)[:120]}"

    def decode_check(self, out, data: dict, args: tuple, backend: str) -> dict:
        res = {}
        if data.get("sdpa_out") is not None:
            res["rel_err_vs_sdpa"] = rel_err(out, data["sdpa_out"])
        if backend != "torch" and data["batch"] * data["context"] <= self.p.torch_check_tokens:
            ref = kernels.paged_decode_attention(*args, self.scale, backend="torch")
            res["rel_err_vs_torch"] = rel_err(out, ref)
        errs = list(res.values())
        res["check_ok"] = all(e < CHECK_TOL for e in errs) if errs else None
        return res

    def ref_block_size(self) -> int:
        return self.p.ref_block_size if self.p.ref_block_size in self.p.block_sizes else self.p.block_sizes[0]

    def frac_copy(self, value: float | None) -> float | None:
        copy = self.results["copy_bandwidth"]
        return value / copy["gbps"] if value is not None and copy and copy.get("gbps") else None

    # --- prefill

    def run_prefill(self) -> None:
        for chunk, cached, seqs in self.p.prefill:
            for backend in self.p.backends:
                config = {"kind": "prefill", "backend": backend, "chunk": chunk, "cached": cached, "seqs": seqs,
                          "block_size": self.p.cache_block_size}
                self.attempt("prefill", config, lambda c=config: self.prefill_row(c), self.results["other"])

    def prefill_row(self, c: dict) -> dict:
        p, bs = self.p, c["block_size"]
        chunk, cached, seqs = c["chunk"], c["cached"], c["seqs"]
        seq_len = cached + chunk
        nb = cdiv(seq_len, bs)
        kc, vc = self.kv_cache(seqs * nb, bs), self.kv_cache(seqs * nb, bs)
        tables = torch.randperm(seqs * nb, device=self.device).to(torch.int32).view(seqs, nb)
        q = self.random(seqs * chunk, p.heads, p.head_dim)
        qsl = (torch.arange(seqs + 1, device=self.device) * chunk).to(torch.int32)
        seq_lens = torch.full((seqs,), seq_len, dtype=torch.int32, device=self.device)
        args = (q, kc, vc, tables, qsl, seq_lens, self.scale)
        ms = self.time_ms(lambda: kernels.paged_prefill_attention(*args, backend=c["backend"], max_query_len=chunk))
        flops = 4 * p.heads * p.head_dim * seqs * (chunk * cached + chunk * (chunk + 1) // 2)
        row = {"median_ms": ms, "flops": flops, "tflops": flops / ms / 1e9}
        if c["backend"] != "torch" and chunk * seq_len * p.heads * 4 <= p.prefill_check_bytes:
            out = kernels.paged_prefill_attention(*args, backend=c["backend"], max_query_len=chunk)
            row["rel_err"] = rel_err(out, kernels.paged_prefill_attention(*args, backend="torch"))
            row["check_ok"] = row["rel_err"] < CHECK_TOL
        return row

    # --- cache ops

    def block_bytes(self) -> int:
        return self.p.cache_block_size * self.p.kv_heads * self.p.head_dim * self.esize

    def run_write(self) -> None:
        for tokens in self.p.write_tokens:
            for backend in self.p.backends:
                config = {"kind": "write_kv_cache", "backend": backend, "tokens": tokens,
                          "block_size": self.p.cache_block_size}
                self.attempt("write_kv_cache", config, lambda c=config: self.write_row(c), self.results["other"])

    def write_row(self, c: dict) -> dict:
        p, bs, tokens = self.p, c["block_size"], c["tokens"]
        num_blocks = max(2 * cdiv(tokens, bs), 64)
        kc, vc = self.kv_cache(num_blocks, bs), self.kv_cache(num_blocks, bs)
        slots = torch.randperm(num_blocks * bs, device=self.device)[:tokens]  # int64, distinct
        key, value = self.random(tokens, p.kv_heads, p.head_dim), self.random(tokens, p.kv_heads, p.head_dim)
        ms = self.time_ms(lambda: kernels.write_kv_cache(key, value, kc, vc, slots, backend=c["backend"]))
        nbytes = 2 * 2 * key.numel() * self.esize + slots.numel() * slots.element_size()
        flat = (kc.view(-1, p.kv_heads, p.head_dim), vc.view(-1, p.kv_heads, p.head_dim))
        ok = torch.equal(flat[0][slots], key) and torch.equal(flat[1][slots], value)
        return {"median_ms": ms, "bytes": nbytes, "gbps": gbps(nbytes, ms),
                "frac_copy_bw": self.frac_copy(gbps(nbytes, ms)), "check_ok": ok}

    def run_copy(self) -> None:
        for pairs in self.p.copy_pairs:
            for backend in self.p.backends:
                config = {"kind": "copy_blocks", "backend": backend, "layers": self.p.layers, "pairs": pairs,
                          "block_size": self.p.cache_block_size}
                self.attempt("copy_blocks", config, lambda c=config: self.copy_row(c), self.results["other"])

    def copy_row(self, c: dict) -> dict:
        nbl, bs, pairs = self.p.copy_blocks_per_layer, c["block_size"], c["pairs"]
        kcs = [self.kv_cache(nbl, bs) for _ in range(c["layers"])]
        vcs = [self.kv_cache(nbl, bs) for _ in range(c["layers"])]
        ids = torch.randperm(nbl, device=self.device)[: 2 * pairs]
        src, dst = ids[:pairs], ids[pairs:]
        mapping = torch.stack([src, dst], dim=1).contiguous()
        ms = self.time_ms(lambda: kernels.copy_blocks(kcs, vcs, mapping, backend=c["backend"]))
        nbytes = 2 * pairs * 2 * c["layers"] * self.block_bytes()
        ok = all(torch.equal(cache[dst], cache[src]) for cache in (kcs[0], vcs[-1]))
        return {"median_ms": ms, "bytes": nbytes, "gbps": gbps(nbytes, ms),
                "frac_copy_bw": self.frac_copy(gbps(nbytes, ms)), "check_ok": ok}

    def run_swap(self) -> None:
        reason = self.blocked()
        if reason:
            self.skip("swap_blocks", {"blocks": self.p.swap_blocks, "layers": self.p.layers}, reason)
            return
        pin = self.device.type == "cuda"
        pool, bs = self.p.swap_pool_blocks, self.p.cache_block_size
        dev = [self.kv_cache(pool, bs) for _ in range(2 * self.p.layers)]
        host = [torch.empty(d.shape, dtype=self.dtype, pin_memory=pin) for d in dev]
        for h, d in zip(host, dev):
            h.copy_(d)  # random contents without a slow CPU random generator
        for direction, src, dst in (("gpu->cpu", dev, host), ("cpu->gpu", host, dev)):
            config = {"kind": "swap_blocks", "direction": direction, "blocks": self.p.swap_blocks,
                      "layers": self.p.layers, "block_size": bs, "pinned": pin,
                      "src_device": str(src[0].device), "dst_device": str(dst[0].device)}
            self.attempt("swap_blocks", config, lambda s=src, d=dst: self.swap_row(s, d), self.results["other"])
        del dev, host
        if pin:
            self.pinned_copy_rows()

    def swap_row(self, src: list, dst: list) -> dict:
        n = self.p.swap_blocks
        mapping = torch.stack([torch.randperm(src[0].shape[0])[:n], torch.randperm(dst[0].shape[0])[:n]], dim=1)
        ms = self.wall_ms(lambda: kernels.swap_blocks(src, dst, mapping), self.p.swap_reps)
        nbytes = n * len(src) * self.block_bytes()
        s_ids, d_ids = mapping[:, 0].to(src[0].device), mapping[:, 1].to(dst[0].device)
        ok = all(torch.equal(dst[i][d_ids].cpu(), src[i][s_ids].cpu()) for i in (0, len(src) - 1))
        return {"median_ms": ms, "bytes": nbytes, "gbps": gbps(nbytes, ms), "timer": "wall", "check_ok": ok}

    def pinned_copy_rows(self) -> None:
        """A plain pinned host<->device copy of the swap's bytes: the ceiling for swap_blocks."""
        nbytes = self.p.swap_blocks * 2 * self.p.layers * self.block_bytes()
        dev = self.random(nbytes // self.esize)
        host = torch.empty(dev.shape, dtype=self.dtype, pin_memory=True)
        for direction, fn in (("gpu->cpu", lambda: host.copy_(dev)),
                              ("cpu->gpu", lambda: dev.copy_(host, non_blocking=True))):
            config = {"kind": "pinned_copy", "direction": direction, "bytes": nbytes}
            self.attempt("pinned_copy", config, lambda f=fn: self.wall_row(f, nbytes), self.results["other"])

    def wall_row(self, fn, nbytes: int) -> dict:
        ms = self.wall_ms(fn, self.p.swap_reps)
        return {"median_ms": ms, "gbps": gbps(nbytes, ms), "timer": "wall"}

    # --- output

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.results["wall_s"] = self.elapsed()
        (self.out / "gpu_kernels.json").write_text(json.dumps(sanitize(self.results), indent=1) + "\n")
        write_csv(self.out / "gpu_kernels_decode.csv", self.results["decode"], DECODE_FIELDS)
        write_csv(self.out / "gpu_kernels_other.csv", self.results["other"], ())

    def finish(self) -> str:
        self.results["summary"] = summarize(self.results, self.p, self.ref_block_size())
        self.results["total_wall_s"] = self.elapsed()
        table = format_table(self.results, self.p)
        self.write()
        (self.out / "table.txt").write_text(table + "\n")
        return table


def environment(device) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "host": platform.node(), "triton_interpret": os.environ.get("TRITON_INTERPRET"),
           "device": str(device), "device_name": platform.processor() or "cpu"}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, cuda=torch.version.cuda, sm_count=props.multi_processor_count,
                   memory_gib=props.total_memory / GIB, l2_bytes=getattr(props, "L2_cache_size", None))
    return env


def describe(row: dict) -> str:
    hidden = ("kind", "error", "sdpa_mode", "src_device", "dst_device", "bytes", "flops", "n_sets", "timer")
    keys = [k for k in row if k not in hidden and row[k] is not None and not isinstance(row[k], float)]
    text = " ".join(f"{k}={row[k]}" for k in keys)
    for key, spec in (("median_ms", ".4f"), ("graph_ms", ".4f"), ("gbps", ".0f"), ("frac_copy_bw", ".2f"),
                      ("paged_over_sdpa", ".2f"), ("tflops", ".1f"), ("rel_err_vs_sdpa", ".1e"),
                      ("rel_err_vs_torch", ".1e"), ("rel_err", ".1e")):
        if isinstance(row.get(key), float):
            text += f" {key}={row[key]:{spec}}"
    return text + (f" ERROR {row['error'][:160]}" if row.get("error") else "")


def write_csv(path: Path, rows: list[dict], fields: tuple[str, ...]) -> None:
    names = list(fields)
    for row in rows:
        names += [k for k in row if k not in names]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=names, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


# ----------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.out is None:
        fallback = tempfile.mkdtemp(prefix="gpu_kernels_smoke_") if args.smoke else ROOT / "benchmarks" / "results"
        args.out = os.environ.get("OUT") or str(fallback)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch as _torch  # only to ask for CUDA before the kernels are imported

    if not args.smoke and not _torch.cuda.is_available():
        print("gpu_kernels: no CUDA device. This benchmark needs a GPU; use --smoke for a CPU check of the "
              "script (Triton interpreter, tiny shapes).", file=sys.stderr)
        return 2
    _import_kernels()
    torch.manual_seed(0)
    profile = SMOKE if args.smoke else (QUICK if args.quick else GPU)
    runner = Runner(args, profile)
    print(f"gpu_kernels [{profile.name}] on {runner.results['device_name']}: torch {torch.__version__}, "
          f"triton {triton.__version__}, budget {args.time_budget_s:.0f} s, out {runner.out}", flush=True)
    runner.run()
    table = runner.finish()
    print(f"\nwrote {runner.out / 'gpu_kernels.json'}, gpu_kernels_decode.csv, gpu_kernels_other.csv, table.txt\n")
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
