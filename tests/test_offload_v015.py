"""vLLM 0.15's KV offloading connector (``offload_connector="0.15"``): what it does differently
from 0.33's, what its CPU manager's walks count, and what the cost model makes of them.

The two-tier content model of ``test_offload_state_machine`` runs both connectors (its workloads
draw one); here: a store is reported done only once its request has finished, generated blocks
are stored too, a lookup does not wait for blocks still being stored, a refused offer counts a
walk through every entry, the refusal shortcut decides exactly what the long way decides, and
the roofline prices the walks (beside the forward pass under asynchronous scheduling).
"""

from __future__ import annotations

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from pagesim.engine.policy import Request, Scheduler, make_config
from pagesim.engine.policy.offload.store import READY, STORING, OffloadStore
from pagesim.sim.cost.base import StepWork
from pagesim.sim.cost.connector_cpu import OFFLOAD_REFUSAL_S, OFFLOAD_SCAN_ENTRY_S, exposed_cpu_s
from tests.conftest import scaled_examples
from tests.test_offload_state_machine import Run, sampled_token, workloads


def scheduler(connector: str, **overrides) -> Scheduler:
    settings = dict(block_size=2, num_gpu_blocks=32, num_offload_blocks=64, offload_connector=connector)
    return Scheduler(make_config("vllm-v1", **{**settings, **overrides}))


def step(s: Scheduler):
    out = s.schedule()
    s.update(out, sampled_token)
    return out


def test_a_running_requests_stores_stay_pinned_until_it_finishes():
    s = scheduler("0.15")
    s.add_request(Request("a", 0, 6, prompt_token_ids=[1, 2, 3, 4, 5]))
    out = step(s)  # the prompt: two full blocks stored, their copies done at the step's end
    store = s.offload.store
    assert len(out.blocks_to_store) == 2
    assert sorted(store.state.values()) == [STORING, STORING]  # (done, but not reported: running)
    outs = [step(s)]
    while s.has_unfinished_requests:
        outs.append(step(s))
    assert sum(len(o.blocks_to_store) for o in outs) >= 1, "a generated block is stored too"
    assert s.offload.prompt_only is False
    assert set(store.state.values()) == {READY}, "the request finished: its stores are reported done"


def test_0_33_reports_a_store_done_at_the_end_of_its_step():
    s = scheduler("0.33")
    s.add_request(Request("a", 0, 6, prompt_token_ids=[1, 2, 3, 4, 5]))
    step(s)
    assert set(s.offload.store.state.values()) == {READY}


@pytest.mark.parametrize("connector, waits", [("0.33", True), ("0.15", False)])
def test_a_lookup_waits_for_blocks_being_stored_only_in_0_33(connector, waits):
    """b's prompt is a's, whose blocks are still being stored (0.15: pinned while a runs); the GPU
    cache is cleared so b must look in the store. 0.33 says "not yet"; 0.15 counts no hit."""
    s = scheduler(connector, num_gpu_blocks=8)
    s.add_request(Request("a", 0, 8, prompt_token_ids=[1, 2, 3, 4, 5]))
    out = s.schedule()  # (not updated yet: a's stores in flight in both versions)
    seq = Request("b", 0, 4, prompt_token_ids=[1, 2, 3, 4, 5]).seqs[0]
    assert out.blocks_to_store
    assert (s.offload.lookup(seq, 0) is None) == waits
    if not waits:
        assert s.offload.lookup(seq, 0) == ([], True)


def test_a_refused_offer_counts_a_walk_through_every_entry():
    store = OffloadStore(4)
    assert store.prepare_store(["k1", "k2", "k3", "k4"], "a", [0, 1, 2, 3]) is not None  # all pinned (storing)
    store.step_scan_entries = store.step_refusals = 0
    assert store.prepare_store(["k5", "k6"], "b", [0, 1]) is None
    assert (store.step_scan_entries, store.step_refusals, store.num_refused_blocks) == (4, 1, 2)
    store.complete_store(["k1", "k2", "k3"])
    assert store.prepare_store(["k5", "k6"], "b", [0, 1]) is not None  # two victims found
    assert (store.step_scan_entries, store.step_refusals) == (4 + 2, 1)


def test_the_connector_setting_is_checked():
    with pytest.raises(ValueError, match="offload_connector"):
        make_config("vllm-v1", num_offload_blocks=8, offload_connector="0.20")
    with pytest.raises(ValueError, match="0.15's connector loads asynchronously only"):
        make_config("vllm-v1", num_offload_blocks=8, offload_connector="0.15", offload_sync_load_budget_bytes=1024)


