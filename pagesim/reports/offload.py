"""A study's KV-offloading grids read as a sweep: offload size x offload policy, and what it found.

An *offload grid* is a ``[[grid]]`` that varies ``kv_offloading_size`` (GiB over the replica's
GPUs; 0: off). Its runs are read from the grid itself, so every setting the grid does not list is
at the base; the grid's other axes (the offload policy and the seed aside) are *facets*: the
report draws one page per combination (``pagesim.reports.offload_pages``) and the finding reads the
first. In a facet, ``Sweep`` keys each setting by (size, policy); the run without an offload store
has no policy (``pagesim.reports.run_config.moot_settings``) and stands at size 0 for every policy.

``offload_findings`` says, per offload grid, what the CPU tier added to the HBM-only hit rate and
TTFT at the largest size, and which policy is best there, each judged by ``pagesim.reports.noise``: a
change or a best policy is named only where it exceeds the noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagesim.reports.claims import Finding, compared, or_words, rank, regime_words, runs_words
from pagesim.reports.noise import Estimate, compare
from pagesim.reports.results import M, Setting, Study, grid_facets, order, settings
from pagesim.reports.run_config import SEED, offloading, value_label

SIZE = "kv_offloading_size"
POLICY = "kv_offloading_policy"
# what the finding compares: along the sizes and among the policies at the largest size
FINDING_METRICS = (M["prefix_hit_rate"], M["ttft_s.mean"], M["ttft_s.p99"])


def offload_grids(study: Study) -> list[tuple[int, dict[str, list], list[dict[str, Any]]]]:
    """The grids that vary the offload size and have completed runs: (index, grid, runs)."""
    return [(i, grid, records) for i, (grid, records) in enumerate(study.grids())
            if len(grid.get(SIZE, [])) > 1 and records]


def facets(grid: dict[str, list], records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each combination of the grid's axes besides the offload size and policy (and seeds), with its runs."""
    return grid_facets(grid, records, (SIZE, POLICY, SEED))


@dataclass
class Sweep:
    """One facet's settings by (size, policy): ``sizes`` ascending, ``policies`` in order ([None]
    when no run names one: the base's policy)."""

    sizes: list[float]
    policies: list[Any]
    cells: dict[tuple[float, Any], Setting]

    @classmethod
    def of(cls, records: list[dict[str, Any]], listed: list | None = None) -> Sweep:
        """The sweep of ``records``; policies in the order ``listed`` (the grid's) gives them."""
        groups = settings(records)
        sizes = sorted({s.config.get(SIZE) or 0.0 for s in groups}, key=order)
        listed = listed or []
        policies = sorted({s.config.get(POLICY) for s in groups if offloading(s.config)},
                          key=lambda p: (listed.index(p) if p in listed else len(listed), order(p))) or [None]
        cells = {(s.config.get(SIZE) or 0.0, s.config.get(POLICY) if offloading(s.config) else None): s for s in groups}
        return cls(sizes, policies, cells)

    def at(self, size: float, policy: Any) -> Setting | None:
        """The setting at ``size`` under ``policy`` (without an offload store: the one shared run)."""
        return self.cells.get((size, policy)) or self.cells.get((size, None))

    def shared(self, size: float) -> bool:
        """Whether ``size`` is one run for every policy (offloading off there)."""
        setting = self.cells.get((size, None))
        return setting is not None and not offloading(setting.config)

    def records(self) -> list[dict[str, Any]]:
        return [r for s in self.cells.values() for r in s.records]


def policy_label(policy: Any, study: Study) -> str:
    """A policy as the report names it (None: the base's, or the default)."""
    if policy is not None:
        return str(policy)
    base = study.base.get(POLICY)
    return f"{base} (the base's)" if base else "lru (the default)"


def offload_findings(study: Study) -> list[Finding]:
    """A ``claims.Finding`` per offload grid (its first facet), or none."""
    out = []
    for _index, grid, records in offload_grids(study):
        facet, members = facets(grid, records)[0]
        sweep = Sweep.of(members, grid.get(POLICY))
        claims = _size_claims(study, sweep) + _policy_claims(study, sweep)
        if claims:
            out.append(Finding(_head(study, grid, facet, sweep), claims))
    return out


