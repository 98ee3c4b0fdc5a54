"""What a study found, in sentences with numbers, claiming only differences larger than noise.

Three kinds of statement, all judged by ``pagesim.reports.noise`` (intervals over seeds, or the study's
threshold without seeds):

- ``axis_findings``: for each axis the study varies (load and seed aside), the settings along it
  with everything else at the base, and per metric either the best value and how far it is from
  the next, or "no measurable difference"; a grid that varies the KV offload size is read as one
  sweep of size and offload policy instead (``pagesim.reports.offload.offload_findings``), and one
  that varies the P:D split as a sweep of split and KV link bandwidth against colocated serving
  (``pagesim.reports.pd_study.pd_findings``);
- ``best_settings``: per metric, the best setting among the runs that differ in policy only (base
  load, workload, resources, allocator), with the settings within noise of it; no single "best"
  where the best is not measurably ahead;
- ``load_findings``: per offered rate, the regime the runs are in (``pagesim.reports.load``), so a reader
  knows what the conclusions hold for.

Their pieces (settings ranked on a metric, two values compared in words, a ``Finding``, the
phrases of its head) are ``pagesim.reports.claims``'s, shared with the offload sweep's findings.
"""

from __future__ import annotations

from typing import Any

from pagesim.reports.claims import Finding, compared, or_words, rank, rate_key, regime_words, runs_words
from pagesim.reports.load import REGIMES, nominal_rps, run_load
from pagesim.reports.noise import rule_words
from pagesim.reports.offload import POLICY, SIZE, offload_findings
from pagesim.reports.pd_study import BANDWIDTH, SPLIT, pd_findings
from pagesim.reports.results import HEADLINE, METRICS, RATE_AXES, M, Setting, Study, metric, order, settings
from pagesim.reports.run_config import SEED, describe_config, value_label
from pagesim.sim.output import plain

# Not policy choices: load, workload, resources, baselines and seeds. The summary ranks only runs that
# have these at the base, so "best" never means "less traffic" or "a bigger GPU".
CONTEXT_KEYS = ("rate_scale", "rate", "workload", "n", "beam_width", "seed", "kv_cache_gb", "num_gpu_blocks",
                "gpu", "tp", "model", "allocator", "swap_space_gb", "replicas", "sample_lengths", "kv_offloading_size",
                "request_timeout_s", "gpus", "kv_link_bandwidth", "kv_link_latency_us", "gpus_per_node", "slo_ttft_s",
                "slo_tpot_s")
AXIS_METRICS = (*HEADLINE, M["memory_utilization"], M["prefix_hit_rate"], M["preemptions_total"])
AXIS_NAMES = {"block_size": "Block size", "eviction": "Eviction policy", "preemption": "Preemption mode",
              "kv_cache_gb": "KV cache size", "allocator": "Allocator", "victim": "Victim policy",
              "scheduler": "Scheduler", "policy": "Policy preset", "router": "Router", "replicas": "Replicas",
              "max_num_seqs": "max_num_seqs", "rate_scale": "Rate scale", "rate": "Request rate (requests/s)", "max_num_batched_tokens": "max_num_batched_tokens",
              "kv_offloading_size": "Offload size", "kv_offloading_policy": "Offload policy",
              "request_timeout_s": "Client timeout (s)", "pd_split": "P:D split", "gpus": "GPUs",
              "kv_link_bandwidth": "KV link bandwidth", "kv_link_latency_us": "KV link latency"}


VALUE_UNITS = {"kv_cache_gb": " GiB", "swap_space_gb": " GiB", "kv_offloading_size": " GiB",
               "kv_link_bandwidth": " GB/s", "kv_link_latency_us": " us"}


def _name(axis: str, setting: Setting) -> str:
    value = setting.config.get(axis)
    return f"{plain(value)}{VALUE_UNITS[axis]}" if value is not None and axis in VALUE_UNITS else value_label(value)


