"""Skip-ahead changes nothing: the same run with and without it makes the same decisions and
measures the same metrics, bit for bit.

Generated workloads (requests with long enough outputs to decode for a while, parallel samples,
shared prefixes (the prefix identities of tests/test_sim_properties.py), arrivals at once, spread or in bursts) run under generated configurations
(presets pagesim / vllm-v1 / vllm-v0, first come first served or priority scheduling, block sizes, pools from tight to roomy so that requests are
preempted by swap or recompute, small batch limits and token budgets, chunked prefill on and off,
prefix caching on and off, every eviction policy) and two cost models: the roofline (vectorized
decode costs) and one with no vectorized form (skip-ahead asks it step by step). Each pair of runs
must agree on the decision log record for record, on every per-step metric column and every
per-request column, on every request's token runs (the steps it got tokens in: its ITLs), on the
summary and on the per-term cost totals.

Companion tests show that the generated runs do skip (most steps, on decode-heavy workloads) and
that the comparison has teeth: letting skip-ahead pass over a waiting request it has not seen
refused changes the decisions, and the comparison names the step.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pagesim.engine.policy import Scheduler, make_config
from pagesim.engine.policy.fast_path import fast_forward
from pagesim.engine.policy.scheduling.steps.vllm_v0 import VllmV0Abort
from pagesim.engine.policy.memory.swap_pool import SwapSpaceExhausted
from pagesim.sim.cost.base import TERMS, CostModel, StepCost, StepWork
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.deployment import Deployment
from pagesim.sim.hardware import get_gpu_preset
from pagesim.sim.metrics import STEP_COLUMNS
from pagesim.sim.simulator import SimOptions, Simulation
from pagesim.engine.model_presets import get_model_preset
from tests.conftest import pure_python_only, scaled_examples
from tests.test_sim_properties import shared_prefix_columns
from pagesim.traces.trace import Trace

REQUEST_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "output_tokens",
                   "generation_len", "preemptions", "status", "release_step")


class ContextCost(CostModel):
    """A cost with a decode term that grows with context and no vectorized form."""

    name = "context"

    def step_cost(self, work: StepWork) -> StepCost:
        terms = dict.fromkeys(TERMS, 0.0)
        if work.num_tokens:
            terms["linear"] = 0.01 + 1e-4 * work.num_tokens
        terms["decode_attention"] = 3e-6 * work.decode_context_tokens ** 1.1
        terms["cpu_overhead"] = 1e-3 / 3
        terms["swap"] = 0.002 * (work.num_swap_out_blocks + work.num_swap_in_blocks)
        return StepCost(terms)


class CountingCost(ContextCost):
    """Records its calls, as the calibrated model counts extrapolations (``usage_snapshot``)."""

    def __init__(self):
        self.calls = Counter()

    def step_cost(self, work: StepWork) -> StepCost:
        self.calls["decode" if work.num_decode_seqs == work.num_seqs else "other"] += 1
        return super().step_cost(work)

    def usage_snapshot(self) -> Counter:
        return Counter(self.calls)

    def restore_usage(self, snapshot: Counter) -> None:
        self.calls.clear()
        self.calls.update(snapshot)


def roofline() -> RooflineCostModel:
    return RooflineCostModel(Deployment(get_model_preset("llama3-8b"), get_gpu_preset("a100-80gb"), 1))


@st.composite
def workloads(draw) -> Trace:
    num = draw(st.integers(1, 10))
    pattern = draw(st.sampled_from(["once", "spread", "bursts"]))
    if pattern == "once":
        arrivals = [0.0] * num
    elif pattern == "spread":
        arrivals = sorted(draw(st.lists(st.floats(0.0, 2.0), min_size=num, max_size=num)))
    else:
        arrivals = sorted(draw(st.lists(st.sampled_from([0.0, 0.05, 0.4, 1.0]), min_size=num, max_size=num)))
    prompts = draw(st.lists(st.integers(1, 40), min_size=num, max_size=num))
    outputs = draw(st.lists(st.integers(1, 80), min_size=num, max_size=num))
    n = draw(st.lists(st.sampled_from([1, 1, 1, 2, 3]), min_size=num, max_size=num))
    columns = shared_prefix_columns(draw, prompts, max_shared_blocks=6) if draw(st.booleans()) else {}
    # (priorities, read under scheduling_policy "priority"; ties common, so arrival time and id decide too)
    priority = draw(st.lists(st.integers(0, 2), min_size=num, max_size=num))
    return Trace(arrival_s=np.array(arrivals), prompt_len=np.array(prompts), output_len=np.array(outputs),
                 n=np.array(n), beam_width=np.ones(num, dtype=np.int64), priority=np.array(priority), **columns)


@st.composite
def configs(draw, trace: Trace):
    preset = draw(st.sampled_from(["pagesim", "pagesim", "vllm-v1", "vllm-v0"]))
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    need = (trace.prompt_len + trace.output_len) * trace.n
    largest = int(need.max())
    slots = draw(st.sampled_from([largest + 2 * block_size, 2 * largest, int(need.sum()) + 64]))
    settings_ = dict(block_size=block_size, num_gpu_blocks=-(-slots // block_size) + 1,
                     max_model_len=256, max_num_seqs=draw(st.sampled_from([2, 4, 256])))
    settings_["num_cpu_blocks"] = draw(st.sampled_from([0, 64]))
    if preset != "vllm-v0":
        settings_["preemption_mode"] = draw(st.sampled_from(["recompute", "swap"]))
        settings_["enable_prefix_caching"] = draw(st.booleans())
        settings_["eviction_policy"] = draw(st.sampled_from(["lru", "fifo", "lfu", "radix-leaf"]))
        if settings_["enable_prefix_caching"]:  # now and then a second tier (pagesim/engine/policy/offload)
            settings_["num_offload_blocks"] = draw(st.sampled_from([0, 0, 2, 16, 256]))
            settings_["offload_eviction_policy"] = draw(st.sampled_from(["lru", "arc", "lfu"]))
            if settings_["num_offload_blocks"]:
                # loads asynchronous (vLLM's default: requests parked), or synchronous within a budget
                settings_["offload_sync_load_budget_bytes"] = draw(st.sampled_from([0, 0, 2**40]))
                settings_["offload_block_bytes"] = 2**20
        chunked = draw(st.booleans())
        settings_["enable_chunked_prefill"] = chunked
        settings_["max_num_batched_tokens"] = draw(st.sampled_from([8, 32, 512])) if chunked else 256
        if draw(st.booleans()):  # vLLM 0.33's priority scheduling (recompute only, no offload store with it)
            settings_.update(scheduling_policy="priority", num_offload_blocks=0, preemption_mode="recompute",
                             offload_sync_load_budget_bytes=0)
    else:  # (vLLM 0.6.3 has no prefix caching here; its own preemption mode, swap or recompute)
        settings_["preemption_mode"] = draw(st.sampled_from(["vllm-v0", "swap", "recompute"]))
        chunked = draw(st.booleans())
        settings_["enable_chunked_prefill"] = chunked
        settings_["max_num_batched_tokens"] = draw(st.sampled_from([8, 32, 512])) if chunked else 256
    return preset, settings_


def run(trace: Trace, preset: str, settings_: dict, cost_model: CostModel, *, skip_ahead: bool,
        record: bool = True):
    """The run's result (or the error it stopped with: vLLM 0.6.3's aborts), decision log lines
    (none unless ``record``) and steps skipped."""
    config = make_config(preset, **settings_, record_decisions=record)
    lines: list[str] = []
    sim = Simulation(trace, Scheduler(config), cost_model, SimOptions(skip_ahead=skip_ahead, seed=3),
                     decision_sink=lines.append)
    try:
        result = sim.run()
    except (SwapSpaceExhausted, VllmV0Abort) as exc:
        result = exc
    RUN_STATS["past_finish"] = sim.replica.skips_past_finish
    RUN_STATS["pool"] = sim.replica.scheduler.pool
    RUN_STATS["token_runs"] = sim.replica.token_runs.runs(sim.replica.index, np.arange(len(trace))).tolist()
    return result, lines, sim.replica.steps_skipped


RUN_STATS: dict = {}  # of the last run(): how often a skip went on past a finish, its block pool, its token runs


def pool_state(pool) -> tuple:
    """Which block ids went where: every free block in the order it would be taken, and the evictions."""
    return pool.free_block_order(), pool.num_evictions


def assert_same(trace: Trace, preset: str, settings_: dict, cost_model_factory) -> int:
    """Run with and without skip-ahead and compare everything; returns the steps skipped. The
    skip-ahead run is made twice: recording decisions (compared record for record) and, as a
    simulation runs by default, not recording them (its skips take the bulk paths, e.g.
    ``apply_in_bulk``), compared on everything else."""
    plain, plain_log, none_skipped = run(trace, preset, settings_, cost_model_factory(), skip_ahead=False)
    plain_runs = RUN_STATS["token_runs"]
    fast, fast_log, skipped = run(trace, preset, settings_, cost_model_factory(), skip_ahead=True)
    assert none_skipped == 0
    for i, (a, b) in enumerate(zip(plain_log, fast_log)):
        assert a == b, f"decision record {i} differs:\n{a}\n{b}"
    assert len(plain_log) == len(fast_log)
    assert RUN_STATS["token_runs"] == plain_runs, "the requests got their tokens in other steps"
    fast_pool = pool_state(RUN_STATS["pool"])
    quiet, _, quiet_skipped = run(trace, preset, settings_, cost_model_factory(), skip_ahead=True, record=False)
    assert quiet_skipped == skipped
    assert RUN_STATS["token_runs"] == plain_runs, "the requests got their tokens in other steps (bulk paths)"
    assert pool_state(RUN_STATS["pool"]) == fast_pool, "the pool ends in another state when decisions are not recorded"
    assert_same_results(plain, fast)
    assert_same_results(plain, quiet)
    return skipped


def assert_same_results(plain, fast) -> None:
    """Two runs' results agree on every step and request column, the term totals and the summary
    (or both runs stopped with the same error)."""
    if isinstance(plain, Exception) or isinstance(fast, Exception):  # both must stop, the same way
        assert repr(plain) == repr(fast)
        return
    for name in STEP_COLUMNS:
        a, b = plain.steps.array(name), fast.steps.array(name)
        assert a.shape == b.shape and np.array_equal(a, b), f"step column {name} differs"
    for name in REQUEST_COLUMNS:
        a, b = getattr(plain.requests, name), getattr(fast.requests, name)
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), f"request column {name} differs"
    assert plain.requests.reject_reasons == fast.requests.reject_reasons
    assert plain.steps.term_totals_s == fast.steps.term_totals_s
    assert json.dumps(plain.summary, sort_keys=True) == json.dumps(fast.summary, sort_keys=True)


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_skip_ahead_changes_no_decision_and_no_metric(data):
    trace = data.draw(workloads())
    preset, settings_ = data.draw(configs(trace))
    cost = data.draw(st.sampled_from([roofline, ContextCost]))
    skipped = assert_same(trace, preset, settings_, cost)
    event("skipped steps" if skipped else "no step skipped")
    event("a skip went on past a finish" if RUN_STATS["past_finish"] else "no skip past a finish")


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_carried_batch_is_the_batch_decode_batch_finds(data):
    """The batch ``advance`` and ``update_decode_step`` leave for the next ``decode_batch`` equals,
    field for field, the one ``decode_batch`` builds from the scheduler's state (checked at every
    call of generated runs)."""
    trace = data.draw(workloads())
    preset, settings_ = data.draw(configs(trace))
    carried = check_carried_batches(trace, preset, settings_, roofline())
    event("a carried batch was used" if carried else "no carried batch")


@settings(max_examples=scaled_examples(200), deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.integers(0, 3))
def test_the_least_finish_steps_are_counted_and_found_from_the_heap(steps, pops):
    """``_least_count`` (the entries equal to a heap's least, found from its root) and
    ``_places_of`` agree with ``list.count`` and the places in the list, after pops too."""
    import heapq

    heap = steps.copy()
    heapq.heapify(heap)
    left = steps.copy()
    for _ in range(min(pops, len(heap) - 1)):
        left.remove(heapq.heappop(heap))
    least = heap[0]
    assert fast_forward._least_count(heap, least) == left.count(least)
    assert fast_forward._places_of(left, least, left.count(least)) == [i for i, v in enumerate(left) if v == least]


#: The fields a carried ``DecodeRun`` must share with one ``decode_batch`` builds afresh.
CARRIED_FIELDS = ("requests", "seqs", "computed", "finish_at", "first_finish", "max_steps", "free_blocks",
                  "plain_free_blocks", "used_blocks", "cached_blocks", "table_blocks", "dropped_entries",
                  "context_tokens", "step")


def check_carried_batches(trace: Trace, preset: str, settings_: dict, cost_model) -> int:
    """Run with skip-ahead (decisions not recorded), comparing at every ``decode_batch`` call that
    takes the carried batch each ``CARRIED_FIELDS`` with the batch built from the scheduler's
    state; returns how many carried batches were taken."""
    build = fast_forward.decode_batch
    carried_calls = []

    def checked(s):
        carried = s._decode_run
        got = build(s)
        if carried is not None and got is carried:
            fresh = build(s)  # (the carried batch is taken: this one is built from the state)
            assert fresh is not None
            for name in CARRIED_FIELDS:
                assert getattr(got, name) == getattr(fresh, name), f"carried {name} differs"
            heap = got.finish_heap  # (kept in place as the batch changes: the same steps as finish_at)
            assert heap is not None and sorted(heap) == sorted(got.finish_at) and heap[0] == min(got.finish_at)
            if got.tokens is not None:  # (derived from the batch it was carried from)
                assert list(got.tokens.items()) == [(r.request_id, len(r.live_seqs)) for r in got.requests]
            if got.carried_from is not None:  # its requests: those less the completed ones, plus the joined
                assert [r for r in got.carried_from if r.live_seqs] + list(got.joined) == got.requests
            carried_calls.append(1)
        return got

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pagesim.sim.replica.decode_batch", checked)
        run(trace, preset, settings_, cost_model, skip_ahead=True, record=False)
    return len(carried_calls)


def decode_heavy(num: int = 12) -> Trace:
    rng = np.random.default_rng(7)
    return Trace(arrival_s=np.sort(rng.uniform(0, 1.0, num)), prompt_len=rng.integers(5, 40, num),
                 output_len=rng.integers(40, 120, num), n=np.where(rng.random(num) < 0.3, 2, 1),
                 beam_width=np.ones(num, dtype=np.int64))


@pytest.mark.parametrize("cost", [roofline, ContextCost])
@pytest.mark.parametrize("caching", [True, False])
def test_decode_heavy_runs_mostly_skip(cost, caching):
    trace = decode_heavy()
    settings_ = dict(block_size=4, num_gpu_blocks=400, max_model_len=256, enable_prefix_caching=caching)
    skipped = assert_same(trace, "pagesim", settings_, cost)
    assert RUN_STATS["past_finish"] > 0  # (of the skip-ahead run, the second)
    plain, _, _ = run(trace, "pagesim", settings_, cost(), skip_ahead=False)
    assert skipped > 0.7 * plain.summary["steps"]


@pure_python_only("pagesim.sim.skip_ahead", "the test counts the calls it makes to _plan_short")
@pytest.mark.parametrize("short_skip", [0, 10**9])
def test_either_way_of_costing_a_skip_changes_nothing(short_skip, monkeypatch):
    """Every skip costed with numpy (``SHORT_SKIP`` 0), or every one in Python floats: the same
    decisions and metrics as step by step, so both paths are checked whatever the default."""
    import pagesim.sim.skip_ahead

    monkeypatch.setattr(pagesim.sim.skip_ahead, "SHORT_SKIP", short_skip)
    calls = Counter()
    plan_short = pagesim.sim.skip_ahead._plan_short

    def counted(*args, **kwargs):
        calls["short"] += 1
        return plan_short(*args, **kwargs)

    monkeypatch.setattr(pagesim.sim.skip_ahead, "_plan_short", counted)
    trace = decode_heavy()
    skipped = assert_same(trace, "pagesim", dict(block_size=4, num_gpu_blocks=400, max_model_len=256), roofline)
    assert skipped > 0 and (calls["short"] > 0) == (short_skip > 0)


class CalledDecodeRoofline(RooflineCostModel):
    """The roofline with its decode attention function wrapped, so that ``_plan_short`` calls it
    (as for a model whose function is not linear in the context) instead of writing it out."""

    def decode_attention_fn(self, work):
        linear = super().decode_attention_fn(work)
        assert linear.linear_in_context  # (the written-out path is what the other tests take)
        return lambda context, window_context: linear(context, window_context)


def test_short_skips_that_call_the_decode_function_change_nothing(monkeypatch):
    """``_plan_short``'s loop for a decode attention function it must call (every skip costed
    in Python floats)."""
    import pagesim.sim.skip_ahead

    monkeypatch.setattr(pagesim.sim.skip_ahead, "SHORT_SKIP", 10**9)
    model = lambda: CalledDecodeRoofline(Deployment(get_model_preset("llama3-8b"), get_gpu_preset("a100-80gb"), 1))  # noqa: E731
    skipped = assert_same(decode_heavy(), "pagesim", dict(block_size=4, num_gpu_blocks=400, max_model_len=256), model)
    assert skipped > 0


def test_skipping_counts_only_the_steps_it_takes():
    """Skip-ahead costs steps it may not take (up to the next arrival); a model that records its
    calls (the calibrated model's extrapolation counts) must end with the step-by-step counts."""
    trace = decode_heavy()
    settings_ = dict(block_size=4, num_gpu_blocks=400, max_model_len=256)
    counts = []
    for skip_ahead in (False, True):
        cost = CountingCost()
        _, _, skipped = run(trace, "pagesim", settings_, cost, skip_ahead=skip_ahead)
        counts.append((cost.calls, skipped > 0))
    assert counts[0][0] == counts[1][0] and counts[1][1]


def test_tight_pool_with_preemptions_still_identical():
    trace = decode_heavy(16)
    settings_ = dict(block_size=4, num_gpu_blocks=60, num_cpu_blocks=64, max_model_len=256,
                     preemption_mode="swap")
    skipped = assert_same(trace, "pagesim", settings_, roofline)
    plain, _, _ = run(trace, "pagesim", settings_, roofline(), skip_ahead=False)
    assert plain.summary["preemptions"]["swap"] > 0 and skipped > 0


@pure_python_only("pagesim.sim.skip_ahead", "the test spies on the advance() calls it makes")
@pytest.mark.parametrize("preset, mode", [("pagesim", "swap"), ("pagesim", "recompute"), ("vllm-v0", "vllm-v0")])
def test_skips_while_requests_are_swapped_out_or_waiting_under_either_order(preset, mode, monkeypatch):
    """Steps are skipped, identically, while a request waits or is swapped out (its queue's head
    refused for a reason decodes cannot change), under both step orders."""
    import pagesim.sim.skip_ahead

    queues = Counter()
    real = fast_forward.advance

    def spy(run_, k):
        s = run_.scheduler
        queues["swapped" if s.swapped else "waiting" if s.waiting else "empty"] += 1
        return real(run_, k)

    monkeypatch.setattr(pagesim.sim.skip_ahead, "advance", spy)
    trace = decode_heavy(16)
    settings_ = dict(block_size=4, num_gpu_blocks=60, num_cpu_blocks=256, max_model_len=256, preemption_mode=mode)
    assert assert_same(trace, preset, settings_, roofline) > 0
    assert queues["swapped" if mode == "swap" else "waiting"] > 0, queues
    if mode == "vllm-v0":  # (vLLM 0.6.3 swaps a multi-sequence request out, recomputes the rest)
        assert queues["swapped"] > 0, queues


def test_an_abort_between_steps_ends_a_refusal():
    """An aborted request frees blocks and batch room: the queue heads refused before may fit."""
    from pagesim.engine.policy import Request

    s = Scheduler(make_config("pagesim", block_size=4, num_gpu_blocks=12, max_model_len=256, max_num_seqs=1))
    s.add_request(Request("a", 8, 40))
    s.add_request(Request("b", 8, 40))
    for _ in range(3):  # "a" decodes; "b" waits at the batch limit
        s.update(s.schedule())
    assert s.waiting and fast_forward.queues_stay_refused(s)
    s.abort_request("a")
    assert not fast_forward.queues_stay_refused(s)


def test_comparison_has_teeth(monkeypatch):
    """Skipping over a waiting request nobody has refused yet delays its admission: caught."""
    trace = Trace(arrival_s=np.array([0.0, 0.35]), prompt_len=np.array([8, 8]), output_len=np.array([60, 5]),
                  n=np.ones(2, dtype=np.int64), beam_width=np.ones(2, dtype=np.int64))
    settings_ = dict(block_size=4, num_gpu_blocks=100, max_model_len=256)
    assert_same(trace, "pagesim", settings_, roofline)
    monkeypatch.setattr(fast_forward, "STABLE_WAITING_STOPS", fast_forward.STABLE_WAITING_STOPS | {"empty"})
    with pytest.raises(AssertionError, match="decision record"):
        assert_same(trace, "pagesim", settings_, ContextCost)


@pytest.mark.parametrize("extra", [[], ["--replicas", "3", "--router", "least-kv"]])
def test_cli_summary_is_the_same_without_skip_ahead(capsys, extra):
    from pagesim.engine.cli import main

    args = ["simulate", "--workload", "kwon2023-sharegpt", "--rate", "8", "--num-requests", "60", "--json", "--no-progress", *extra]
    summaries = []
    for flags in ([], ["--no-skip-ahead"]):
        assert main(args + flags) == 0
        summary = json.loads(capsys.readouterr().out)
        summary.pop("sim_wall_s")  # the one figure that should differ
        summaries.append(summary)
    assert summaries[0] == summaries[1]


# ----------------------------------------------------------------------------- lazy block keys
# The fast path also registers blocks whose content is unique to their sequence with lazy keys
# (KVCacheManager.lazy_from); the reference path (skip-ahead off) makes every key when due.

def recompute_hits_own_blocks() -> tuple[Trace, dict]:
    """A tight pool, recompute preemption and prefix caching: preempted requests come back and
    hit blocks they registered themselves (lazily, on the fast path)."""
    trace = decode_heavy(16)
    trace = Trace(arrival_s=trace.arrival_s, prompt_len=trace.prompt_len, output_len=trace.output_len,
                  n=np.ones(16, dtype=np.int64), beam_width=trace.beam_width)
    settings_ = dict(block_size=4, num_gpu_blocks=60, max_model_len=256, preemption_mode="recompute",
                     enable_prefix_caching=True)
    return trace, settings_


def own_hits(log: list[str]) -> int:
    return sum(sum(json.loads(line)["resumed_cached"].values()) for line in log)


@pytest.mark.parametrize("eviction", ["lru", "fifo", "lfu"])
def test_recomputed_requests_hit_their_own_lazily_keyed_blocks(eviction):
    trace, settings_ = recompute_hits_own_blocks()
    settings_["eviction_policy"] = eviction
    assert_same(trace, "pagesim", settings_, roofline)
    _, log, _ = run(trace, "pagesim", settings_, roofline(), skip_ahead=True)
    assert own_hits(log) > 0


@pure_python_only("pagesim.engine.policy.memory.kv_manager", "the test replaces a KVCacheManager method its own methods call")
def test_lazy_keys_comparison_has_teeth(monkeypatch):
    """A lazily keyed block that never gets its real key cannot be found by its recomputed owner:
    fewer hits, other decisions; caught."""
    from pagesim.engine.policy.memory.kv_manager import KVCacheManager

    trace, settings_ = recompute_hits_own_blocks()
    monkeypatch.setattr(KVCacheManager, "_materialize", lambda self, seq: None)
    with pytest.raises(AssertionError, match="decision record"):
        assert_same(trace, "pagesim", settings_, roofline)


def test_lazy_keys_only_where_content_is_unique():
    """Named prompts keep eager keys (another request may share them); a prompt of unique content
    is lazy from block 0; one with prefix identities from the first block past them; n > 1 never."""
    from pagesim.engine.policy import Request
    from pagesim.engine.policy.memory.block_pool import LAZY_KEY
    from pagesim.engine.policy.memory.kv_manager import NEVER

    config = make_config("pagesim", block_size=4, num_gpu_blocks=64, max_model_len=256, enable_prefix_caching=True)
    sched = Scheduler(config)
    kv = sched.kv
    assert kv.lazy_keys
    cases = [(Request("a", prompt_len=10, max_tokens=4), 0),
             (Request("b", prompt_len=10, max_tokens=4, prefix_block_ids=(7,), prefix_block_tokens=4), 1),
             (Request("c", prompt_len=10, max_tokens=4, prompt_token_ids=list(range(10))), NEVER),
             (Request("d", prompt_len=10, max_tokens=4, n=2), NEVER)]
    for request, expected in cases:
        seq = request.seqs[0]
        assert kv.lazy_from(seq) == expected, request.request_id
    request = cases[0][0]
    assert sched.add_request(request)
    out = sched.schedule()
    assert out.num_scheduled_tokens["a"] == 10
    table = request.seqs[0].block_table
    assert [sched.pool.keys[b] is LAZY_KEY for b in table] == [True, True, False]
