"""Hypothesis: generated workloads under tight block budgets, every plug-in and preemption mode,
parallel sampling, beam search and shared prefixes; in validation mode (freed blocks are NaN) the
engine's tokens always equal the no-paging reference, and the policy's invariants hold at the end.

Examples are few by default (each runs a model); ``HYPOTHESIS_PROFILE=long`` runs ten times more.
"""

from __future__ import annotations

from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from pagesim.engine.policy.scheduling.admission import peak_blocks
from pagesim.engine.policy.memory.eviction import EVICTION_POLICIES
from pagesim.engine.policy.scheduling.preemption import VICTIM_POLICIES
from pagesim.engine.runtime import SamplingParams
from tests.conftest import scaled_examples
from tests.engine_support import make_engine, prompt_of, request, serve

SHARED_PREFIXES = [prompt_of(1000 + i, 12) for i in range(2)]


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    kinds = draw(st.lists(st.sampled_from(["single", "single", "parallel", "beam"]), min_size=1, max_size=5))
    requests, release = [], {}
    for i, kind in enumerate(kinds):
        prefix = draw(st.sampled_from([[], *SHARED_PREFIXES]))
        prompt = prefix + prompt_of(i, draw(st.integers(1, 20)))
        extra = {"parallel": {"n": draw(st.integers(2, 3))}, "beam": {"beam_width": draw(st.integers(2, 3))}}.get(kind, {})
        requests.append(request(f"r{i}", prompt, draw(st.integers(1, 12)), **extra))
        release[f"r{i}"] = draw(st.integers(0, 8))
    chunked = draw(st.booleans())
    max_model_len = 64
    settings_ = dict(
        block_size=block_size,
        max_model_len=max_model_len,
        preemption_mode=draw(st.sampled_from(["swap", "recompute", "vllm-v0"])),
        victim_policy=draw(st.sampled_from(sorted(VICTIM_POLICIES))),
        eviction_policy=draw(st.sampled_from(sorted(EVICTION_POLICIES))),
        enable_prefix_caching=draw(st.booleans()),
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=draw(st.integers(4, 48)) if chunked else max_model_len,
        num_cpu_blocks=draw(st.integers(0, 40)),
    )
    peak = max(peak_blocks(r, block_size, max_model_len) for r in requests)
    settings_["num_gpu_blocks"] = peak + draw(st.integers(0, 6))
    temperature = draw(st.sampled_from([0.0, 0.8]))
    return requests, release, settings_, temperature


@settings(max_examples=scaled_examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_engine_tokens_equal_the_no_paging_reference(case):
    requests, release, settings_, temperature = case
    if any(r.beam_width > 1 for r in requests):
        temperature = 0.0  # beam search is deterministic
    engine = make_engine(sampling=SamplingParams(temperature=temperature, seed=7), **settings_)
    report = serve(engine, requests, release)
    assert all(r.status == "completed" for r in engine.records.values()), {
        k: r.reject_reason for k, r in engine.records.items() if r.status != "completed"}
    assert report.match, report.to_dict()
    assert not engine.has_unfinished_requests
    engine.scheduler.check()
    assert engine.scheduler.pool.num_used_blocks == 0


def test_generated_cases_reach_every_mechanism():
    """The strategy is not vacuous: across a fixed set of draws, swaps, recomputes, copy-on-write
    copies and prefix hits all happen."""

    seen = set()

    def exercised(case) -> bool:
        requests, release, settings_, _ = case
        engine = make_engine(validate=False, **settings_)
        engine.run_lockstep(requests, release)
        stats = engine.stats
        for name, hit in (("swap", stats.preemptions["swap"]), ("recompute", stats.preemptions["recompute"]),
                          ("cow", stats.cow_copies), ("prefix", engine.scheduler.num_prefix_hit_tokens)):
            if hit:
                seen.add(name)
        return seen >= {"swap", "recompute", "cow", "prefix"}

    find(workloads(), exercised, settings=settings(max_examples=300, deadline=None, database=None, derandomize=True))
    assert seen == {"swap", "recompute", "cow", "prefix"}
