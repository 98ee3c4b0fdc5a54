"""Reading a finished (or partly finished) study: its records, its settings, slices and grids.

- A **run** is one record (one config, one seed). A **setting** is a config without its seed: a
  study that lists seeds has several runs per setting, and reports each metric of a setting as
  their mean with a 95% interval (``pagesim.reports.noise``).
- A **slice** varies some axes and holds every other setting at the study's base value (seeds
  all kept), so a figure of "throughput vs block size" compares runs that differ in block size only.
- A **grid** is one ``[[grid]]`` table of the spec with the runs it made; the report draws every
  grid whole (heatmaps, small multiples), so no run is only in the all-runs table.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagesim.reports.noise import DEFAULT_THRESHOLD, Estimate, estimate
from pagesim.reports.run_config import SEED, moot_settings, offloading, run_id, value_label
from pagesim.reports.spec import StudySpec
from pagesim.reports.store import ResultsStore

RATE_AXES = ("rate_scale", "rate")  # load axes: plotted as curves over request rate


@dataclass(frozen=True)
class Metric:
    key: str  # dotted path into a run's summary (``metric``)
    label: str
    unit: str  # "fraction" values are shown as percentages
    better: str  # "max" | "min"

    @property
    def fraction(self) -> bool:
        return self.unit == "fraction"

    def format(self, value: float | None, half_width: float | None = None) -> str:
        if value is None:
            return "-"
        if self.fraction:
            text = f"{value:.1%}"
            return text + (f" ± {half_width * 100:.1f}" if half_width else "")
        digits = 0 if self.unit == "count" and value == int(value) else _digits(value)
        text = f"{value:,.{digits}f}"
        return text + (f" ± {half_width:,.{digits}f}" if half_width else "")

    def with_unit(self, value: float | None, half_width: float | None = None) -> str:
        text = self.format(value, half_width)
        return text if self.fraction or value is None or self.unit == "count" else f"{text} {self.unit}"


def _digits(value: float) -> int:
    """Decimals that show 3-4 significant figures of ``value`` without exponent notation."""
    magnitude = abs(value)
    if magnitude >= 100 or magnitude == 0:
        return 0 if magnitude >= 100 or value == int(value) else 2
    if magnitude >= 1:
        return 2
    return min(6, 2 - int(math.floor(math.log10(magnitude))))


M = {m.key: m for m in (
    Metric("throughput_tokens_s", "throughput", "tokens/s", "max"),
    Metric("throughput_rps", "request throughput", "requests/s", "max"),
    Metric("goodput_rps", "goodput (SLO met)", "requests/s", "max"),
    Metric("ttft_s.p50", "TTFT p50", "s", "min"),
    Metric("ttft_s.p99", "TTFT p99", "s", "min"),
    Metric("tpot_s.p50", "TPOT p50", "s", "min"),
    Metric("tpot_s.p99", "TPOT p99", "s", "min"),
    Metric("e2e_s.p50", "E2E p50", "s", "min"),
    Metric("e2e_s.p99", "E2E p99", "s", "min"),
    Metric("normalized_latency_s_per_token", "normalized latency", "s/token", "min"),
    # (a share of the *allocated* slots, not of the cache: 99% is no full cache; the cache's share allocated is next)
    Metric("memory_utilization", "allocated KV slots holding tokens", "fraction", "max"),
    Metric("memory_allocated_fraction", "KV cache allocated", "fraction", "max"),
    Metric("prefix_hit_rate", "prefix hit rate", "fraction", "max"),
    Metric("preemptions_total", "preemptions", "count", "min"),
    Metric("ttft_s.mean", "TTFT mean", "s", "min"),
    # KV offloading's tiers (``OFFLOAD_OFF``: a run without a store): hits over admitted prompt tokens, the host link
    Metric("hbm_hit_rate", "HBM prefix hit rate", "fraction", "max"),
    Metric("offload_hit_rate", "CPU (offload) hit rate", "fraction", "max"),
    Metric("host_link_busy_fraction", "host link busy", "fraction", "min"),
    # per GPU (every run's summary: its figure over the GPUs it used), the share of requests that met the SLO, and
    # the TPOT mean: what a P:D split is judged by against colocated serving (pagesim.reports.pd_study)
    Metric("goodput_rps_per_gpu", "goodput per GPU", "requests/s per GPU", "max"),
    Metric("throughput_tokens_s_per_gpu", "throughput per GPU", "tokens/s per GPU", "max"),
    Metric("slo.attained", "SLO attained", "fraction", "max"),
    Metric("tpot_s.mean", "TPOT mean", "s", "min"),
)}
# The summary's best-per-metric table, and the metrics findings compare.
METRICS = tuple(M[k] for k in ("throughput_tokens_s", "goodput_rps", "ttft_s.p99", "tpot_s.p99", "e2e_s.p99",
                               "normalized_latency_s_per_token", "memory_utilization", "prefix_hit_rate",
                               "preemptions_total"))
HEADLINE = tuple(M[k] for k in ("throughput_tokens_s", "goodput_rps", "ttft_s.p99", "e2e_s.p99"))


@dataclass
class Study:
    out_dir: Path
    meta: dict[str, Any]  # study.json
    records: list[dict[str, Any]]  # in the study's run order; missing runs absent
    threshold: float = DEFAULT_THRESHOLD  # the no-seed noise rule (reports.noise)
    _grids: list | None = field(default=None, repr=False)
    _anchor: dict | None = field(default=None, repr=False)

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

    def anchor(self) -> dict[str, Any]:
        """Settings whose base value no completed run has (a spec whose grids all list rates other
        than the source's, say), each held at the value most completed runs have instead."""
        if self._anchor is None:
            self._anchor = {}
            for key, value in self.base.items():
                if key == SEED or not self.ok:
                    continue
                seen = [json.dumps(r["config"].get(key), sort_keys=True) for r in self.ok
                        if key not in moot_settings(r["config"])]
                if seen and json.dumps(value, sort_keys=True) not in seen:
                    self._anchor[key] = json.loads(max(dict.fromkeys(seen), key=seen.count))
        return self._anchor

    def slice(self, *vary: str, **fixed: Any) -> list[dict[str, Any]]:
        """OK runs that differ from the base only in ``vary`` (other keys at base, or as ``fixed``;
        a base value no run has is replaced by ``anchor``'s; a setting moot for a run, such as the
        offload policy of a run without an offload store, never excludes it)."""
        want = {**self.base, **self.anchor(), **fixed}
        out = []
        for r in self.ok:
            config = r["config"]
            moot = moot_settings(config)  # (the offload policy of a run without an offload store)
            if all(config.get(k) == v for k, v in want.items() if k not in vary and k != SEED and k not in moot):
                out.append(r)
        return out

    def varies(self, axis: str) -> bool:
        return len(self.axes().get(axis, [])) > 1

    def varying(self) -> list[str]:
        """The axes the study varies, seeds aside, in the spec's order."""
        return [k for k, v in self.axes().items() if len(v) > 1 and k != SEED]

    @property
    def seeded(self) -> bool:
        return self.varies(SEED)

    def grids(self) -> list[tuple[dict[str, list], list[dict[str, Any]]]]:
        """Each ``[[grid]]`` of the spec with its completed runs (a run two grids share is in both)."""
        if self._grids is None:
            by_id = {r["id"]: r for r in self.ok}
            grids = self.meta.get("grids") or [self.axes()]
            self._grids = []
            for grid in grids:
                spec = StudySpec(self.meta["name"], self.meta["source"], self.base, [grid])
                ids = [run_id(c) for c in spec.runs()]
                self._grids.append((grid, [by_id[i] for i in ids if i in by_id]))
        return self._grids


@dataclass
class Setting:
    """Runs that differ only in their seed; ``config`` is the first one's, seed removed."""

    config: dict[str, Any]
    records: list[dict[str, Any]]

    def estimate(self, key: str) -> Estimate | None:
        return estimate([metric(r, key) for r in self.records])


def setting_key(config: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in config.items() if k != SEED}, sort_keys=True)


