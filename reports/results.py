"""Reading a finished (or partly finished) study: its records, slices of them, and what they say.

A slice varies some axes and holds every other setting at the study's base value, so a figure of
"throughput vs block size" compares runs that differ in block size only. ``best_settings`` picks the
best run per metric; ``findings`` turns the study into the few sentences ``pagesim demo`` prints
and the report's summary page opens with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reports.store import ResultsStore

NEGLIGIBLE = 0.01  # a relative difference (or share-points) below this is reported as no difference

# metric key in the summary (dotted), label, unit, better ("max" | "min")
METRICS = (
    ("throughput_tokens_s", "throughput", "tokens/s", "max"),
    ("goodput_rps", "goodput (SLO met)", "requests/s", "max"),
    ("ttft_s.p99", "TTFT p99", "s", "min"),
    ("tpot_s.p99", "TPOT p99", "s", "min"),
    ("normalized_latency_s_per_token", "normalized latency", "s/token", "min"),
    ("memory_utilization", "KV memory utilization", "fraction", "max"),
    ("prefix_hit_rate", "prefix hit rate", "fraction", "max"),
    ("preemptions_total", "preemptions", "count", "min"),
)


@dataclass
class Study:
    out_dir: Path
    meta: dict[str, Any]  # study.json
    records: list[dict[str, Any]]  # in the study's run order; missing runs absent

    @property
    def ok(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["status"] == "ok"]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["status"] != "ok"]

    @property
    def base(self) -> dict[str, Any]:
        return self.meta["base"]

    def axes(self) -> dict[str, list]:
        return self.meta["axes"]

    def slice(self, *vary: str, **fixed: Any) -> list[dict[str, Any]]:
        """OK runs that differ from the base only in ``vary`` (other keys at base, or as ``fixed``)."""
        want = {**self.base, **fixed}
        out = []
        for r in self.ok:
            config = r["config"]
            if all(config.get(k) == v for k, v in want.items() if k not in vary):
                out.append(r)
        return out

    def varies(self, axis: str) -> bool:
        return len(self.axes().get(axis, [])) > 1


def load_study(out_dir: str | Path) -> Study:
    out = Path(out_dir)
    meta_path = out / "study.json"
    if not meta_path.exists():
        raise ValueError(f"{out} is not a study folder (no study.json; run `pagesim study SPEC -o {out}` first)")
    try:
        meta = json.loads(meta_path.read_text())
        meta["run_ids"], meta["base"], meta["axes"], meta["source"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{meta_path}: not a study description ({exc}); rerun the study to rewrite it") from None
    records = ResultsStore(out / "results.jsonl").load(repair=False)
    ordered = [records[i] for i in meta["run_ids"] if i in records]
    return Study(out, meta, ordered)


def metric(record: dict[str, Any], key: str) -> float | None:
    summary = record.get("summary") or {}
    if key == "preemptions_total":
        pre = summary.get("preemptions") or {}
        return float(sum(pre.values())) if pre else 0.0
    value: Any = summary
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def describe_config(config: dict[str, Any], base: dict[str, Any]) -> str:
    """The settings that distinguish a run from the study's base (or "base settings")."""
    diff = [f"{k}={v}" for k, v in config.items() if k != "source" and k in base and base[k] != v]
    return ", ".join(diff) or "base settings"


# Not policy choices: load, workload, resources, baselines and seeds. The summary ranks only runs that
# have these at the base, so "best" never means "less traffic" or "a bigger GPU".
CONTEXT_KEYS = ("rate_scale", "rate", "workload", "n", "beam_width", "seed", "kv_cache_gb", "num_gpu_blocks",
                "gpu", "tp", "model", "allocator", "swap_space_gb", "replicas", "sample_lengths")


def comparable(study: Study) -> list[dict[str, Any]]:
    """OK runs at the base load, workload, resources, allocator and seed: they differ in policy only."""
    base = study.base
    return [r for r in study.ok if all(r["config"].get(k) == base.get(k) for k in CONTEXT_KEYS)]