@st.composite
def saturated_workloads(draw):
    """Workloads of the state machine test on vLLM 0.15's connector with LRU and a small store,
    where offers are refused again and again."""
    preset, overrides, requests = draw(workloads(offload_policy="lru"))
    overrides.update(offload_connector="0.15", num_offload_blocks=draw(st.integers(1, 6)))
    return "vllm-v1", {**overrides, "preemption_mode": "recompute", "num_cpu_blocks": 0}, requests


@settings(max_examples=scaled_examples(100), deadline=None)
@given(saturated_workloads())
def test_the_refusal_shortcut_decides_what_the_long_way_decides(workload):
    preset, overrides, requests = workload
    note(f"overrides={overrides}")
    runs = []
    for shortcut in (True, False):
        original = Scheduler.__init__

        def init(self, config, *args, _shortcut=shortcut, **kwargs):
            original(self, config, *args, **kwargs)
            self.offload._shortcut_refusals = _shortcut and self.offload._shortcut_refusals

        Scheduler.__init__ = init
        try:
            run = Run(preset, overrides, requests, check=False)
        finally:
            Scheduler.__init__ = original
        store = run.scheduler.offload.store
        runs.append((run.jsonl(), store.num_refused_blocks, store.num_evictions))
    assert runs[0] == runs[1]


def test_a_saturated_store_takes_the_shortcut():
    """The property above has teeth only if the shortcut runs: on a small saturated case most
    refusals are counted by it, not by the store's own (long) refusal."""
    overrides = dict(block_size=1, num_gpu_blocks=24, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32,
                     num_offload_blocks=3, offload_eviction_policy="lru", offload_connector="0.15")
    s = Scheduler(make_config("vllm-v1", **overrides))
    store = s.offload.store
    long_way = []
    original = store.prepare_store
    store.prepare_store = lambda *a, **k: (lambda slots: (long_way.append(slots is None), slots)[1])(original(*a, **k))
    for i in range(4):
        s.add_request(Request(f"r{i}", 0, 8, prompt_token_ids=[10 * i + 1, 10 * i + 2]))
    refusals = 0
    while s.has_unfinished_requests:
        refusals += step(s).offload_refusals
    assert refusals > 2 * sum(long_way) > 0


def _roofline(overlap: float):
    from pagesim.engine.catalog.lookup import get_model_preset
    from pagesim.sim.cost.roofline import RooflineCostModel, RooflineParams
    from pagesim.sim.deployment import Deployment
    from pagesim.sim.hardware import get_gpu_preset

    deployment = Deployment(get_model_preset("llama3-8b"), get_gpu_preset("h100-sxm"))
    return RooflineCostModel(deployment, RooflineParams(scheduler_overlap=overlap))


def test_the_roofline_prices_the_walks_before_the_forward_pass_without_overlap():
    model = _roofline(0)
    work = StepWork(num_seqs=4, num_tokens=4, num_decode_seqs=4, decode_context_tokens=4000, num_sampled=4)
    plain = model.step_cost(work)
    walked = model.step_cost(StepWork(**{**{f: getattr(work, f) for f in work.__slots__},
                                         "offload_scan_entries": 100_000, "offload_refusals": 20}))
    extra = 100_000 * OFFLOAD_SCAN_ENTRY_S + 20 * OFFLOAD_REFUSAL_S
    assert walked.terms["cpu_overhead"] == pytest.approx(plain.terms["cpu_overhead"] + extra)
    assert {k: v for k, v in walked.terms.items() if k != "cpu_overhead"} == \
        {k: v for k, v in plain.terms.items() if k != "cpu_overhead"}


@pytest.mark.parametrize("entries", [1_000, 100_000, 1_000_000])
def test_under_asynchronous_scheduling_only_the_walks_beyond_the_forward_pass_show(entries):
    model = _roofline(1)
    p = model.params
    work = StepWork(num_seqs=4, num_tokens=4, num_decode_seqs=4, decode_context_tokens=4000, num_sampled=4)
    plain = model.step_cost(work)
    forward = sum(v for k, v in plain.terms.items() if k not in ("cpu_overhead", "swap"))
    walked = model.step_cost(StepWork(**{**{f: getattr(work, f) for f in work.__slots__},
                                         "offload_scan_entries": entries}))
    cpu = entries * OFFLOAD_SCAN_ENTRY_S + 4 * p.cpu_per_seq_s
    assert walked.terms["cpu_overhead"] == pytest.approx(p.cpu_step_s + max(0.0, cpu - forward))
    assert walked.total_s == pytest.approx(max(plain.total_s, p.cpu_step_s + cpu + plain.total_s - forward
                                               - p.cpu_step_s))
    assert exposed_cpu_s(3.0, 2.0, overlap=True) == 1.0 and exposed_cpu_s(1.0, 2.0, overlap=True) == 0.0
    assert exposed_cpu_s(1.0, 2.0, overlap=False) == 1.0