def _head(study: Study, grid: dict[str, list], facet: dict[str, Any], sweep: Sweep) -> str:
    sizes = ", ".join(f"{s:g}" for s in sweep.sizes)
    policies = ", ".join(policy_label(p, study) for p in sweep.policies)
    runs = sweep.records()
    held = "".join(f"{k}={value_label(v)}, " for k, v in facet.items())
    held += "".join(f"{k}={value_label(v[0])}, " for k, v in grid.items()
                    if len(v) == 1 and k not in (SEED, SIZE, POLICY))
    zero = ", 0 = HBM only" if sweep.shared(sweep.sizes[0]) else ""
    return (f"KV offloading (offload size {sizes} GiB{zero}; policy {policies}; {runs_words(len(runs))} "
            f"{regime_words(runs)}, {held}every other setting at the base)")


def _size_claims(study: Study, sweep: Sweep) -> list[str]:
    """Per policy, the largest size against HBM only (size 0), where the sweep has both."""
    smallest, largest = sweep.sizes[0], sweep.sizes[-1]
    if not sweep.shared(smallest):
        return []
    off = sweep.at(smallest, None)
    claims = []
    for policy in sweep.policies:
        top = sweep.at(largest, policy)
        if top is None or top is off:
            continue
        changed, flat = [], []
        for metric in FINDING_METRICS:
            a, b = top.estimate(metric.key), off.estimate(metric.key)
            if a is None or b is None:
                continue
            if compare(a, b, threshold=study.threshold, fraction=metric.fraction) == 0:
                flat.append(metric.label)
            else:
                changed.append(f"{metric.label} {metric.with_unit(b.mean)} -> {metric.with_unit(a.mean)} "
                               f"({compared(metric, a.mean, b.mean)})")
        cpu = top.estimate("offload_hit_rate")
        where = f"{largest:g} GiB {policy_label(policy, study)} against HBM only"
        if cpu is not None and "prefix hit rate" not in flat:
            where += f", CPU hits {M['offload_hit_rate'].with_unit(cpu.mean)} of prompt tokens"
        parts = changed + ([f"no measurable change in {or_words(flat)}"] if flat else [])
        if parts:
            claims.append(f"{where}: {'; '.join(parts)}")
    return claims


def _policy_claims(study: Study, sweep: Sweep) -> list[str]:
    """The policies at the largest size, per metric: the best where it is ahead by more than noise."""
    largest = sweep.sizes[-1]
    group = [s for p in sweep.policies if p is not None and (s := sweep.cells.get((largest, p))) is not None]
    if len(group) < 2:
        return []
    claims, flat = [], []
    for metric in FINDING_METRICS:
        ranking = rank(group, metric, study.threshold)
        if ranking is None:
            continue
        if ranking.all_tied:
            flat.append(metric.label)
            continue
        (best, best_e), (worst, worst_e) = ranking.scored[0], ranking.scored[-1]
        if ranking.unique:
            second, second_e = ranking.scored[1]
            claims.append(f"at {largest:g} GiB, {metric.label} best with policy {best.config.get(POLICY)} "
                          f"({metric.with_unit(best_e.mean)}; "
                          f"{compared(metric, best_e.mean, second_e.mean, str(second.config.get(POLICY)))})")
        else:
            tied = ", ".join(str(s.config.get(POLICY)) for s, _ in ranking.tied)
            claims.append(f"at {largest:g} GiB, {metric.label} best with policy {best.config.get(POLICY)} "
                          f"({metric.with_unit(best_e.mean)}) with {tied} within noise; {worst.config.get(POLICY)} "
                          f"{compared(metric, worst_e.mean, best_e.mean, 'the best')} ({metric.with_unit(worst_e.mean)})")
    if flat:
        claims.append(f"at {largest:g} GiB, no measurable difference between the policies in {or_words(flat)}")
    return claims


def estimate_of(setting: Setting | None, key: str) -> Estimate | None:
    return None if setting is None else setting.estimate(key)
