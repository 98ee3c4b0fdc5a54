"""Equivalence with KV offloading on: the real engine in lockstep writes the simulator's decision
log, record for record, offload loads and stores included, and its tokens equal the no-paging
reference (validation mode: blocks either tier gave up are NaN).

The workloads are ``test_equivalence``'s, always with shared prefixes, prefix caching on, a GPU
pool too small to keep them, and an offload store of a drawn size and policy; the cases exclude,
as there, generated blocks whose content could coincide (``outputs_cannot_coincide``). Also: the
strategy reaches offload loads, stores and evictions, and the comparison fails when the engine's
offload store is one block smaller.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, find, given, settings
from hypothesis import strategies as st

from pagesim.engine.policy import make_config
from pagesim.reports.validation.compare import first_difference
from tests.conftest import scaled_examples
from tests.test_equivalence import Case, cases, check_equivalence, outputs_cannot_coincide, run_engine, simulate
from pagesim.traces.trace import Trace

POLICIES = ("lru", "arc", "lfu")


@st.composite
def offload_cases(draw) -> Case:
    case = draw(cases())
    assume(case.policy != "vllm-v0" and case.trace.has_prefix_ids)
    need = case.min_gpu_blocks
    settings_ = dict(case.settings, enable_prefix_caching=True,
                     num_offload_blocks=draw(st.sampled_from([1, 2, need // 2 + 1, need, 4 * need])),
                     offload_eviction_policy=draw(st.sampled_from(POLICIES)))
    return replace(case, settings=settings_)


def offload_mechanisms(log: list[dict]) -> set[str]:
    seen = set()
    for record in log:
        if record["blocks_to_load"]:
            seen.add("load")
        if record["blocks_to_store"]:
            seen.add("store")
        if any(record["offload_hits"].values()):
            seen.add("hit")
    return seen


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(25), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(offload_cases())
def test_engine_decisions_equal_simulator_with_offloading(case):
    check_equivalence(outputs_cannot_coincide(case))


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
def test_generated_cases_reach_offload_loads_stores_and_evictions():
    """Not vacuous: a fixed budget of draws (simulator only) loads, stores and hits from the
    store, and fills a small store so that it evicts."""
    seen: set[str] = set()

    def exercised(case: Case) -> bool:
        sim, _ = simulate(case)
        seen.update(offload_mechanisms(sim.log))
        stored = sum(len(r["blocks_to_store"]) for r in sim.log)
        if stored > case.settings["num_offload_blocks"]:
            seen.add("evict")
        return seen >= {"load", "store", "hit", "evict"}

    find(offload_cases(), exercised, settings=settings(max_examples=300, deadline=None, database=None, derandomize=True,
                                                        suppress_health_check=list(HealthCheck)))
    assert seen >= {"load", "store", "hit", "evict"}, seen


def test_comparison_fails_with_a_smaller_offload_store():
    """Teeth: an engine whose store holds one block fewer decides differently once it fills (a
    case the generated test found: eight one-block prompts, three sharing a prefix block, on a
    four-block pool and a two-block store)."""
    trace = Trace(arrival_s=np.zeros(8), prompt_len=np.array([1, 1, 1, 2, 3, 3, 3, 1]),
                  output_len=np.array([1, 1, 1, 1, 1, 1, 2, 2]), n=np.ones(8, dtype=np.int64),
                  prefix_id_values=np.array([1000, 2000, 100, 100, 100, 5000, 100, 6000, 100, 7000, 8000]),
                  prefix_id_offsets=np.array([0, 1, 2, 3, 4, 6, 8, 10, 11]), prefix_block_tokens=2)
    settings_ = dict(block_size=1, max_model_len=5, eviction_policy="fifo", preemption_mode="recompute",
                     victim_policy="fewest-blocks", enable_prefix_caching=True, enable_chunked_prefill=False,
                     max_num_batched_tokens=5, max_num_seqs=256, num_gpu_blocks=4, num_cpu_blocks=0,
                     num_offload_blocks=2, offload_eviction_policy="lru")
    case = Case(trace, "pagesim", settings_, cpu_step_s=1e-3, temperature=0.0)
    check_equivalence(case)  # the same store: identical
    sim, release = simulate(case)
    assert "load" in offload_mechanisms(sim.log)
    smaller = make_config("pagesim", record_decisions=True, **dict(settings_, num_offload_blocks=1))
    eng, _ = run_engine(case, release, smaller)
    diff = first_difference(sim.log, eng.log)
    assert diff is not None
    assert {"blocks_to_store", "blocks_to_load", "offload_hits", "num_free_offload_blocks"} & set(diff["differing_keys"])
