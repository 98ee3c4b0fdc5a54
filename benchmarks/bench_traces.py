"""Speed of loading and generating traces, each figure beside a baseline timed in the same run.

What is measured
----------------
1. Loading the Mooncake conversation trace (``../shared/traces/mooncake_fast25/``, 12,031 rows,
   3 MB; when the shared folder is absent, a synthetic file in the same format and of the same
   size). Target: under 1 s. Baseline: ``json.loads`` of every line and nothing else, the floor
   for any JSONL loader in Python; the ratio is what validation, columns and the CSR identities
   cost on top.
2. Loading the Azure conversation trace (shared, 19,366 rows) against ``csv.reader`` over the
   same file.
3. Generating 1M synthetic requests (``kwon2023-sharegpt``: Poisson arrivals, lognormal
   lengths). Target: under 5 s. Baseline: drawing the same random numbers with numpy alone (the
   exponential gaps and two lognormal columns); the ratio is what the trace type and its checks
   add. The sharing workloads (``shared-system-prompt``, ``multi-turn-chat``) are timed too: they
   also lay out prefix identities.
4. Loading 1M rows: the 1M-request trace written as pagesim JSONL and as an Azure-format CSV,
   each read back, against ``json.loads`` per line and ``csv.reader``. Also the memory a 1M-row
   trace holds (its arrays' bytes).

``--quick`` uses 100k requests instead of 1M (CI). Nothing is asserted: the figures are printed.
Each timing is the best of a few repeats (other processes only make a repeat slower).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pagesim.traces.generate import generate, workload_spec  # noqa: E402
from pagesim.traces.loaders import load_trace, write_jsonl  # noqa: E402
from pagesim.traces.trace import Trace  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
MOONCAKE = SHARED / "mooncake_fast25" / "conversation_trace.jsonl"
AZURE = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def json_floor(path: Path) -> None:
    with open(path) as handle:
        for line in handle:
            json.loads(line)


def csv_floor(path: Path) -> None:
    with open(path, newline="") as handle:
        for _ in csv.reader(handle):
            pass


def synthetic_mooncake(path: Path, rows: int = 12_031) -> Path:
    """A Mooncake-format file shaped like the real one (chained ids of 512 tokens)."""
    rng = np.random.default_rng(0)
    next_id = 0
    chains: list[list[int]] = []
    with open(path, "w") as out:
        for i in range(rows):
            length = int(rng.lognormal(np.log(7000), 1.0)) + 1
            blocks = -(-length // 512)
            ids: list[int] = []
            if chains and rng.random() < 0.4:
                parent = chains[rng.integers(len(chains))]
                ids = parent[: min(len(parent), blocks)]
            ids += list(range(next_id, next_id + blocks - len(ids)))
            next_id += blocks
            chains.append(ids)
            out.write(json.dumps({"timestamp": i * 294, "input_length": length,
                                  "output_length": int(rng.integers(1, 2000)), "hash_ids": ids}) + "\n")
    return path


def write_azure_csv(trace: Trace, path: Path) -> Path:
    base = np.datetime64("2023-11-16T18:15:46.6805900", "ns")
    stamps = (base + (trace.arrival_s * 1e9).astype("timedelta64[ns]")).astype(str)
    with open(path, "w") as out:
        out.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for stamp, p, o in zip(stamps.tolist(), trace.prompt_len.tolist(), trace.output_len.tolist()):
            out.write(f"{stamp.replace('T', ' ')[:27]},{p},{o}\n")
    return path


def trace_bytes(trace: Trace) -> int:
    return sum(v.nbytes for v in vars(trace).values() if isinstance(v, np.ndarray))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k requests instead of 1M (CI)")
    args = parser.parse_args()
    count = 100_000 if args.quick else 1_000_000
    repeats = 3
    rows = []

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        mooncake = MOONCAKE if MOONCAKE.exists() else synthetic_mooncake(tmp / "mooncake.jsonl")
        label = "Mooncake conversation trace" + ("" if MOONCAKE.exists() else " (synthetic stand-in)")
        loaded = best(lambda: load_trace(mooncake), repeats)
        floor = best(lambda: json_floor(mooncake), repeats)
        rows.append((f"load {label}, 12,031 rows", loaded, "json.loads per line", floor, "< 1 s"))
        if AZURE.exists():
            loaded = best(lambda: load_trace(AZURE), repeats)
            floor = best(lambda: csv_floor(AZURE), repeats)
            rows.append(("load Azure conversation trace, 19,366 rows", loaded, "csv.reader", floor, ""))

        spec = workload_spec("kwon2023-sharegpt", rate_rps=10, num_requests=count, seed=0)

        def numpy_floor():
            rng = np.random.default_rng(0)
            np.cumsum(rng.exponential(0.1, count))
            rng.lognormal(5.0, 0.8, count)
            rng.lognormal(5.7, 0.8, count)

        generated = best(lambda: generate(spec), repeats)
        floor = best(numpy_floor, repeats)
        rows.append((f"generate {count:,} kwon2023-sharegpt", generated, "numpy draws alone", floor, "< 5 s"))
        for name in ("shared-system-prompt", "multi-turn-chat"):
            other = workload_spec(name, rate_rps=10, num_requests=count, seed=0)
            rows.append((f"generate {count:,} {name}", best(lambda: generate(other), 1), "", None, ""))

        trace = generate(spec)
        jsonl = write_jsonl(trace, tmp / "big.jsonl")
        azure = write_azure_csv(trace, tmp / "big.csv")
        rows.append((f"load {count:,} rows, pagesim JSONL", best(lambda: load_trace(jsonl), 2),
                     "json.loads per line", best(lambda: json_floor(jsonl), 2), ""))
        rows.append((f"load {count:,} rows, Azure CSV", best(lambda: load_trace(azure), 2),
                     "csv.reader", best(lambda: csv_floor(azure), 2), ""))
        memory_mb = trace_bytes(trace) / 1e6

    width = max(len(r[0]) for r in rows)
    print(f"{'subject':<{width}}  {'seconds':>8}  {'baseline':<20} {'seconds':>8}  {'ratio':>6}  target")
    for subject, seconds, base_name, base_s, target in rows:
        ratio = f"{seconds / base_s:6.2f}" if base_s else "      "
        base = f"{base_s:8.3f}" if base_s else " " * 8
        print(f"{subject:<{width}}  {seconds:8.3f}  {base_name:<20} {base}  {ratio}  {target}")
    print(f"arrays of a {count:,}-request trace (no identities): {memory_mb:.1f} MB")


if __name__ == "__main__":
    main()