def axis_finding_items(study: Study) -> list[Finding]:
    offload = offload_findings(study)  # (the offload size and policy read as one sweep, when a grid varies the size)
    split = pd_findings(study)  # (the P:D split and the link bandwidth likewise, when a grid varies the split)
    out = []
    for axis in study.varying():
        if axis in RATE_AXES or (offload and axis in (SIZE, POLICY)) or (split and axis in (SPLIT, BANDWIDTH)):
            continue
        fixed = _anchor(study, axis)
        group = settings(study.slice(axis, **fixed))
        if len({setting.config.get(axis) for setting in group}) < 2:
            continue
        values = ", ".join(_name(axis, s) for s in sorted(group, key=lambda s: order(s.config.get(axis))))
        claims, flat = [], []
        for metric in AXIS_METRICS:
            ranking = rank(group, metric, study.threshold)
            if ranking is None:
                continue
            if ranking.all_tied:
                flat.append(metric.label)
                continue
            (best, best_e), (worst, worst_e) = ranking.scored[0], ranking.scored[-1]
            if ranking.unique:
                second, second_e = ranking.scored[1]
                claims.append(f"{metric.label} best at {_name(axis, best)} ({metric.with_unit(best_e.mean)}; "
                              f"{compared(metric, best_e.mean, second_e.mean, 'the next')}, {_name(axis, second)})")
            else:
                tied = ", ".join(_name(axis, s) for s, _ in ranking.tied)
                claims.append(f"{metric.label} best at {_name(axis, best)} ({metric.with_unit(best_e.mean)}) with "
                              f"{tied} within noise; {_name(axis, worst)} {compared(metric, worst_e.mean, best_e.mean, 'the best')} "
                              f"({metric.with_unit(worst_e.mean)})")
        if flat:
            claims.append(f"no measurable difference in {or_words(flat)}")
        records = [r for s in group for r in s.records]
        if axis == "eviction" and M["prefix_hit_rate"].label in flat:
            why = eviction_tie_words(records, study.threshold)
            if why:
                claims.append(why)
        held = "".join(f"{k}={value_label(v)}, " for k, v in fixed.items())
        head = (f"{AXIS_NAMES.get(axis, axis)} ({values}; {runs_words(len(records))} {regime_words(records)}, "
                f"{held}every other setting at the base)")
        out.append(Finding(head, claims))
    return out + offload + split


def ideal_figures(records: list[dict[str, Any]]) -> dict[str, float] | None:
    """The ideal cache's figures of these runs (``pagesim.sim.ideal_cache``, in each run's summary),
    averaged over them: ``ideal``, ``infinite`` (hit rates), ``reusable`` and ``cache`` (blocks),
    ``hit`` (the runs' own mean prefix hit rate), ``allocated`` (the cache's share allocated to
    running requests, time-averaged); ``None`` where a run lacks them (prefix caching
    off, a hybrid cache, or a run recorded by an earlier pagesim)."""
    keys = {"ideal": "ideal_hit_rate", "infinite": "infinite_cache_hit_rate", "reusable": "prefix_reusable_blocks",
            "cache": "ideal_cache_blocks", "hit": "prefix_hit_rate", "allocated": "memory_allocated_fraction"}
    values = {name: [metric(r, key) for r in records] for name, key in keys.items()}
    if not records or any(v is None for vs in values.values() for v in vs):
        return None
    return {name: sum(vs) / len(vs) for name, vs in values.items()}  # type: ignore[arg-type]


def eviction_tie_words(records: list[dict[str, Any]], threshold: float) -> str | None:
    """Why eviction policies that tie on prefix hit rate tie (``ideal_words``); ``None`` without
    the ideal cache's figures."""
    f = ideal_figures(records)
    return None if f is None else f"eviction policies tie on prefix hit rate at {ideal_words(f, threshold)}"


def ideal_words(f: dict[str, float], threshold: float, got: str | None = None) -> str:
    """What the policies got (``got``, default ``f["hit"]``) against the best any eviction policy
    could do at this cache size and a cache that never evicts, and what the gap means, from
    ``ideal_figures``' ``f``. ``threshold``: the study's, in points for a rate."""
    rate = M["prefix_hit_rate"].with_unit
    reusable, cache = int(round(f["reusable"])), int(round(f["cache"]))
    bound = (f"{got or rate(f['hit'])} of prompt tokens, where the best any policy could do at this cache size is "
             f"{rate(f['ideal'])} (Belady's MIN over the trace) and a cache that never evicts gets {rate(f['infinite'])}")
    if f["infinite"] <= threshold:
        why = "the trace offers almost no prefix reuse, so no eviction order can matter"
    elif f["infinite"] - f["hit"] <= threshold:
        room = (f"its {reusable:,} reusable blocks fit in the cache's {cache:,}" if reusable <= cache else
                f"its reuse comes soon enough for the cache's {cache:,} blocks to hold it")
        why = f"nearly every hit the trace offers is taken: {room}, so eviction order cannot matter"
    elif f["ideal"] - f["hit"] <= threshold:
        why = (f"even a perfect policy gains nothing: the {reusable:,} reusable blocks are {plain(reusable / cache, 2)}x "
               f"the cache's {cache:,} and too far apart to keep")
    else:
        why = (f"the {plain((f['ideal'] - f['hit']) * 100, 2)} points between are running requests' memory ("
               f"{rate(f['allocated'])} of the cache allocated to them on average, room the ideal cache keeps; "
               f"{reusable:,} reusable blocks against {cache:,} in the cache) and what no policy tried finds")
    return f"{bound}; {why}"


def _anchor(study: Study, axis: str) -> dict[str, Any]:
    """Where to compare ``axis``: at the base, except for the other axes of a grid that varies it
    whose values never include the base's (a grid of preemption [recompute, swap] x block size
    compares block sizes at preemption=recompute)."""
    if len({r["config"].get(axis) for r in study.slice(axis)}) >= 2:
        return {}
    for grid, _ in study.grids():
        if axis in grid and len(grid[axis]) > 1:
            return {k: v[0] for k, v in grid.items()
                    if k not in (axis, SEED) and study.base.get(k) not in v}
    return {}