def best_settings(study: Study) -> list[dict[str, Any]]:
    rows = []
    for key, label, unit, better in METRICS:
        scored = [(metric(r, key), r) for r in comparable(study)]
        scored = [(v, r) for v, r in scored if v is not None]
        if not scored:
            continue
        value, record = (max if better == "max" else min)(scored, key=lambda vr: vr[0])
        rows.append({"metric": label, "unit": unit, "better": better, "value": value,
                     "setting": describe_config(record["config"], study.base), "id": record["id"]})
    return rows


def _mean_by(records: list[dict[str, Any]], axis: str, key: str) -> dict[Any, float]:
    groups: dict[Any, list[float]] = {}
    for r in records:
        v = metric(r, key)
        if v is not None and r["config"][axis] is not None:  # None: the preset's default, named elsewhere
            groups.setdefault(r["config"][axis], []).append(v)
    return {k: sum(v) / len(v) for k, v in groups.items()}


def findings(study: Study) -> list[str]:
    """Plain sentences of what the study found, for the terminal and the summary page."""
    lines = []
    by_bs = _mean_by(study.slice("block_size"), "block_size", "throughput_tokens_s")
    if len(by_bs) > 1:
        best = max(by_bs, key=by_bs.get)
        worst = min(by_bs, key=by_bs.get)
        gain = by_bs[best] / by_bs[worst] - 1
        if gain < NEGLIGIBLE:
            lines.append(f"Block size hardly matters here: throughput within {gain:.1%} across "
                         f"{', '.join(map(str, sorted(by_bs)))}.")
        else:
            lines.append(f"Block size {best} gives the highest throughput ({by_bs[best]:,.0f} tokens/s), "
                         f"{gain:.1%} above block size {worst}.")
    modes = study.slice("preemption", "block_size")
    # compare modes over the block sizes every mode has
    sizes = set.intersection(*({r["config"]["block_size"] for r in modes if r["config"]["preemption"] == m}
                               for m in {r["config"]["preemption"] for r in modes})) if modes else set()
    modes = [r for r in modes if r["config"]["block_size"] in sizes]
    thr = _mean_by(modes, "preemption", "throughput_tokens_s")
    ttft = _mean_by(modes, "preemption", "ttft_s.p99")
    if len(thr) > 1:
        ordered = sorted(thr, key=thr.get, reverse=True)
        a, b = ordered[0], ordered[-1]
        faster = min(ttft, key=ttft.get) if ttft else None
        lines.append(f"Preemption by {a} gives more throughput than {b} ({thr[a]:,.0f} vs {thr[b]:,.0f} tokens/s); "
                     f"TTFT p99 is {ttft.get(a, float('nan')):.2f} vs {ttft.get(b, float('nan')):.2f} s"
                     + (f", lower with {faster}" if faster else "") + " (means over block sizes).")
    hits = _mean_by(study.slice("eviction", "kv_cache_gb"), "eviction", "prefix_hit_rate")
    if len(hits) > 1:
        best = max(hits, key=hits.get)
        spread = hits[best] - min(hits.values())
        others = ", ".join(f"{k} {v:.1%}" for k, v in sorted(hits.items()) if k != best)
        if spread < NEGLIGIBLE:
            lines.append(f"Eviction policies barely differ here: prefix hit rates within {spread:.1%} points "
                         f"({best} {hits[best]:.1%}, {others}; mean over cache sizes).")
        else:
            lines.append(f"Eviction policy {best} keeps the most prefix hits ({hits[best]:.1%} mean over cache "
                         f"sizes; {others}).")
    alloc = _mean_by(study.slice("allocator"), "allocator", "memory_utilization")
    if "paged" in alloc and len(alloc) > 1:
        others = ", ".join(f"Orca {k} {v:.0%}" for k, v in alloc.items() if k != "paged")
        lines.append(f"Paging keeps {alloc['paged']:.0%} of allocated KV memory holding tokens ({others}).")
    if study.failed:
        lines.append(f"{len(study.failed)} run(s) failed; the report lists them.")
    return lines