def settings(records: list[dict[str, Any]]) -> list[Setting]:
    """``records`` grouped by setting (seed aside), in first-seen order."""
    groups: dict[str, Setting] = {}
    for r in records:
        key = setting_key(r["config"])
        if key not in groups:
            groups[key] = Setting({k: v for k, v in r["config"].items() if k != SEED}, [])
        groups[key].records.append(r)
    return list(groups.values())


def load_study(out_dir: str | Path, *, threshold: float = DEFAULT_THRESHOLD) -> Study:
    """A study folder as it stands (a running study's too); a results line that is not a valid run
    record is skipped with a ``ResultsWarning`` (its run counts as not run) and nothing is written."""
    out = Path(out_dir)
    meta = _read_meta(out)
    records = ResultsStore(out / "results.jsonl").load(repair=False)
    ordered = [records[i] for i in meta["run_ids"] if i in records]
    if not 0 <= threshold < 1:
        raise ValueError(f"the noise threshold is a fraction in [0, 1), got {threshold}")
    return Study(out, meta, ordered, threshold)


META_FIELDS = {"run_ids": list, "base": dict, "axes": dict, "source": dict, "name": str}


def _read_meta(out: Path) -> dict[str, Any]:
    """``study.json``, checked for the fields the report reads."""
    meta_path = out / "study.json"
    if not meta_path.exists():
        raise ValueError(f"{out} is not a study folder (no study.json; run `pagesim study SPEC -o {out}` first)")
    if not meta_path.is_file():
        raise ValueError(f"{meta_path}: not a regular file; rerun the study to rewrite it")
    try:
        meta = json.loads(meta_path.read_bytes().decode("utf-8"))
    except json.JSONDecodeError as exc:
        why = f"not JSON ({exc.msg})"
    except UnicodeDecodeError:
        why = "not UTF-8"
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number, nesting too deep
        why = f"not JSON ({type(exc).__name__})"
    else:
        why = _meta_problem(meta)
    if why is not None:
        raise ValueError(f"{meta_path}: not a study description ({why}); rerun the study to rewrite it")
    return meta


