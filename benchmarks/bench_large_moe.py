"""Simulate every setup of ``../shared/groundtruth/large-moe-public.md`` (published vLLM and SGLang
runs of Qwen3-235B-A22B and DeepSeek-R1 on 4-8 Hopper GPUs) and print measured, simulated and
their ratio for TPOT and throughput.

    python benchmarks/bench_large_moe.py [--groundtruth FILE] [-- extra simulate flags]

Each setup is one ``pagesim simulate`` with the run's own settings and nothing tuned per setup:
the measured figures are read from the shared file (never committed), the flags that rebuild each
run are below. Qwen3's runs did not force output lengths, so total tokens/s is the fairer
throughput (the file says so); DeepSeek's were made with SGLang, whose kernels differ from vLLM's
(the per-step cost is what is compared) and whose ``--disable-radix-cache`` and
``--chunked-prefill-size 32768`` become ``--no-enable-prefix-caching --max-num-batched-tokens
32768``. Skips, saying so, when the file is absent. Not a test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from bench_groundtruth import pagesim_json  # (this script's folder is on the path when it runs)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GROUNDTRUTH = ROOT.parent / "shared" / "groundtruth" / "large-moe-public.md"

_QWEN = ["--policy", "vllm-v1", "--model", "qwen3-235b-a22b", "--gpu", "h100-sxm", "--dataset-name", "random",
         "--rate", "inf", "--max-num-seqs", "1024"]
_DEEPSEEK = ["--policy", "vllm-v1", "--model", "deepseek-r1", "--gpu", "h200", "--tp", "8", "--dataset-name", "random",
             "--no-enable-prefix-caching", "--max-num-batched-tokens", "32768"]


def _qwen(tp: int, fp8: bool, lengths: tuple[int, int], prompts: int = 500) -> list[str]:
    flags = [*_QWEN, "--tp", str(tp), "--num-prompts", str(prompts), "--random-input-len", str(lengths[0]),
             "--random-output-len", str(lengths[1])]
    return flags + (["--dtype", "fp8", "--max-num-batched-tokens", "16384"] if fp8 else
                    ["--max-num-batched-tokens", "8192"])


def _deepseek(concurrency: int, lengths: tuple[int, int] = (1024, 1024)) -> list[str]:
    return [*_DEEPSEEK, "--max-concurrency", str(concurrency), "--num-prompts", str(5 * concurrency),
            "--random-input-len", str(lengths[0]), "--random-output-len", str(lengths[1])]


#: (section word, the row's first cells as the file writes them, label, pagesim flags)
SETUPS = [
    ("Qwen3", ("8x H100, `-tp 8`, BF16", "4000 / 200"), "qwen3-235b tp8 bf16 4000/200", _qwen(8, False, (4000, 200))),
    ("Qwen3", ("8x H100, `-tp 8`, BF16", "2000 / 100"), "qwen3-235b tp8 bf16 2000/100", _qwen(8, False, (2000, 100))),
    ("Qwen3", ("8x H100, `-tp 8`, BF16", "32000 / 100"), "qwen3-235b tp8 bf16 32000/100",
     _qwen(8, False, (32000, 100), prompts=100)),
    ("Qwen3", ("4x H100, `-tp 4`, FP8 checkpoint, `--max-num-batched-tokens 16384`", "4000 / 200"),
     "qwen3-235b tp4 fp8 4000/200", _qwen(4, True, (4000, 200))),
    ("Qwen3", ("4x H100, `-tp 4`, FP8, `--max-num-batched-tokens 16384`", "2000 / 100"),
     "qwen3-235b tp4 fp8 2000/100", _qwen(4, True, (2000, 100))),
    ("DeepSeek", ("8",), "deepseek-r1 h200 c8", _deepseek(8)),
    ("DeepSeek", ("16",), "deepseek-r1 h200 c16", _deepseek(16)),
    ("DeepSeek", ("32",), "deepseek-r1 h200 c32", _deepseek(32)),
    ("DeepSeek", ("64",), "deepseek-r1 h200 c64", _deepseek(64)),
    ("DeepSeek", ("4 (1024 in / 8192 out)",), "deepseek-r1 h200 c4 1k/8k", _deepseek(4, (1024, 8192))),
    ("DeepSeek", ("4 (8192 in / 1024 out)",), "deepseek-r1 h200 c4 8k/1k", _deepseek(4, (8192, 1024))),
]


def measured_rows(text: str) -> list[tuple[str, list[str]]]:
    """Every table row of the file: (its section's first word, its cells as written)."""
    rows = []
    section = ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].split("-")[0].strip()
        elif line.startswith("|") and not set(line) <= set("|-: "):
            rows.append((section, [c.strip() for c in line.strip().strip("|").split("|")]))
    return rows


def find(rows: list[tuple[str, list[str]]], section: str, first: tuple[str, ...]) -> list[str] | None:
    """The first row of ``section`` whose leading cells are ``first``."""
    return next((cells for name, cells in rows if name.startswith(section) and tuple(cells[:len(first)]) == first),
                None)


def number(cell: str) -> float:
    return float(re.sub(r"[^0-9.]", "", cell))


def simulate(flags: list[str], extra: list[str]) -> dict:
    """``pagesim simulate --json`` in this process."""
    return pagesim_json(["simulate", *flags, *extra, "--seed", "0", "--json", "--no-progress"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groundtruth", type=Path, default=DEFAULT_GROUNDTRUTH)
    parser.add_argument("extra", nargs="*", help="flags passed to every simulate (after --)")
    args = parser.parse_args()
    if not args.groundtruth.is_file():
        print(f"skipped: {args.groundtruth} is absent")
        return 0
    rows = measured_rows(args.groundtruth.read_text())
    wall0 = time.perf_counter()
    print(f"{'setup':<32} {'TPOT ms meas/sim':>19} {'ratio':>6}   {'throughput tok/s meas/sim':>27} {'ratio':>6}")
    ratios = []
    for section, first, label, flags in SETUPS:
        row = find(rows, section, first)
        if row is None:
            print(f"{label:<32} not in {args.groundtruth.name}; skipped")
            continue
        result = simulate(flags, args.extra)
        sim_tpot = result["tpot_s"]["mean"] * 1e3
        if section == "Qwen3":  # total tok/s, mean TPOT
            meas_tput, meas_tpot = number(row[2]), number(row[4])
            sim_tput, kind = result["throughput_total_tokens_s"], "total"
        else:  # mean TPOT, output tok/s
            meas_tpot, meas_tput = number(row[1]), number(row[2])
            sim_tput, kind = result["generated_tokens"] / result["duration_s"], "output"
        r_tpot, r_tput = sim_tpot / meas_tpot, sim_tput / meas_tput
        ratios += [r_tpot, r_tput]
        print(f"{label:<32} {meas_tpot:8.2f} /{sim_tpot:8.2f} {r_tpot:6.2f}   "
              f"{kind:>6} {meas_tput:9,.0f} /{sim_tput:9,.0f} {r_tput:6.2f}")
    if ratios:
        inside = sum(0.8 <= r <= 1.25 for r in ratios)
        print(f"\n{inside} of {len(ratios)} ratios within 0.8-1.25 (min {min(ratios):.2f}, max {max(ratios):.2f}); "
              f"{time.perf_counter() - wall0:.1f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
