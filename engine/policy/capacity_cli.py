"""``pagesim memory``: paged blocks vs contiguous max-length slabs for a mix of request lengths.

With no arguments it prints the worked example: Llama 3 8B, eight requests holding 10,578 tokens,
16-token blocks, max model length 8192 and 64 GB of KV cache. ``--json`` prints one JSON object
instead. All bad input surfaces as ValueError, which the dispatcher prints as one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
import re

from engine.model_presets import MODEL_PRESETS, get_model_preset
from engine.policy.capacity import CapacityReport, compute_capacity

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
        help=f"preset ({', '.join(MODEL_PRESETS)}) or a Hugging Face config.json / folder "
        "(default: %(default)s)",
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
        help="slots a contiguous system reserves per request "
        "(default: the model's max_position_embeddings, 8192 for llama3-8b)",
    )
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
    report = compute_capacity(
        preset,
        parse_lengths(args.lengths),
        block_size=args.block_size,
        max_model_len=max_model_len,
        kv_bytes=parse_bytes(args.kv_bytes),
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report))
    return 0


def format_report(report: CapacityReport) -> str:
    """The human summary: per-token cost, footprints side by side, per-request detail, capacity."""
    lines = [
        f"Model              {report.model_name}",
        f"KV cache per token {report.bytes_per_token:,} bytes",
        f"Requests           {report.num_requests} holding {report.tokens:,} tokens",
        "",
        f"{'allocation':<34}{'slots':>10}{'tokens':>10}{'used':>8}",
        f"{f'contiguous, {report.max_model_len}-slot slab each':<34}"
        f"{report.contiguous_slots:>10,}{report.tokens:>10,}{report.contiguous_utilization:>8.1%}",
        f"{f'paged, {report.block_size}-token blocks ({report.paged_blocks:,})':<34}"
        f"{report.paged_slots:>10,}{report.tokens:>10,}{report.paged_utilization:>8.1%}",
        "",
        f"{'request':>7}{'tokens':>10}{'blocks':>8}{'idle slots in last block':>26}",
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
        f"({report.contiguous_capacity_slots:,} slots / {report.max_model_len} per slab)",
        f"  paged blocks fit     {report.paged_capacity_requests:,} requests "
        f"({report.total_blocks:,} blocks / {report.mean_blocks_per_request:.1f} per request)"
        f"{ratio}",
    ]
    return "\n".join(lines)
