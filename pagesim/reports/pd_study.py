"""A study's P:D-split grids read as a sweep: split x KV link bandwidth against colocated, and the winner.

A *split grid* is a ``[[grid]]`` that varies ``pd_split`` (``pagesim.reports.pd``) and has a
completed P:D run. Its runs are read from the grid itself, so every setting the grid does not list
is at the base; its other axes (the link bandwidth and the seed aside) are *facets*: the report
draws a page per combination (``pagesim.reports.pd_pages``) and the finding reads the first. In a
facet, ``SplitSweep`` keys each P:D setting by (split, bandwidth); the colocated run has no links
(``pagesim.reports.run_config.moot_settings``) and stands beside every bandwidth.

Splits are judged by goodput per GPU (``goodput_rps_per_gpu``: requests per second that met the
run's TTFT and TPOT SLO, over the GPUs it used), the figure that compares deployments of one GPU
budget. ``verdicts`` says, per bandwidth, which split is best and by how much it beats (or trails)
colocated serving, each difference judged by ``pagesim.reports.noise``; ``pd_findings`` puts that in
words, with how the answer moves between bandwidths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagesim.reports.claims import Finding, compared, rank, regime_words, runs_words
from pagesim.reports.noise import Estimate, compare
from pagesim.reports.pd import COLOCATED, is_disaggregated, parse_split
from pagesim.reports.results import M, Setting, Study, grid_facets, order, settings
from pagesim.reports.run_config import SEED, value_label

SPLIT = "pd_split"
BANDWIDTH = "kv_link_bandwidth"
GOODPUT = M["goodput_rps_per_gpu"]


def split_grids(study: Study) -> list[tuple[int, dict[str, list], list[dict[str, Any]]]]:
    """The grids that vary the split and have a completed P:D run: (index, grid, runs)."""
    return [(i, grid, records) for i, (grid, records) in enumerate(study.grids())
            if len(grid.get(SPLIT, [])) > 1 and any(is_disaggregated(r["config"]) for r in records)]


def facets(grid: dict[str, list], records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each combination of the grid's axes besides the split and the bandwidth (and seeds), with its runs."""
    return grid_facets(grid, records, (SPLIT, BANDWIDTH, SEED))


def split_order(split: str) -> tuple:
    """Fewest prefill replicas first; colocated last."""
    parsed = parse_split(split)
    return (1, 0, 0) if parsed is None else (0, *parsed)


def bandwidth_label(bandwidth: float | None) -> str:
    return "preset links" if bandwidth is None else f"{bandwidth:g} GB/s"


@dataclass
class SplitSweep:
    """One facet: the P:D settings by (split, bandwidth), and the colocated setting (or None)."""

    splits: list[str]  # fewest prefill replicas first
    bandwidths: list[float | None]  # as the grid lists them ([None]: the presets')
    cells: dict[tuple[str, float | None], Setting]
    colocated: Setting | None

    @classmethod
    def of(cls, records: list[dict[str, Any]], listed: list | None = None) -> SplitSweep:
        groups = settings(records)
        disagg = [s for s in groups if is_disaggregated(s.config)]
        splits = sorted({s.config[SPLIT] for s in disagg}, key=split_order)
        seen = {s.config.get(BANDWIDTH) for s in disagg}
        listed = [b for b in listed or [] if b in seen]
        bandwidths = listed + sorted(seen - set(listed), key=order)
        cells = {(s.config[SPLIT], s.config.get(BANDWIDTH)): s for s in disagg}
        colocated = next((s for s in groups if s.config.get(SPLIT) == COLOCATED), None)
        return cls(splits, bandwidths or [None], cells, colocated)

    def at(self, split: str, bandwidth: float | None) -> Setting | None:
        return self.cells.get((split, bandwidth))

    def records(self) -> list[dict[str, Any]]:
        out = [r for s in self.cells.values() for r in s.records]
        return out + (self.colocated.records if self.colocated else [])

    @property
    def gpus(self) -> int | None:
        return next((s.config.get("gpus") for s in self.cells.values()), None)


@dataclass
class Verdict:
    """At one bandwidth: the best split (and those within noise of it) against colocated serving."""

    bandwidth: float | None
    best: str
    best_value: Estimate
    tied: list[str]  # splits within noise of the best
    colocated_value: Estimate | None
    beats_colocated: int | None  # 1: the best split is ahead by more than noise; -1: behind; 0: within noise

    def words(self) -> str:
        where = f"at {bandwidth_label(self.bandwidth)}"
        value = GOODPUT.with_unit(self.best_value.mean)
        tied = f"; {', '.join(self.tied)} within noise of it" if self.tied else ""
        if self.colocated_value is None:
            return f"{where}, split {self.best} is best ({value}{tied}); no colocated run to compare with"
        colocated = GOODPUT.with_unit(self.colocated_value.mean)
        gap = compared(GOODPUT, self.best_value.mean, self.colocated_value.mean, "colocated")
        if self.beats_colocated == 1:
            return f"{where}, split {self.best} wins: {value}, {gap} ({colocated}){tied}"
        if self.beats_colocated == -1:
            return f"{where}, colocated wins ({colocated}): the best split, {self.best}, is {gap} ({value}{tied})"
        return (f"{where}, the best split, {self.best} ({value}{tied}), and colocated ({colocated}) are within noise "
                f"of each other")


