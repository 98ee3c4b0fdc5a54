"""KV offloading on the real engine: the offload store's CPU tensors hold the blocks the policy
stores, prefix hits on the CPU tier are served by copying them back, and in validation mode
(released GPU blocks, swap blocks and offload slots are NaN) the tokens equal the no-paging
reference under small GPU pools, with swap and recompute preemption and every offload policy.
A load replaced by a no-op, or a skipped store, is caught; so is ``pagesim run`` giving CPU-tier
hits with the reference matching.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pagesim.engine.cli import main
from pagesim.engine.policy.scheduling.admission import peak_blocks
from pagesim.engine.policy.plugins.user import builtin_names
from pagesim.engine.runtime import ExecutionError, SamplingParams
from pagesim.engine.runtime.kv_cache import PagedKVCache
from tests.conftest import scaled_examples
from tests.engine_support import make_engine, prompt_of, request, serve

PREFIXES = [prompt_of(900 + i, 16) for i in range(3)]
# Eight requests after three prefixes of four blocks (block size 4), two steps apart: twelve GPU
# blocks hold about one request, so prefixes leave the GPU between their uses and come back from
# the offload store (twelve slots: it evicts too); preemptions happen in either mode.
REQUESTS = [request(f"r{i}", PREFIXES[i % 3] + prompt_of(i, 3 + i % 4), 6 + 2 * (i % 3)) for i in range(8)]
RELEASE = {f"r{i}": 2 * i for i in range(8)}
SETTINGS = dict(block_size=4, num_gpu_blocks=12, num_cpu_blocks=20, num_offload_blocks=12)

BUILT_IN_POLICIES = builtin_names("kv_offloading_policy")  # (not plug-ins other tests registered)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_cpu_tier_hits_match_the_reference(mode):
    engine = make_engine(preemption_mode=mode, **SETTINGS)
    report = serve(engine, REQUESTS, RELEASE)
    sched, stats = engine.scheduler, engine.stats
    assert sched.num_offload_hit_tokens > 0 and stats.offload_loaded_blocks > 0 and stats.offload_stored_blocks > 0
    assert stats.preemptions[mode] > 0 and sched.offload.store.num_evictions > 0
    assert report.match and report.checked_requests == len(REQUESTS), report.to_dict()
    sched.check()


@st.composite
def workloads(draw):
    """Requests after 2-3 shared prefixes of 1-4 blocks, taking them mostly in turn (so a prefix
    is used again after the others have pushed it out of a GPU pool a few blocks above the
    largest request's peak), released a few steps apart, with a small offload store."""
    block_size = draw(st.sampled_from([2, 4, 8]))
    prefixes = [prompt_of(700 + 10 * i + block_size, block_size * draw(st.integers(1, 4)))
                for i in range(draw(st.integers(2, 3)))]
    requests, release, step = [], {}, 0
    for i in range(draw(st.integers(4, 8))):
        prefix = draw(st.sampled_from([prefixes[i % len(prefixes)]] * 3 + [[], *prefixes]))
        prompt = prefix + prompt_of(i, draw(st.integers(1, 8)))
        n = draw(st.sampled_from([1, 1, 1, 2]))
        requests.append(request(f"r{i}", prompt, draw(st.integers(1, 8)), n=n))
        step += draw(st.sampled_from([0, 1, 2, 4, 6]))
        release[f"r{i}"] = step
    max_model_len = 64
    chunked = draw(st.booleans())
    settings_ = dict(
        policy=draw(st.sampled_from(["pagesim", "vllm-v1"])),
        block_size=block_size,
        max_model_len=max_model_len,
        preemption_mode=draw(st.sampled_from(["swap", "recompute"])),
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=draw(st.integers(4, 48)) if chunked else max_model_len,
        num_cpu_blocks=draw(st.integers(4, 30)),
        num_offload_blocks=draw(st.integers(1, 24)),
        offload_eviction_policy=draw(st.sampled_from(BUILT_IN_POLICIES)),
        offload_prompt_only=draw(st.booleans()),
    )
    peak = max(peak_blocks(r, block_size, max_model_len) for r in requests)
    settings_["num_gpu_blocks"] = peak + 1 + draw(st.integers(0, 2))
    temperature = draw(st.sampled_from([0.0, 0.8]))
    return requests, release, settings_, temperature


@settings(max_examples=scaled_examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_offloading_engine_tokens_equal_the_no_paging_reference(case):
    requests, release, settings_, temperature = case
    engine = make_engine(sampling=SamplingParams(temperature=temperature, seed=7), **settings_)
    report = serve(engine, requests, release)
    assert all(r.status == "completed" for r in engine.records.values()), {
        k: r.reject_reason for k, r in engine.records.items() if r.status != "completed"}
    assert report.match, report.to_dict()
    assert not engine.has_unfinished_requests
    engine.scheduler.check()
    assert engine.scheduler.pool.num_used_blocks == 0


class _Reached(Exception):
    """Every mechanism was seen: stop drawing."""


def test_generated_cases_reach_offload_hits_evictions_and_preemptions():
    """The strategy is not vacuous: across a fixed set of draws, CPU-tier hits, offload-store
    evictions, and swap and recompute preemptions all happen."""
    seen = set()

    # NOTE: generation only and a fixed seed (no shrinking, which would rerun the draws), stopped
    # by an exception as soon as all four were seen.
    @settings(max_examples=200, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow])
    @given(workloads())
    def draw_until_all_seen(case):
        requests, release, settings_, _ = case
        engine = make_engine(validate=False, **settings_)
        engine.run_lockstep(requests, release)
        stats, sched = engine.stats, engine.scheduler
        for name, count in (("offload hit", sched.num_offload_hit_tokens),
                            ("eviction", sched.offload.store.num_evictions),
                            ("swap", stats.preemptions["swap"]), ("recompute", stats.preemptions["recompute"])):
            if count:
                seen.add(name)
        if len(seen) == 4:
            raise _Reached

    with pytest.raises(_Reached):
        draw_until_all_seen()
    assert seen == {"offload hit", "eviction", "swap", "recompute"}


@pytest.mark.parametrize("validate", [True, False])
def test_a_no_op_load_is_caught(monkeypatch, validate):
    """The hits are served from the offload tensors: without the copy, validation mode finds NaN
    where the loaded blocks should be, and without validation the tokens differ from the reference."""
    monkeypatch.setattr(PagedKVCache, "offload_load", lambda self, pairs: None)
    engine = make_engine(preemption_mode="recompute", validate=validate, **SETTINGS)
    if validate:
        with pytest.raises(ExecutionError, match="not finite: attention read KV memory the policy had released"):
            serve(engine, REQUESTS, RELEASE)
    else:
        report = serve(engine, REQUESTS, RELEASE)
        assert engine.scheduler.num_offload_hit_tokens > 0
        assert not report.match and report.mismatches


def test_a_skipped_store_is_caught(monkeypatch):
    """A slot the policy stored but the executor never wrote is still NaN when it is loaded."""
    monkeypatch.setattr(PagedKVCache, "offload_store", lambda self, pairs: None)
    engine = make_engine(preemption_mode="swap", **SETTINGS)
    with pytest.raises(ExecutionError, match="not finite"):
        serve(engine, REQUESTS, RELEASE)


def _watch_steps(engine, check) -> list:
    """Call ``check(output)`` right after each step's ``execute`` (before ``update`` frees blocks)."""
    execute = engine.runner.execute
    seen = []

    def watched(output, tokens_of):
        result = execute(output, tokens_of)
        check(output)
        seen.append(output)
        return result

    engine.runner.execute = watched
    return seen


def test_a_stored_slot_holds_the_gpu_block_it_came_from():
    engine = make_engine(preemption_mode="swap", **SETTINGS)
    cache = engine.cache

    def check(output):
        for gpu, slot in output.blocks_to_store:
            for layer in range(engine.model.config.num_layers):
                for gpu_cache, cpu_cache in ((cache.key_caches, cache.offload_key_caches),
                                             (cache.value_caches, cache.offload_value_caches)):
                    stored = cpu_cache[layer][slot]
                    assert torch.isfinite(stored).all() and torch.equal(stored, gpu_cache[layer][gpu].cpu())

    seen = _watch_steps(engine, check)
    serve(engine, REQUESTS, RELEASE)
    assert sum(len(out.blocks_to_store) for out in seen) == engine.stats.offload_stored_blocks > 0


def test_validation_mode_poisons_exactly_the_slots_without_a_key():
    """After every step, a slot the store holds a key for is finite and every other slot (never
    used, or evicted) is NaN: evictions are poisoned, and before a reused slot is written."""
    engine = make_engine(preemption_mode="recompute", **SETTINGS)
    cache, store = engine.cache, engine.scheduler.offload.store

    def check(output):
        for slot, key in enumerate(store.key_of):
            for caches in (cache.offload_key_caches, cache.offload_value_caches):
                for tensor in caches:
                    if key is None:
                        assert torch.isnan(tensor[slot]).all(), f"step {output.step}: free slot {slot} is not poisoned"
                    else:
                        assert torch.isfinite(tensor[slot]).all(), f"step {output.step}: slot {slot} lost its block"

    steps = _watch_steps(engine, check)
    serve(engine, REQUESTS, RELEASE)
    assert steps and store.num_evictions > 0


def test_a_step_without_sequences_still_makes_its_copies():
    engine = make_engine(block_size=4, num_gpu_blocks=8, num_offload_blocks=4, preemption_mode="recompute")
    cache = engine.cache
    empty = engine.scheduler.schedule()
    assert not empty.scheduled
    for tensor in cache.offload_key_caches + cache.offload_value_caches:
        tensor[2].fill_(2.0)
    for tensor in cache.key_caches + cache.value_caches:
        tensor[5].fill_(5.0)
    engine.runner.execute(replace(empty, blocks_to_load=((2, 3),), blocks_to_store=((5, 1),)), engine._tokens_of)
    for gpu_cache, cpu_cache in ((cache.key_caches, cache.offload_key_caches),
                                 (cache.value_caches, cache.offload_value_caches)):
        for gpu, cpu in zip(gpu_cache, cpu_cache):
            assert bool((gpu[3] == 2.0).all()) and bool((cpu[1] == 5.0).all())


def test_the_runner_refuses_a_slot_loaded_and_stored_in_one_step():
    engine = make_engine(block_size=4, num_gpu_blocks=8, num_offload_blocks=4, preemption_mode="recompute")
    empty = engine.scheduler.schedule()
    clash = replace(empty, blocks_to_load=((1, 2),), blocks_to_store=((3, 1),))
    with pytest.raises(ExecutionError, match=r"offload slot\(s\) \[1\] are both loaded from and stored to"):
        engine.runner.execute(clash, engine._tokens_of)


# ------------------------------------------------------------------ the CLI
RUN = ["run", "--model", "tiny", "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "64",
       "--prefix-repetition-suffix-len", "8", "--prefix-repetition-num-prefixes", "2",
       "--prefix-repetition-output-len", "4", "--num-prompts", "8", "--block-size", "8", "--num-gpu-blocks", "12",
       "--no-progress"]
OFFLOAD_KEYS = {"offload_hit_tokens", "offload_loaded_blocks", "offload_stored_blocks", "offload_evictions",
                "num_offload_blocks", "offload_eviction_policy"}


def test_pagesim_run_serves_cpu_tier_hits_equal_to_the_reference(capsys):
    # 0.001 GiB of float64 blocks of 8 tokens (8 KiB each) is 131 offload blocks
    assert main([*RUN, "--kv-offloading-size", "0.001", "--check-reference", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_offload_blocks"] == 131 and summary["offload_eviction_policy"] == "lru"
    assert 0 < summary["offload_hit_tokens"] <= summary["prefix_hit_tokens"]
    assert summary["offload_loaded_blocks"] >= summary["offload_hit_tokens"] // 8
    assert summary["offload_stored_blocks"] > 0
    assert summary["outputs_match_reference"] is True and summary["reference_mismatches"] == []
    assert summary["requests_completed"] == 8


@pytest.mark.parametrize("size", ["0.001", "0.0002"])
def test_pagesim_run_with_vllm_0_15s_connector_matches_the_reference(capsys, size):
    """vLLM 0.15's connector on the real engine: generated blocks stored too, stores pinned until
    their request finishes; a roomy store and one of 26 blocks the running requests fill."""
    assert main([*RUN, "--kv-offloading-size", size, "--offload-connector", "0.15", "--check-reference",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["outputs_match_reference"] is True and summary["reference_mismatches"] == []
    assert summary["requests_completed"] == 8 and summary["offload_stored_blocks"] > 0


def test_pagesim_run_without_offloading_reports_as_before(capsys):
    assert main([*RUN, "--num-prompts", "2", "--json"]) == 0
    assert not OFFLOAD_KEYS & set(json.loads(capsys.readouterr().out))
    assert main([*RUN, "--num-prompts", "2", "--num-offload-blocks", "8", "--policy", "vllm-v1"]) == 0
    assert "offloading   8 CPU blocks (lru)" in capsys.readouterr().out


@pytest.mark.parametrize("extra,message", [
    (["--prefix-caching", "off"], "KV offloading stores prefix-cache blocks by their keys: it needs prefix caching"),
    (["--num-offload-blocks", "-1"], "--num-offload-blocks must be >= 0"),
    (["--num-offload-blocks", "4000000000"],
     r"\+ [\d.]+ GiB for the KV cache, swap space and offload store; [\d.]+ GiB is available in RAM .*"
     r"--num-offload-blocks"),
])
def test_bad_offloading_flags_are_one_error_line(capsys, extra, message):
    import re

    with pytest.raises(SystemExit) as info:
        main([*RUN, "--kv-offloading-size", "0.001", *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim run: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert re.search(message, err), err
