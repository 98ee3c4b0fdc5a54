"""Replay every real vLLM run in ``../shared/groundtruth/`` through the simulator and print measured
beside predicted latency, per experiment and stage, with the median errors per model family.

    python benchmarks/bench_groundtruth.py [--groundtruth DIR] [--seed S] [-- extra replay flags]

Each experiment is ``pagesim replay EXPERIMENT --gpu h100-sxm`` (its model, tensor parallelism and
vLLM limits from its ``exp-config.yaml``; no per-experiment setting) with the server flags every
one of these runs had beyond those (``SERVER_FLAGS``): the same constants for all eight. Per token is ``(mean E2E - mean TTFT) / (output_len - 1)``, the figure the shared README
defines (inference-perf's ``time_per_output_token`` is per streamed event). The CPU seconds the
replays took are printed at the end (the target: under a minute of one core for all eight).
Skips, saying so, when the folder is absent. Not a test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GROUNDTRUTH = ROOT.parent / "shared" / "groundtruth" / "vllm-0.15.1-h100"
LABELS = {"e2e": "E2E", "ttft": "TTFT", "per_token": "per token"}
#: What the BLIS harness added to every one of these servers (its observability values, applied to
#: all its February 2026 runs: inference-sim/tektonc-data-collection,
#: tektoncsample/blis-inference-perf/values-observability.yaml, ``offloading_size: 8.0``, passed as
#: ``--kv-offloading-size``; the servers' logs show ``kv_connector='OffloadingConnector'`` with
#: ``cpu_bytes_to_use`` 8 GiB): vLLM 0.15's native CPU offloading, 8 GiB over the replica's GPUs.
#: ``--as-configured`` leaves them out (the experiments' own config files do not name them).
SERVER_FLAGS = ["--kv-offloading-size", "8", "--offload-connector", "0.15"]


def pagesim_json(argv: list[str]) -> dict:
    """The JSON a ``pagesim ... --json`` command prints, run in this process (bench_large_moe too)."""
    from pagesim.engine.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        status = main(argv)
    if status:
        raise SystemExit(f"pagesim {' '.join(argv)} exited {status}")
    return json.loads(out.getvalue())


def replay(experiment: Path, seed: int, extra: list[str]) -> dict:
    """``pagesim replay --json`` of one experiment."""
    return pagesim_json(["replay", str(experiment), "--gpu", "h100-sxm", "--json", "--no-progress", "--seed", str(seed),
                         *extra])


def rows_of(report: dict):
    for row in report["rows"]:
        name = "whole" if row["stage"] is None else f"s{row['stage']}"
        yield name, row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groundtruth", type=Path, default=DEFAULT_GROUNDTRUTH)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--as-configured", action="store_true",
                        help="without SERVER_FLAGS: only what the experiments' config files say")
    parser.add_argument("extra", nargs="*", help="flags passed to every replay (after --)")
    args = parser.parse_args()
    extra = (args.extra if args.as_configured else SERVER_FLAGS + args.extra)
    experiments = sorted(p for p in args.groundtruth.glob("*") if (p / "results" / "config.yaml").is_file())
    if not experiments:
        print(f"skipped: no inference-perf experiments under {args.groundtruth}")
        return 0
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    wall0 = time.perf_counter()
    errors: dict[str, dict[str, list[float]]] = {}
    timeouts = []
    print(f"{'experiment':<34}{'row':>6}  {'E2E mean':>19}  {'p90':>7} {'p99':>7}  {'TTFT mean':>21}  "
          f"{'p90':>7} {'p99':>7}  {'per token':>19}  {'failed (meas/pred)':>18}")
    for experiment in experiments:
        report = replay(experiment, args.seed, extra)
        family = "mixtral-8x7b" if "mixtral" in experiment.name else "llama-2-7b"
        name = experiment.name.split("-", 2)[2]
        for row_name, row in rows_of(report):
            e2e, ttft, tok = row["e2e"], row["ttft"], row["per_token"]
            counts = row["counts"]
            failed = f"{counts.get('measured', {}).get('failures', '-')}/{counts['predicted']['failures']}"
            for figure in ("e2e", "ttft", "per_token"):
                for stat, cell in row[figure].items():
                    if cell["error"] is not None:
                        errors.setdefault(family, {}).setdefault(figure, []).append(abs(cell["error"]))
                        errors.setdefault("all", {}).setdefault(figure, []).append(abs(cell["error"]))
            if "measured" in counts and counts["measured"]["failures"]:
                timeouts.append((name, row_name, counts["measured"]["failures"], counts["predicted"]["failures"]))
            print(f"{name:<34}{row_name:>6}  {_pair(e2e['mean'], 's')}  {_err(e2e['p90'])} {_err(e2e['p99'])}  "
                  f"{_pair(ttft['mean'], 'ms')}  {_err(ttft['p90'])} {_err(ttft['p99'])}  "
                  f"{_pair(tok['mean'], 'ms')}  {failed:>18}")
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    print("\nmedian absolute error over stages and whole-run rows (mean, p90, p99; per token: mean)")
    for family, figures in sorted(errors.items(), key=lambda item: item[0] == "all"):
        print(f"  {family:<14}" + "  ".join(f"{LABELS[f]} {np.median(v):6.1%} ({len(v)})" for f, v in figures.items()))
    for name, row, measured, predicted in timeouts:
        print(f"timeouts {name} {row}: {measured:,} measured, {predicted:,} predicted "
              f"({predicted / measured - 1:+.1%})")
    cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    print(f"\n{len(experiments)} experiments replayed in {cpu_s:.1f} CPU s ({time.perf_counter() - wall0:.1f} s wall)")
    return 0


def _pair(cell: dict, unit: str) -> str:
    scale = 1e3 if unit == "ms" else 1.0
    m, p = cell["measured_s"], cell["predicted_s"]
    text = f"{m * scale:.4g}/{p * scale:.4g}" if m is not None and p is not None else "-"
    return f"{text:>12} {_err(cell)}"


def _err(cell: dict) -> str:
    return f"{cell['error']:+7.1%}" if cell["error"] is not None else f"{'-':>7}"


if __name__ == "__main__":
    sys.exit(main())