def verdicts(study: Study, sweep: SplitSweep) -> list[Verdict]:
    """Per bandwidth, the best split by goodput per GPU, judged against colocated (module docstring)."""
    out = []
    colocated = sweep.colocated.estimate(GOODPUT.key) if sweep.colocated else None
    for bandwidth in sweep.bandwidths:
        group = [s for split in sweep.splits if (s := sweep.at(split, bandwidth)) is not None]
        scored = [(s, e) for s in group if (e := s.estimate(GOODPUT.key)) is not None]
        if not scored:
            continue
        ranking = rank(group, GOODPUT, study.threshold)
        if ranking is None:  # (one split: nothing to rank)
            best, best_e = scored[0]
            tied = []
        else:
            best, best_e = ranking.scored[0]
            tied = [s.config[SPLIT] for s, _ in ranking.tied]
        beats = None if colocated is None else compare(best_e, colocated, threshold=study.threshold)
        out.append(Verdict(bandwidth, best.config[SPLIT], best_e, tied, colocated, beats))
    return out


def pd_findings(study: Study) -> list[Finding]:
    """A ``claims.Finding`` per split grid (its first facet), or none."""
    out = []
    for _index, grid, records in split_grids(study):
        facet, members = facets(grid, records)[0]
        sweep = SplitSweep.of(members, grid.get(BANDWIDTH))
        found = verdicts(study, sweep)
        claims = [v.words() for v in found] + moves(found)
        if claims:
            out.append(Finding(_head(study, grid, facet, sweep), claims))
    return out


def moves(found: list[Verdict]) -> list[str]:
    """How the answer moves from the first bandwidth to the last (a best split that changes only
    within noise is no move)."""
    if len(found) < 2:
        return []
    first, last = found[0], found[-1]
    a, b = bandwidth_label(first.bandwidth), bandwidth_label(last.bandwidth)
    change = compared(GOODPUT, last.best_value.mean, first.best_value.mean)
    if first.best == last.best:
        where = f"the best split stays {first.best}"
    elif last.best in first.tied or first.best in last.tied:
        where = f"the best split is {first.best}, then {last.best}, within noise of each other"
    else:
        where = f"the best split moves from {first.best} to {last.best}"
    verdict = {1: "ahead of", 0: "level with", -1: "behind", None: None}
    ends = [verdict[v.beats_colocated] for v in (first, last)]
    against = ""
    if None not in ends:
        against = (f", {ends[0]} colocated at both" if ends[0] == ends[1] else
                   f", {ends[0]} colocated at {a} and {ends[1]} it at {b}")
    return [f"from {a} to {b} {where}, the best goodput per GPU {change}{against}"]


def slo_words(records: list[dict[str, Any]]) -> str:
    """The SLO the runs' goodput counts against, e.g. "TTFT <= 2 s and TPOT <= 50 ms"."""
    for r in records:
        slo = (r.get("summary") or {}).get("slo") or {}
        parts = []
        if slo.get("ttft_s") is not None:
            parts.append(f"TTFT <= {slo['ttft_s']:g} s")
        if slo.get("tpot_s") is not None:
            parts.append(f"TPOT <= {slo['tpot_s'] * 1e3:g} ms")
        if parts:
            return " and ".join(parts)
    return "no SLO"


def _head(study: Study, grid: dict[str, list], facet: dict[str, Any], sweep: SplitSweep) -> str:
    splits = ", ".join(sweep.splits + ([COLOCATED] if sweep.colocated else []))
    links = ", ".join(bandwidth_label(b) for b in sweep.bandwidths)
    runs = sweep.records()
    held = "".join(f"{k}={value_label(v)}, " for k, v in facet.items())
    held += "".join(f"{k}={value_label(v[0])}, " for k, v in grid.items() if len(v) == 1 and k not in (SEED, SPLIT))
    gpus = f"{sweep.gpus} GPUs, " if sweep.gpus else ""
    return (f"P:D split ({gpus}splits {splits}; KV links {links}; goodput per GPU under {slo_words(runs)}; "
            f"{runs_words(len(runs))} {regime_words(runs)}, {held}every other setting at the base)")
