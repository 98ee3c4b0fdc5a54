"""``pagesim memory``: paged blocks vs contiguous max-length slabs for a mix of request lengths.

With no arguments it prints the worked example: Llama 3 8B, eight requests holding 10,578 tokens,
16-token blocks, max model length 8192 (the model's context) and 64 GB of KV cache. ``--json``
prints one JSON object instead. For a model with sliding-window layers it also breaks the cache
down by layer group (vLLM v1's hybrid KV-cache manager). All bad input surfaces as ValueError,
which the dispatcher prints as one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
import re

from pagesim.engine.catalog.kv_layout import KV_CACHE_DTYPES
from pagesim.engine.model_presets import get_model_preset
from pagesim.engine.catalog.capacity import CapacityReport, compute_capacity

DEFAULT_LENGTHS = "128,700,1500,300,2900,50,4100,900"

_BYTE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "memory",
        help="KV-cache footprint and capacity: paged blocks vs contiguous max-length slabs",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--model",
        default="llama3-8b",
        help="catalog name (pagesim presets lists them; Hugging Face ids such as "
        "meta-llama/Llama-3.1-8B-Instruct resolve) or a config.json / folder (default: %(default)s)",
    )
    parser.add_argument(
        "--lengths",
        default=DEFAULT_LENGTHS,
        help="comma-separated tokens each request holds (default: %(default)s)",
    )
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (default: 16)")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="slots a contiguous system reserves per request, at most the model's context "
        "(default: the context, max_position_embeddings: 8192 for llama3-8b, 131072 for llama3.1-8b)",
    )
    parser.add_argument("--kv-cache-dtype", default="auto", choices=[k for k in KV_CACHE_DTYPES if "32" not in k],
                        help="KV-cache element type (auto: the model's; fp8 halves a 16-bit model's bytes)")
    parser.add_argument(
        "--kv-bytes",
        default="64e9",
        help="KV-cache memory in bytes; 64e9, 64GB and 60GiB are accepted (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)
    return parser


def parse_lengths(text: str) -> list[int]:
    """Parse "128,700,1500" into ints; ValueError naming the bad item."""
    items = [item.strip() for item in str(text).split(",")]
    if items == [""]:
        raise ValueError("--lengths is empty; give comma-separated token counts like 128,700")
    lengths = []
    for index, item in enumerate(items):
        try:
            length = int(item)
        except ValueError:
            raise ValueError(
                f"--lengths item {index} is {item!r}, not an integer token count"
            ) from None
        if length <= 0:
            raise ValueError(f"--lengths item {index} is {length}; lengths must be positive")
        lengths.append(length)
    return lengths


def parse_bytes(text: str | float) -> float:
    """Parse a byte count: 64e9, 64000000000, 64GB, 60GiB (decimal and binary units)."""
    not_a_count = f"--kv-bytes {text!r} is not a byte count (try 64e9, 64GB or 60GiB)"
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _BYTE_UNITS:
        raise ValueError(not_a_count)
    try:
        number = float(match.group(1))
    except ValueError:
        raise ValueError(not_a_count) from None
    value = number * _BYTE_UNITS[unit]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"--kv-bytes must be a positive number of bytes, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    preset = get_model_preset(args.model)
    max_model_len = args.max_model_len
    if max_model_len is None:
        max_model_len = preset.max_position_embeddings
    elif max_model_len > preset.max_position_embeddings:
        raise ValueError(f"--max-model-len {max_model_len} exceeds {preset.name}'s context length "
                         f"({preset.max_position_embeddings} tokens)")
    report = compute_capacity(
        preset,
        parse_lengths(args.lengths),
        block_size=args.block_size,
        max_model_len=max_model_len,
        kv_bytes=parse_bytes(args.kv_bytes),
        kv_cache_dtype=args.kv_cache_dtype,
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report))
    return 0


def _group_lines(report: CapacityReport) -> list[str]:
    """The per-group breakdown, for a model whose cache has more than one kind of group."""
    if len(report.groups) == 1 and report.groups[0].window is None:
        return []
    lines = [f"KV-cache groups ({report.group_size} layers each, {report.block_bytes:,} bytes a block):"]
    for index, group in enumerate(report.groups):
        kind = "full attention" if group.window is None else f"sliding window {group.window:,}"
        padding = report.group_size - len(group.layers)
        layers = f"{len(group.layers)} layers" + (f" + {padding} padding" if padding else "")
        lines.append(f"  group {index}: {kind:<22} {layers:<22} {group.blocks:>8,} blocks for "
                     f"{group.tokens:,} tokens")
    return [*lines, ""]


def format_report(report: CapacityReport) -> str:
    """The human summary: per-token cost, footprints side by side, per-request detail, capacity."""
    lines = [
        f"Model              {report.model_name} (context {report.context_length:,} tokens)",
        f"KV cache per token {report.bytes_per_token:,} bytes"
        + ("" if report.kv_cache_dtype == "auto" else f" ({report.kv_cache_dtype})"),
        f"Requests           {report.num_requests} holding {report.tokens:,} tokens",
        "",
        *_group_lines(report),
        f"{'allocation':<34}{'slots':>10}{'tokens':>10}{'used':>8}",
        f"{f'contiguous, {report.contiguous_slab_slots}-slot slab each':<34}"
        f"{report.contiguous_slots:>10,}{report.tokens:>10,}{report.contiguous_utilization:>8.1%}",
        f"{f'paged, {report.block_size}-token blocks ({report.paged_blocks:,})':<34}"
        f"{report.paged_slots:>10,}{report.tokens:>10,}{report.paged_utilization:>8.1%}",
        "",
        f"{'request':>7}{'tokens':>10}{'blocks':>8}{'idle slots' + (' in last block' if len(report.groups) == 1 else ''):>26}",
    ]
    for index, request in enumerate(report.requests):
        lines.append(
            f"{index:>7}{request.length_tokens:>10,}{request.blocks:>8,}{request.idle_slots:>26}"
        )
    ratio = (
        f" ({report.paged_capacity_requests / report.contiguous_capacity_requests:.1f}x)"
        if report.contiguous_capacity_requests
        else ""
    )
    lines += [
        "",
        f"With {report.kv_bytes / 1e9:g} GB of KV cache ({report.kv_bytes:,} bytes):",
        f"  contiguous slabs fit {report.contiguous_capacity_requests:,} requests "
        f"({report.contiguous_capacity_slots:,} slots / {report.contiguous_slab_slots} per slab)",
        f"  paged blocks fit     {report.paged_capacity_requests:,} requests "
        f"({report.total_blocks:,} blocks / {report.mean_blocks_per_request:.1f} per request)"
        f"{ratio}",
    ]
    return "\n".join(lines)
