"""What the summary and the report say (issue 56): evictions split into those a later request asked
for and plain recycling, the ideal cache's bound on any eviction policy, the words on the memory
figures, the findings' phrases, plain numbers, and examples that run from a fresh clone.

- a hand-made run: a request that comes back for blocks an interloper evicted misses exactly the
  hits it lost; nobody coming back, nothing missed, every eviction plain recycling; a request
  preempted by recompute that finds its own blocks gone counts them (``num_resume_blocks_lost``),
  the same with skip-ahead on and off;
- ``pagesim.sim.ideal_cache`` against a block-by-block reference built from the simulator's own keys
  (``Request.block_contents`` chained into ``BlockKey``s) and, for tiny cases, against every subset
  of reuse intervals (MIN is optimal); a simulated run never beats it;
- ``pagesim.reports.claims.compared`` over generated values: grammatical, plain, never "0x";
- the printed summary: no exponent notation, grouped digits, "allocated" / "holding tokens";
- a study whose eviction policies tie says why; the report's eviction page draws;
- every examples/*.toml parses from the repository with its trace inside it, and its first run
  runs (a few requests).
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagesim.engine.policy import Scheduler, make_config
from pagesim.engine.policy.memory.block_key import chain_keys
from pagesim.sim.ideal_cache import belady_hits, ideal_cache, reuse_intervals
from pagesim.sim.simulator import SimOptions, Simulation
from tests.conftest import scaled_examples
from tests.test_skip_ahead import roofline
from pagesim.traces.trace import Trace

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------- evictions asked for again in a run
PREFIX = 4  # tokens per prefix identity (= the block size below: one identity a block)


def _trace(rows: list[tuple[float, list[int], int]]) -> Trace:
    """Requests of (arrival, prefix identities of PREFIX tokens each, output tokens)."""
    ids = [row[1] for row in rows]
    return Trace(arrival_s=np.array([r[0] for r in rows]), prompt_len=np.array([PREFIX * len(i) for i in ids]),
                 output_len=np.array([r[2] for r in rows]), prefix_id_values=np.array([x for i in ids for x in i]),
                 prefix_id_offsets=np.r_[0, np.cumsum([len(i) for i in ids])], prefix_block_tokens=PREFIX)


def _run(trace: Trace, *, num_gpu_blocks: int, eviction: str = "lru", skip_ahead: bool = True, **settings_):
    config = make_config("pagesim", block_size=PREFIX, num_gpu_blocks=num_gpu_blocks, enable_prefix_caching=True,
                         eviction_policy=eviction, record_decisions=False, **settings_)
    return Simulation(trace, Scheduler(config), roofline(), SimOptions(skip_ahead=skip_ahead)).run().summary


@pytest.mark.parametrize("eviction", ["lru", "fifo", "lfu", "radix-leaf"])
def test_a_request_back_for_evicted_blocks_misses_exactly_the_hits_it_lost(eviction):
    shared = list(range(1, 9))  # 8 blocks: A's prompt, and B's after C evicted (some of) them
    interloper = list(range(100, 112))
    back = _trace([(0.0, shared, 2), (5.0, interloper, 2), (10.0, shared, 2)])
    s = _run(back, num_gpu_blocks=16, eviction=eviction)
    missed = s["prefix_hit_blocks_missed"]
    hittable = (len(shared) * PREFIX - 1) // PREFIX  # (the last known token is recomputed)
    hit_blocks = round(s["prefix_hit_rate"] * s["input_tokens"]) // PREFIX
    assert s["prefix_evictions"] > 0 and missed > 0
    assert hit_blocks + missed == hittable  # every block B could hit was either kept or lost
    assert s["prefix_evictions_costing_hits"] == min(missed, s["prefix_evictions"])
    assert s["prefix_evictions_recycled"] == s["prefix_evictions"] - s["prefix_evictions_costing_hits"]

    nobody_back = _trace([(0.0, shared, 2), (5.0, interloper, 2)])
    s = _run(nobody_back, num_gpu_blocks=16, eviction=eviction)
    assert s["prefix_evictions"] > 0 and s["prefix_hit_blocks_missed"] == 0
    assert s["prefix_evictions_costing_hits"] == 0 and s["prefix_evictions_recycled"] == s["prefix_evictions"]


@pytest.mark.parametrize("eviction", ["lru", "fifo", "lfu", "radix-leaf"])
def test_a_recomputed_request_counts_its_own_blocks_gone_the_same_with_skip_ahead(eviction):
    from tests.test_skip_ahead import recompute_hits_own_blocks

    trace, settings_ = recompute_hits_own_blocks()  # (no prefix identities: only its own blocks can hit)
    settings_["eviction_policy"] = eviction
    runs = []
    for skip_ahead in (False, True):
        scheduler = Scheduler(make_config("pagesim", **settings_, record_decisions=False))
        summary = Simulation(trace, scheduler, roofline(), SimOptions(skip_ahead=skip_ahead, seed=3)).run().summary
        runs.append((summary, scheduler.kv.num_resume_blocks_lost))
    (plain_run, plain_lost), (fast_run, fast_lost) = runs
    assert json.dumps(plain_run, sort_keys=True) == json.dumps(fast_run, sort_keys=True) and plain_lost == fast_lost
    assert plain_run["preemptions"]["recompute"] > 0 and plain_lost > 0
    assert plain_run["infinite_cache_hit_rate"] == 0.0  # (first admissions share nothing) ...
    assert plain_run["prefix_hit_blocks_missed"] == plain_lost  # ... so every miss is a return's


# ------------------------------------------------------------------- ideal cache
def _reference_stream(trace: Trace, bs: int):
    """Block references as the simulator keys them: per request, (key, scores) for each full prompt
    block, from ``Request.block_contents`` chained into ``BlockKey``s."""
    stream = []
    for i in range(len(trace)):
        request = trace.request(i)
        full = request.prompt_len // bs
        keys = chain_keys(request.block_contents(request.seqs[0], 0, full * bs, bs)) if full else []
        cap = (request.prompt_len - 1) // bs
        stream.append([(key, j < cap) for j, key in enumerate(keys)])
    return stream


def _reference_intervals(stream) -> list[tuple[int, int]]:
    last: dict = {}
    intervals = []
    for t, refs in enumerate(stream):
        for key, scores in refs:
            if key in last and scores:
                intervals.append((last[key], t))
            last[key] = t
    return intervals


def _most_held(intervals: list[tuple[int, int]], capacity: int) -> int:
    """The most intervals held with at most ``capacity`` at any time: every subset, tried."""
    for size in range(len(intervals), -1, -1):
        for subset in itertools.combinations(intervals, size):
            times = {t for s, e in subset for t in range(s, e)}
            if all(sum(s <= t < e for s, e in subset) <= capacity for t in times):
                return size
    return 0


@st.composite
def prefix_traces(draw, max_requests: int = 7):
    num = draw(st.integers(1, max_requests))
    ident = draw(st.sampled_from([2, 3, 4, 8]))
    rows = []
    for _ in range(num):
        shared = draw(st.lists(st.integers(0, 2), min_size=0, max_size=4))  # a few common identities ...
        prompt = draw(st.integers(1, ident * 6))
        count = -(-prompt // ident)
        ids = [10 * k + v for k, v in enumerate(shared)][:count]
        ids += [1000 * (len(rows) + 1) + k for k in range(count - len(ids))]  # ... then private ones
        rows.append((prompt, ids))
    return Trace(arrival_s=np.arange(num, dtype=float), prompt_len=np.array([p for p, _ in rows]),
                 output_len=np.ones(num, dtype=np.int64), prefix_id_values=np.array([x for _, i in rows for x in i]),
                 prefix_id_offsets=np.r_[0, np.cumsum([len(i) for _, i in rows])], prefix_block_tokens=ident)


@settings(max_examples=scaled_examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=prefix_traces(), bs=st.sampled_from([1, 2, 3, 4, 8]), capacity=st.integers(0, 12))
def test_ideal_cache_matches_the_block_by_block_reference_and_every_subset(trace, bs, capacity):
    reference = _reference_intervals(_reference_stream(trace, bs))
    intervals = reuse_intervals(trace, bs)
    assert int(intervals.weights.sum()) == len(reference)  # the infinite cache's hits, block by block
    assert sorted(zip(np.repeat(intervals.starts, intervals.weights).tolist(),
                      np.repeat(intervals.ends, intervals.weights).tolist())) == sorted(reference)
    result = ideal_cache(trace, bs, capacity)
    assert result.infinite_hit_tokens == bs * len(reference)
    assert result.ideal_hit_tokens <= result.infinite_hit_tokens
    if len(reference) <= 9:
        assert result.ideal_hit_tokens == bs * _most_held(reference, capacity)
    assert belady_hits(intervals, capacity + 1) >= result.ideal_hit_tokens // bs  # (more room never hurts)


def test_no_prefix_identities_no_reuse():
    trace = Trace(arrival_s=np.zeros(3), prompt_len=np.array([40, 40, 40]), output_len=np.ones(3, dtype=np.int64))
    result = ideal_cache(trace, 16, 100)
    assert (result.ideal_hit_rate, result.infinite_hit_rate, result.reusable_blocks) == (0.0, 0.0, 0)


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_simulated_run_beats_the_ideal_cache(data):
    from tests.test_skip_ahead import configs, workloads

    trace = data.draw(workloads().filter(lambda t: t.has_prefix_ids))
    preset, settings_ = data.draw(configs(trace).filter(lambda c: c[0] != "vllm-v0"))  # (v0: no prefix caching)
    settings_["enable_prefix_caching"] = True
    scheduler = Scheduler(make_config(preset, **settings_, record_decisions=False))
    s = Simulation(trace, scheduler, roofline(), SimOptions(seed=3)).run().summary
    assert s["ideal_hit_rate"] is not None and s["prefix_hit_rate"] is not None
    assert s["prefix_hit_rate"] <= s["ideal_hit_rate"] + 1e-6 <= s["infinite_cache_hit_rate"] + 2e-6
    assert s["ideal_cache_blocks"] == scheduler.pool.num_usable_blocks + scheduler.config.num_offload_blocks


def test_prefix_caching_off_reports_no_ideal_cache():
    trace = _trace([(0.0, [1, 2, 3], 2), (1.0, [1, 2, 3], 2)])
    config = make_config("pagesim", block_size=PREFIX, num_gpu_blocks=16, enable_prefix_caching=False)
    s = Simulation(trace, Scheduler(config), roofline(), SimOptions()).run().summary
    assert s["ideal_hit_rate"] is None and s["infinite_cache_hit_rate"] is None and s["prefix_evictions"] == 0


def test_a_cluster_sums_its_replicas_ideal_caches():
    from pagesim.sim.cluster import Cluster
    from pagesim.sim.router import make_router

    trace = _trace([(0.1 * k, [1, 2, 3, 4, 5 + k % 3], 2) for k in range(12)])
    config = dict(block_size=PREFIX, num_gpu_blocks=12, enable_prefix_caching=True)
    schedulers = [(Scheduler(make_config("pagesim", **config)), roofline()) for _ in range(2)]
    s = Cluster(trace, schedulers, make_router("round-robin"), SimOptions()).run().summary
    replicas = s["replicas"]
    assert s["ideal_cache_blocks"] == sum(r["ideal_cache_blocks"] for r in replicas)
    assert s["prefix_reusable_blocks"] == sum(r["prefix_reusable_blocks"] for r in replicas)
    assert s["prefix_hit_blocks_missed"] == sum(r["prefix_hit_blocks_missed"] for r in replicas)
    assert s["prefix_evictions"] == sum(r["prefix_evictions"] for r in replicas)


# ------------------------------------------------------------------ findings' words
PHRASE = re.compile(r"^(\d[\d,.]*x the (next|best)|\d[\d.]*% (higher|lower) than the (next|best)"
                    r"|\d[\d,.]* points (higher|lower) than the (next|best)|.+ against .+ for the (next|best)"
                    r"|equal to the (next|best))$")
VALUES = st.one_of(st.just(0.0), st.floats(1e-6, 1e7, allow_nan=False), st.sampled_from([1.0, 2.0, 2.5, 1000.0]))


@settings(max_examples=scaled_examples(300), deadline=None)
@given(a=VALUES, b=VALUES, key=st.sampled_from(["throughput_tokens_s", "ttft_s.p99", "preemptions_total",
                                                 "prefix_hit_rate", "memory_utilization"]),
       other=st.sampled_from(["the next", "the best"]))
def test_compared_phrases_are_plain_english(a, b, key, other):
    from pagesim.reports.claims import compared
    from pagesim.reports.results import M

    metric = M[key]
    if metric.fraction:
        a, b = a / 1e7, b / 1e7
    phrase = compared(metric, a, b, other)
    assert PHRASE.match(phrase), phrase
    assert not re.search(r"\b0x|\bas (high|low)\b|\d[eE][+-]?\d|nan|inf", phrase), phrase
    bare = compared(metric, a, b)
    assert "than" not in bare and "for the" not in bare, bare


def test_compared_reads_as_the_issue_asks():
    from pagesim.reports.claims import compared
    from pagesim.reports.results import M

    thr, ttft = M["throughput_tokens_s"], M["ttft_s.p99"]
    assert compared(thr, 2.5, 1.0, "the next") == "2.5x the next"
    assert compared(ttft, 0.4, 1.0, "the next") == "60.0% lower than the next"
    assert compared(ttft, 0.0, 3.0, "the next") == "100.0% lower than the next"
    assert compared(thr, 21030.0, 1.0, "the next") == "21,030x the next"


# ------------------------------------------------------------------ plain numbers
@pytest.mark.parametrize("value, text", [(21030.0, "21,030"), (21030, "21,030"), (1166.4, "1,166"), (5.522, "5.522"),
                                         (0.05188, "0.05188"), (0.0, "0"), (None, "-"), (1.5e-7, "0.00000015"),
                                         (123456789.0, "123,456,789"), (-2.5, "-2.5")])
def test_plain_numbers(value, text):
    from pagesim.sim.output import plain

    assert plain(value) == text


@settings(max_examples=scaled_examples(200), deadline=None)
@given(x=st.floats(-1e12, 1e12, allow_nan=False))
def test_plain_never_writes_an_exponent_and_keeps_four_figures(x):
    from pagesim.sim.output import plain

    text = plain(x)
    assert not re.search(r"[eE]", text)
    back = float(text.replace(",", ""))
    assert abs(back - x) <= max(abs(x) * 1e-3, 1e-12) + (0.5 if abs(x) >= 1000 else 0.0)


def test_the_printed_summary_is_plain_and_says_what_its_memory_figures_are_shares_of(capsys):
    from pagesim.sim import cli as sim_cli
    from pagesim.engine.cli import build_parser

    args = build_parser().parse_args(["simulate", "--workload", "multi-turn-chat", "--num-requests", "300",
                                      "--rate", "20", "--num-gpu-blocks", "2000", "--no-progress"])
    assert sim_cli.run(args) == 0
    out = capsys.readouterr().out
    assert not re.search(r"\d[eE][+-]?\d", out), out
    assert re.search(r"of the cache's slots allocated on average; [\d.]+% of allocated slots holding tokens", out)
    assert re.search(r"[\d,]+ cached blocks evicted; [\d,]+ hit blocks lost \(asked for again after an eviction\), so "
                     r"at least [\d,]+ evictions were plain recycling", out), out
    assert "the best any eviction policy could do at this cache size" in out
    assert re.search(r"\d,\d{3}", out)  # grouped digits (the step count at least)


# ------------------------------------------------------------ reports: eviction ties
def test_a_study_whose_eviction_policies_tie_says_why(tmp_path):
    from pagesim.reports.execute import run_study
    from pagesim.reports.findings import outline_lines
    from pagesim.reports.pages import eviction_page
    from pagesim.reports.results import load_study
    from pagesim.reports.spec import parse_spec

    spec = parse_spec('name = "tie"\n[source]\nworkload = "shared-system-prompt"\nrate = 4.0\nnum_requests = 40\n'
                      '[base]\nmodel = "llama3-8b"\ngpu = "a100-80gb"\nnum_gpu_blocks = 4000\nprefix_caching = true\n'
                      '[[grid]]\neviction = ["lru", "fifo"]\n')
    run_study(spec, tmp_path / "study", workers=1, progress=False)
    study = load_study(tmp_path / "study")
    text = "\n".join(outline_lines(study))
    assert "eviction policies tie on prefix hit rate at" in text and "Belady's MIN" in text, text
    assert "cannot matter" in text  # (a roomy cache: every reusable block fits)
    page = eviction_page(study)
    assert page is not None and page.notes and "the best any policy could do" in page.notes[0]
    import matplotlib.pyplot as plt

    plt.close(page.figure)


# ------------------------------------------------------------------ examples
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_study_runs_from_a_fresh_clone(path, monkeypatch):
    """Parsed from the repository root, as the examples say to run them: a trace it names lies
    inside the repository (no ../shared); its first run, on a few requests, runs."""
    from pagesim.reports.runner import run_one
    from pagesim.reports.spec import load_spec

    assert "../" not in path.read_text(), f"{path.name} reaches outside the repository"
    monkeypatch.chdir(ROOT)
    spec = load_spec(path.relative_to(ROOT), ["source.num_requests=12"], allow_plugins=True)
    runs = spec.runs()
    assert runs
    trace = runs[0]["source"].get("trace")
    if trace is not None:
        resolved = (ROOT / trace).resolve()
        assert resolved.is_relative_to(ROOT) and resolved.is_file(), trace
    record = run_one(runs[0])
    assert record["status"] == "ok", record.get("error")


def test_the_examples_sample_trace_is_pagesims_own_and_made_again_the_same(tmp_path, capsys):
    """``examples/traces/long-conversations.jsonl.gz`` is what the command in its README generates,
    byte for byte once decompressed: a synthetic trace, nothing copied from ``../shared``."""
    import gzip
    import re

    from pagesim.engine.cli import main

    readme = (ROOT / "examples" / "traces" / "README.md").read_text()
    command = re.search(r"pagesim trace gen (.*?) -o long-conversations\.jsonl", readme, re.S).group(1)
    argv = command.replace("\\\n", " ").split()
    assert main(["trace", "gen", *argv, "-o", str(tmp_path / "made.jsonl")]) == 0
    capsys.readouterr()
    shipped = gzip.decompress((ROOT / "examples" / "traces" / "long-conversations.jsonl.gz").read_bytes())
    assert (tmp_path / "made.jsonl").read_bytes() == shipped


def test_the_ideal_cache_reads_requests_in_the_order_given():
    """Row indices out of order are the order the requests reach the cache (priority scheduling):
    the same figures as a trace written in that order."""
    from pagesim.sim.ideal_cache import ideal_cache

    prompts = [[1, 2, 3], [7, 8, 9], [1, 2, 4], [7, 8, 5]]
    trace = _trace([(0.1 * k, p, 2) for k, p in enumerate(prompts)])
    order = np.array([1, 3, 0, 2])
    reordered = _trace([(0.1 * k, prompts[i], 2) for k, i in enumerate(order)])
    for capacity in (0, 1, 2, 8):
        assert ideal_cache(trace, PREFIX, capacity, order) == ideal_cache(reordered, PREFIX, capacity)
    assert ideal_cache(trace, PREFIX, 8, np.arange(4)) == ideal_cache(trace, PREFIX, 8)