def _meta_problem(meta: Any) -> str | None:
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    for key, kind in META_FIELDS.items():
        if not isinstance(meta.get(key), kind):
            return f"no {key} ({kind.__name__})"
    if not all(isinstance(i, str) for i in meta["run_ids"]):
        return "run_ids holds something other than run ids"
    return None


# What a run without an offload store has in place of the offload keys (which only a run with one
# reports): every prefix hit an HBM hit, nothing from or to the CPU tier. The host link's busy
# share is left unknown (swaps use it too).
OFFLOAD_OFF = {"hbm_hit_rate": "prefix_hit_rate", "offload_hit_rate": 0.0, "offload_hit_tokens": 0.0,
               "offload_loaded_bytes": 0.0, "offload_stored_bytes": 0.0, "offload_loaded_blocks": 0.0,
               "offload_stored_blocks": 0.0}


def metric(record: dict[str, Any], key: str) -> float | None:
    summary = record.get("summary") or {}
    if key == "preemptions_total":  # a run that does not report preemptions has no count, not zero
        pre = summary.get("preemptions")
        return float(sum(pre.values())) if isinstance(pre, dict) else None
    if key in OFFLOAD_OFF and key not in summary:
        return _offload_off(record, key)
    value: Any = summary
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _offload_off(record: dict[str, Any], key: str) -> float | None:
    """An offload key a run does not report: its value without an offload store if the run had
    none (and a prefix hit rate to split), else unknown (a simulator that does not split tiers)."""
    hit_rate = metric(record, "prefix_hit_rate")
    if offloading(record.get("config") or {}) or hit_rate is None:
        return None
    value = OFFLOAD_OFF[key]
    return hit_rate if value == "prefix_hit_rate" else value


def order(value: Any) -> tuple:
    """Sort key putting numbers in numeric order, then everything else by name."""
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def grid_facets(grid: dict[str, list], records: list[dict[str, Any]],
                drawn: tuple[str, ...]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each combination of the grid's axes of several values, those a page draws (``drawn``) aside,
    with its runs (combinations without runs left out): one page each."""
    axes = [k for k, v in grid.items() if len(v) > 1 and k not in drawn]
    out = []
    for combo in itertools.product(*(sorted(grid[a], key=order) for a in axes)):
        members = [r for r in records if all(r["config"].get(a) == v for a, v in zip(axes, combo))]
        if members:
            out.append((dict(zip(axes, combo)), members))
    return out


def facet_words(grid: dict[str, list], facet: dict[str, Any], count: int, *, drawn: tuple[str, ...], base: str,
                max_pages: int) -> str:
    """Which settings a facet's page holds, in words: the grid's single values (the ``drawn`` axes
    aside), the page's facet, then ``base`` (the base deployment in words); and, of ``count`` such
    pages, how many are drawn (at most ``max_pages``)."""
    held = [f"{k}={value_label(v[0])}" for k, v in grid.items() if len(v) == 1 and k not in drawn]
    held += [f"{k}={value_label(v)}" for k, v in facet.items()]
    words = (f" Fixed on this page: {', '.join(held)}; every other setting at the base" if held else
             " Every other setting at the base") + f" ({base})."
    if count > 1:
        words += f" One of {min(count, max_pages)} such pages, one per {' and '.join(facet)}"
        words += f" ({count - max_pages} more not drawn: see the all-runs table)." if count > max_pages else "."
    return words


