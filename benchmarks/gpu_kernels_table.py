"""The summary of a ``gpu_kernels`` run: targets met or not, and the short table printed last.

Pure functions of the results dict that ``benchmarks/gpu_kernels.py`` writes (``gpu_kernels.json``),
so a saved run can be re-summarised without a GPU.
"""

from __future__ import annotations

import statistics

TARGET_FRACTION = 0.70
TARGET_SDPA_RATIO = 1.10

def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, spec: str = ".2f", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def decode_ok_rows(results: dict, backend: str = "triton") -> list[dict]:
    return [r for r in results["decode"] if r.get("backend") == backend and r.get("median_ms") is not None
            and not r.get("error")]


def summarize(results: dict, p, ref_bs: int) -> dict:
    rows = decode_ok_rows(results)
    region = [r for r in rows if r["batch"] >= p.region[0] and r["context"] >= p.region[1]]
    per_bs = {}
    for bs in p.block_sizes:
        sel = [r for r in region if r["block_size"] == bs]
        fracs = [r["frac_copy_bw"] for r in sel if r.get("frac_copy_bw") is not None]
        ratios = [r["paged_over_sdpa"] for r in sel if r.get("paged_over_sdpa") is not None]
        per_bs[bs] = {"n": len(sel), "median_frac": median_or_none(fracs), "min_frac": min(fracs, default=None),
                      "median_ratio": median_or_none(ratios), "max_ratio": max(ratios, default=None)}
    ref = per_bs.get(ref_bs, {})
    times = {(r["batch"], r["context"], r["block_size"]): r["median_ms"] for r in region}
    cost = {}
    for bs in (8, 16, 128):
        rel = [ms / times[(b, c, ref_bs)] for (b, c, s), ms in times.items() if s == bs and (b, c, ref_bs) in times]
        cost[bs] = median_or_none(rel)
    checks = [r.get("check_ok") for r in results["decode"] + results["other"] if r.get("check_ok") is not None]
    return {
        "region": {"min_batch": p.region[0], "min_context": p.region[1], "block_size": ref_bs},
        "per_block_size": per_bs,
        "target_fraction_met": verdict(ref.get("min_frac"), lambda v: v >= TARGET_FRACTION),
        "target_sdpa_met": verdict(ref.get("max_ratio"), lambda v: v <= TARGET_SDPA_RATIO),
        "block_size_cost": cost,
        "checks_passed": sum(bool(c) for c in checks), "checks": len(checks),
        "errors": len(results["errors"]), "skipped": len(results["skipped"]),
    }


def verdict(value, test) -> str:
    return "n/a" if value is None else ("MET" if test(value) else "NOT MET")


def format_table(results: dict, p) -> str:
    s = results["summary"]
    copy = results.get("copy_bandwidth") or {}
    lines = [f"== gpu_kernels [{p.name}] {results.get('device_name')} | copy BW {fmt(copy.get('gbps'), '.0f')} GB/s | "
             f"torch {results['torch']} triton {results['triton']} | {results['total_wall_s']:.0f} s =="]
    if p.name == "smoke":
        lines.append("(smoke: CPU, Triton interpreter, tiny shapes -- the figures below mean nothing)")
    reg = s["region"]
    lines.append(f"decode (triton) at batch>={reg['min_batch']} & ctx>={reg['min_context']}, per block size:")
    lines.append(f"  {'block':>5} {'n':>3} {'frac copy BW med':>16} {'min':>5} {'paged/SDPA med':>14} {'max':>5}")
    for bs, d in s["per_block_size"].items():
        lines.append(f"  {bs:>5} {d['n']:>3} {fmt(d['median_frac']):>16} {fmt(d['min_frac']):>5} "
                     f"{fmt(d['median_ratio']):>14} {fmt(d['max_ratio']):>5}")
    lines += compact_decode_table(results, p, reg["block_size"])
    lines += other_lines(results)
    cost = s["block_size_cost"]
    ref = s["per_block_size"].get(reg["block_size"], {})
    lines.append(f"checks: {s['checks_passed']}/{s['checks']} passed | errors: {s['errors']} | skipped: {s['skipped']}")
    lines.append(
        f"targets: decode >={TARGET_FRACTION:.0%} of copy BW at ctx>={reg['min_context']}, batch>={reg['min_batch']}: "
        f"{s['target_fraction_met']} (bs{reg['block_size']} min {fmt(ref.get('min_frac'))}, "
        f"median {fmt(ref.get('median_frac'))}); within {TARGET_SDPA_RATIO - 1:.0%} of SDPA: {s['target_sdpa_met']} "
        f"(max {fmt(ref.get('max_ratio'))}, median {fmt(ref.get('median_ratio'))}); block size cost: time at "
        f"bs8/bs16/bs128 relative to bs16: {fmt(cost.get(8))}/{fmt(cost.get(16))}/{fmt(cost.get(128))}"
    )
    return "\n".join(lines)


def compact_decode_table(results: dict, p, bs: int) -> list[str]:
    cells = {(r["batch"], r["context"]): r.get("frac_copy_bw") for r in decode_ok_rows(results) if r["block_size"] == bs}
    lines = [f"decode (triton), block size {bs}: fraction of copy BW (rows batch, columns context)",
             "  " + f"{'batch':>6}" + "".join(f"{c:>8}" for c in p.contexts)]
    for b in p.batches:
        lines.append("  " + f"{b:>6}" + "".join(f"{fmt(cells.get((b, c))):>8}" for c in p.contexts))
    return lines


def other_lines(results: dict) -> list[str]:
    by_kind: dict[str, list[str]] = {}
    for r in results["other"]:
        if r.get("error") or r.get("median_ms") is None or r.get("backend", "triton") != "triton":
            continue
        if r["kind"] == "prefill":
            label, value = f"{r['chunk']}+{r['cached']}x{r['seqs']}", f"{r['tflops']:.1f}TF"
        elif r["kind"] == "write_kv_cache":
            label, value = f"{r['tokens']}t", f"{r['gbps']:.0f}GB/s"
        elif r["kind"] == "copy_blocks":
            label, value = f"{r['layers']}Lx{r['pairs']}p", f"{r['gbps']:.0f}GB/s"
        else:
            label, value = r["direction"], f"{r['gbps']:.1f}GB/s"
        by_kind.setdefault(r["kind"], []).append(f"{label} {value}")
    names = {"prefill": "prefill chunk+cached x seqs", "write_kv_cache": "write_kv_cache", "copy_blocks": "copy_blocks",
             "swap_blocks": "swap_blocks", "pinned_copy": "pinned copy (ceiling for swap)"}
    return [f"{names.get(k, k)}: " + ", ".join(v) for k, v in by_kind.items()]