def axis_findings(study: Study) -> list[str]:
    return [f.sentence for f in axis_finding_items(study)]


def comparable(study: Study) -> list[dict[str, Any]]:
    """OK runs at the base load, workload, resources, allocator: they differ in policy (and seed) only."""
    base = {**study.base, **study.anchor()}
    return [r for r in study.ok if all(r["config"].get(k) == base.get(k) for k in CONTEXT_KEYS if k != SEED)]


def best_settings(study: Study) -> list[dict[str, Any]]:
    """Per metric: the best setting and the verdict ("best", "tied with k", "no measurable difference")."""
    group = settings(comparable(study))
    rows = []
    for metric in METRICS:
        ranking = rank(group, metric, study.threshold)
        if ranking is None:
            continue
        best, est = ranking.scored[0]
        n = len(ranking.scored)
        if ranking.all_tied:
            verdict, setting = f"no measurable difference among the {n} settings", "-"
        elif ranking.unique:
            second_e = ranking.scored[1][1]
            verdict = f"best, {compared(metric, est.mean, second_e.mean, 'the next')}"
            setting = describe_config(best.config, study.base, seed=False)
        else:
            verdict = f"best with {len(ranking.tied)} other setting(s) within noise"
            setting = describe_config(best.config, study.base, seed=False)
        rows.append({"metric": metric.label, "value": metric.with_unit(est.mean, est.half_width),
                     "better": "higher" if metric.better == "max" else "lower", "setting": setting, "verdict": verdict})
    return rows


def _rate_words(key: float | None, records: list[dict[str, Any]]) -> str:
    """E.g. "5 requests/s (4.66-6.01 offered as drawn)"."""
    if key is None:
        return "an unknown rate"
    offered = sorted({round(o, 2) for r in records if (o := run_load(r).offered_rps)})
    if not offered or nominal_rps(records[0]) is None:
        return f"{plain(key, 3)} requests/s"
    drawn = plain(offered[0], 3) if len(offered) == 1 else f"{plain(offered[0], 3)}-{plain(offered[-1], 3)}"
    return f"{plain(key, 3)} requests/s ({drawn} offered as drawn)"


def load_findings(study: Study) -> list[str]:
    """Per request rate: how many runs are below, near or past saturation."""
    by_rate: dict[float | None, list[dict[str, Any]]] = {}
    for r in study.ok:
        by_rate.setdefault(rate_key(r), []).append(r)
    lines = []
    for key in sorted(by_rate, key=lambda x: (x is None, x or 0.0)):
        records = by_rate[key]
        counts = {k: v for k in REGIMES if (v := sum(run_load(r).regime == k for r in records))}
        what = ", ".join(f"{v} {k} saturation" if k != "unknown" else f"{v} unknown" for k, v in counts.items())
        lines.append(f"At {_rate_words(key, records)}: {what} ({runs_words(len(records))}).")
    return lines


def outline(study: Study) -> list[tuple[int, str]]:
    """The findings as (level, text): level 0 a statement, level 1 one claim under its axis; what
    ``pagesim study`` and ``demo`` print and the report's Findings page shows."""
    items = axis_finding_items(study)
    out = [(0, line) for line in load_findings(study)]
    for item in items:
        out.append((0, item.head + ":"))
        out += [(1, claim) for claim in item.claims]
    out += [(0, line) for line in _closing(study)]
    return out


def outline_lines(study: Study, width: int | None = None) -> list[str]:
    """``outline`` as text lines ("- " statements, "    • " claims), wrapped at ``width`` if given."""
    import textwrap

    lines = []
    for level, text in outline(study):
        first, rest = ("- ", "  ") if level == 0 else ("    • ", "      ")
        lines += textwrap.wrap(first + text, width, subsequent_indent=rest) if width else [first + text]
    return lines


def findings(study: Study) -> list[str]:
    """The sentences ``pagesim study`` and ``pagesim demo`` print and the summary page shows."""
    return load_findings(study) + axis_findings(study) + _closing(study)


def seeds_change_nothing(study: Study) -> bool:
    """A seeded study whose seeds gave identical headline metrics for every setting (a trace
    replayed at its own or rescaled timestamps draws nothing from the seed)."""
    repeated = [s for s in settings(study.ok) if len(s.records) > 1]
    return bool(repeated) and all(len({metric(r, m.key) for r in s.records}) == 1 for s in repeated for m in HEADLINE)


def noise_rule(study: Study) -> str:
    """The rule this study's comparisons rest on, in words."""
    if study.seeded and seeds_change_nothing(study):
        return (f"the threshold, as the seeds changed nothing (every setting's runs are identical: this source draws "
                f"nothing from the seed): differences up to {study.threshold:.0%} (relative; percentage points for "
                "rates) count as no measurable difference")
    return rule_words(study.seeded, study.threshold)


def _closing(study: Study) -> list[str]:
    lines = ["Differences judged with " + noise_rule(study) + "."]
    if study.failed:
        lines.append(f"{len(study.failed)} run(s) failed; the report lists them.")
    return lines
