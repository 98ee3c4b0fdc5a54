"""The engine on models with sliding-window layers: a hybrid KV cache of layer groups in one pool.

Hypothesis draws workloads (shared prefixes, parallel samples, beams, chunked prefill, tight pools
that force recompute preemptions, every eviction policy) for ``tiny-swa`` (layer 0 slides over 16
tokens, layer 1 attends fully: two groups sharing one tensor) and for models whose every layer
slides (one group, Mistral 7B v0.1's layout) or whose window is shorter than a block. In
validation mode every block the policy releases, the ones that leave a window included, is
filled with NaN, so a kernel that reads a dropped block fails the run; the tokens must equal the
no-paging reference with the window applied (``pagesim.engine.model.dense``).
"""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagesim.engine.model import LlamaConfig, random_model
from pagesim.engine.policy import make_config
from pagesim.engine.policy.scheduling.admission import hybrid_blocks, longest_written_tokens
from pagesim.engine.policy.memory.eviction import EVICTION_POLICIES
from pagesim.engine.runtime import Engine, SamplingParams
from pagesim.engine.runtime.kv_cache import scheduler_kv_settings
from tests.conftest import scaled_examples
from tests.engine_support import prompt_of, request, serve

TINY_SWA = LlamaConfig.named("tiny-swa")
LAYOUTS = {
    "tiny-swa": TINY_SWA,
    "all-sliding": dataclasses.replace(TINY_SWA, name="tiny-all-sliding", sliding_window=9, layer_types=()),
    "short-window": dataclasses.replace(TINY_SWA, name="tiny-short-window", sliding_window=3,
                                        layer_types=("full", "sliding")),
}
SHARED_PREFIXES = [prompt_of(2000 + i, 24) for i in range(2)]


@cache
def model_of(layout: str):
    return random_model(LAYOUTS[layout], seed=0, dtype=torch.float64)


def engine_for(layout: str, sampling: SamplingParams, **settings) -> Engine:
    model = model_of(layout)
    config = make_config("vllm-v1", max_model_len=128, **scheduler_kv_settings(model.config), **settings)
    return Engine(model, config, backend="torch", validate=True, sampling=sampling)


@st.composite
def workloads(draw):
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    requests, release = [], {}
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["single", "single", "parallel", "beam"]))
        prompt = draw(st.sampled_from([[], *SHARED_PREFIXES])) + prompt_of(i, draw(st.integers(1, 30)))
        extra = {"parallel": {"n": draw(st.integers(2, 3))}, "beam": {"beam_width": 2}}.get(kind, {})
        requests.append(request(f"r{i}", prompt, draw(st.integers(1, 24)), **extra))
        release[f"r{i}"] = draw(st.integers(0, 6))
    chunked = draw(st.booleans())
    settings_ = dict(
        block_size=block_size, enable_chunked_prefill=chunked,
        max_num_batched_tokens=draw(st.integers(4, 40)) if chunked else 128,
        enable_prefix_caching=draw(st.booleans()), eviction_policy=draw(st.sampled_from(sorted(EVICTION_POLICIES))),
    )
    # The pool: what the largest request needs at its longest (so every request is served), plus
    # a little: tight pools preempt.
    probe = make_config("vllm-v1", max_model_len=128, **scheduler_kv_settings(LAYOUTS[layout]), **settings_)
    peak = max(hybrid_blocks(r, probe, longest_written_tokens(r, 128)) for r in requests)
    settings_["num_gpu_blocks"] = 1 + peak + draw(st.integers(0, 8))
    return layout, requests, release, settings_, draw(st.sampled_from([0.0, 0.8]))


@settings(max_examples=scaled_examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_windowed_engine_equals_the_no_paging_reference(case):
    layout, requests, release, settings_, temperature = case
    if any(r.beam_width > 1 for r in requests):
        temperature = 0.0
    engine = engine_for(layout, SamplingParams(temperature=temperature, seed=3), **settings_)
    report = serve(engine, requests, release)
    assert all(r.status == "completed" for r in engine.records.values()), {
        k: r.reject_reason for k, r in engine.records.items() if r.status != "completed"}
    assert report.match, report.to_dict()
    assert not engine.has_unfinished_requests
    engine.scheduler.check()
    assert engine.scheduler.pool.num_used_blocks == 0


def test_a_long_decode_with_preemptions_reads_only_its_window():
    """A fixed case that crosses the window many times under memory pressure."""
    engine = engine_for("tiny-swa", SamplingParams(), block_size=4, num_gpu_blocks=48,
                        enable_prefix_caching=True)
    requests = [request(f"r{i}", SHARED_PREFIXES[0] + prompt_of(50 + i, 10), 40) for i in range(4)]
    report = serve(engine, requests)
    assert report.match and report.checked_requests == 4, report.to_dict()
    assert engine.stats.preemptions["recompute"] > 0
    assert engine.scheduler.num_prefix_hit_tokens > 0


def test_the_window_changes_the_outputs():
    """Teeth: the same weights without the window generate other tokens, so matching the windowed
    reference is not an accident of a window that never matters."""
    from pagesim.engine.model.dense import DenseSequence

    model = model_of("short-window")
    unwindowed = random_model(dataclasses.replace(LAYOUTS["short-window"], sliding_window=None, layer_types=()),
                              seed=0, dtype=torch.float64)
    prompt = prompt_of(7, 40)
    a = DenseSequence(model).extend(prompt)[-1]
    b = DenseSequence(unwindowed).extend(prompt)[-1]
    assert not torch.allclose(a, b)


def test_a_scheduler_without_the_model_groups_is_refused():
    with pytest.raises(ValueError, match="layer groups with windows"):
        Engine(model_of("tiny-swa"), make_config("vllm-v1", max_model_len=128), backend="torch")
