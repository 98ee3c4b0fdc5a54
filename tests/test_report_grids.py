"""Reports of generated studies (1-3 varying axes, 1-40 runs, some failed): every run in the table,
no page about an axis the study does not vary, no caption or cover field with a missing value.

The runs' records are made up (plausible numbers, the shapes the runner writes), so many grid
shapes are checked in seconds; ``test_report.py`` checks reports of real simulations.
"""

from __future__ import annotations

import json
import re

import matplotlib.pyplot as plt
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.reports.execute import _write_study
from pagesim.reports.findings import AXIS_NAMES, findings
from pagesim.reports.pdf import LOAD_PAGES, cover_lines, report_pages
from pagesim.reports.results import load_study
from pagesim.reports.run_config import run_id
from pagesim.reports.spec import parse_spec
from pagesim.reports.store import ResultsStore
from pagesim.reports.table_pages import all_runs
from tests.conftest import scaled_examples

AXES = {
    "block_size": [8, 16, 32, 64],
    "eviction": ["lru", "fifo", "lfu", "radix-leaf"],
    "preemption": ["recompute", "swap"],
    "kv_cache_gb": [1.0, 2.0, 4.0],
    "rate_scale": [0.5, 1.0, 1.5],
    "allocator": ["paged", "max", "pow2"],
    "seed": [0, 1, 2],
}
MISSING = re.compile(r"\bNone\b|\bnan\b|\binf\b|:\s*$|\(\s*\)")


def _quantiles(rng, scale):
    return sorted(float(v) for v in rng.gamma(2.0, scale, 101))


def fake_record(config, rng) -> dict:
    """A run record with the runner's shape and plausible, random numbers."""
    n = 100
    thr = float(rng.uniform(500, 2000)) * config["rate_scale"]
    ttft = {f"p{q}": float(rng.uniform(0.05, 3) * (q / 50)) for q in (50, 90, 99)}
    steps = 50
    t = np.linspace(0, 60, steps).round(3).tolist()
    pre = int(rng.integers(0, 40))
    return {
        "id": run_id(config), "config": config, "status": "ok", "wall_s": 0.5,
        "summary": {
            "throughput_tokens_s": thr, "throughput_rps": thr / 400, "goodput_rps": thr / 800,
            "ttft_s": {**ttft, "mean": ttft["p50"], "median": ttft["p50"], "std": 0.1},
            "tpot_s": {"p50": 0.02, "p90": 0.03, "p99": float(rng.uniform(0.03, 0.08)), "mean": 0.02},
            "e2e_s": {"p50": 5.0, "p90": 8.0, "p99": float(rng.uniform(8, 20)), "mean": 5.5},
            "queueing_s": {"mean": float(rng.uniform(0, 3)), "p50": 0.1},
            "normalized_latency_s_per_token": 0.05, "memory_utilization": float(rng.uniform(0.5, 1.0)),
            "prefix_hit_rate": float(rng.uniform(0, 0.9)), "preemptions": {"recompute": pre, "swap": 0},
            "requests_total": n, "requests_completed": n, "slo": {"ttft_s": 2.0, "tpot_s": 0.1, "attained": 0.5},
            "swapped_blocks": {"out": 0, "in": 0},
        },
        "deployment": {"kv_cache_source": "2 GiB per GPU (given)", "block_bytes": 1 << 20, "num_gpu_blocks": 100,
                       "kv_cache_slots": 1600},
        "trace": {"requests": n, "rate_rps": 4.0 * config["rate_scale"], "source": "fake"},
        "preemption": {"recompute": pre, "swap": 0, "recomputed_tokens": pre * 100, "swapped_bytes": 0},
        "series": {
            "latency_quantiles": {"ttft_s": _quantiles(rng, 0.5), "tpot_s": _quantiles(rng, 0.01),
                                  "e2e_s": _quantiles(rng, 3)},
            "memory": {"time_s": t, "used": [0.5] * steps, "fragmentation": [0.01] * steps,
                       "cached": [0.2] * steps, "free": [0.29] * steps},
            "activity": {"time_s": t, "waiting": [3] * steps, "running": [10] * steps, "batch_requests": [10] * steps,
                         "batch_tokens": [200] * steps, "swap_blocks": [0] * steps},
        },
    }


@st.composite
def studies(draw):
    names = draw(st.lists(st.sampled_from(sorted(AXES)), min_size=1, max_size=3, unique=True))
    grid = {}
    for name in names:
        values = AXES[name]
        grid[name] = draw(st.lists(st.sampled_from(values), min_size=1, max_size=len(values), unique=True))
    size = int(np.prod([len(v) for v in grid.values()]))
    if size > 40:
        first = names[0]
        grid[first] = grid[first][:max(1, len(grid[first]) * 40 // size)]
    failed = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**16))
    return grid, failed, seed


def _toml(grid):
    lines = [f"{k} = {json.dumps(v)}" for k, v in grid.items()]
    return ('name = "generated"\n[source]\nworkload = "shared-system-prompt"\nrate = 4.0\nnum_requests = 100\n'
            "[base]\nkv_cache_gb = 2.0\n[[grid]]\n" + "\n".join(lines) + "\n")


def _forbidden_words(study) -> list[str]:
    """Names of settings the study does not vary (a title must not name them)."""
    varied = set(study.varying())
    words = [AXIS_NAMES.get(k, k).lower() for k in AXIS_NAMES if k not in varied]
    if "kv_cache_gb" not in varied:
        words.append("cache size")
    if not varied & {"rate_scale", "rate"}:
        words.append("request rate")
    return words


@settings(max_examples=scaled_examples(20))
@given(studies())
def test_generated_study_reports_every_run_and_no_missing_value(tmp_path_factory, case):
    grid, failed, seed = case
    out = tmp_path_factory.mktemp("gen")
    spec = parse_spec(_toml(grid))
    runs = spec.runs()
    _write_study(out, spec, runs)
    rng = np.random.default_rng(seed)
    store = ResultsStore(out / "results.jsonl")
    for k, config in enumerate(runs):
        if k < failed:
            store.append({"id": run_id(config), "config": config, "status": "error", "error": "ValueError: made up"})
        else:
            store.append(fake_record(config, rng))
    study = load_study(out)
    table = all_runs(study)
    assert len(table.rows) == len(runs)
    assert {row[0] for row in table.rows} == {run_id(c)[:8] for c in runs}
    for axis in study.varying():
        assert axis in " ".join(table.header).replace("\n", ""), axis
    pages = report_pages(study)
    try:
        forbidden = _forbidden_words(study)
        for page in pages:
            for word in forbidden:
                assert word not in page.title.lower(), (page.title, word, grid)
            assert page.title.strip() and page.caption.strip()
            assert not MISSING.search(page.title) and not re.search(r"\bNone\b|\bnan\b", page.caption), page.title
        omitted = [(t, why) for t, _, why in LOAD_PAGES]
        for name, value in cover_lines(study, omitted):
            assert value.strip() and not re.search(r"\bNone\b|\bnan\b", value), (name, value)
        for line in findings(study):
            assert not re.search(r"\bNone\b|\bnan\b", line), line
    finally:
        for page in pages:
            plt.close(page.figure)
