"""Skip-ahead with sliding windows changes nothing either, bit for bit.

Two things are skipped here that ``tests/test_skip_ahead.py`` does not reach:

- a **hybrid KV cache** (sliding-window layer groups, ``pagesim/engine/policy/memory/hybrid_kv.py``), whose
  decodes drop the blocks that leave each window (``pagesim/engine/policy/fast_path/window_decode.py``): generated
  layouts (sliding then full, full then sliding, all sliding, several sliding groups, two
  windows), windows from one token to a few blocks, prefix caching with every retention rule,
  every eviction policy, pools tight enough to preempt, parallel samples;
- a **cost model with a sliding window** (``CostModel.attention_window``), whose windowed decode
  context stops growing at the window (``pagesim.sim.skip_ahead.window_contexts``): the roofline of a
  windowed model (vectorized and short-skip forms) and a model with no vectorized form, also
  over caches that keep every block (``--disable-hybrid-kv-cache-manager``).

Each pair of runs (skip-ahead off, on recording decisions, on not recording) must agree as in
``tests/test_skip_ahead.assert_same``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pagesim.engine.model_presets import get_model_preset
from pagesim.engine.policy.fast_path import fast_forward, window_decode
from pagesim.sim.cost.base import TERMS, StepCost, StepWork
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.deployment import Deployment
from pagesim.sim.hardware import get_gpu_preset
from pagesim.sim.skip_ahead import window_contexts
from tests.conftest import pure_python_only, scaled_examples
from tests.test_skip_ahead import (RUN_STATS, ContextCost, assert_same, check_carried_batches, decode_heavy, roofline,
                                   run, workloads)
from pagesim.traces.trace import Trace

COST_WINDOW = 24  # the windowed cost models' window: reached within the generated runs


def windowed_roofline() -> RooflineCostModel:
    """The roofline of gpt-oss-20b (half its layers sliding) with a window the runs reach."""
    model = replace(get_model_preset("gpt-oss-20b"), sliding_window=COST_WINDOW)
    return RooflineCostModel(Deployment(model, get_gpu_preset("a100-80gb"), 1))


class WindowedContextCost(ContextCost):
    """A decode term over both contexts and no vectorized form (skip-ahead asks step by step)."""

    name = "windowed context"
    attention_window = COST_WINDOW

    def step_cost(self, work: StepWork) -> StepCost:
        terms = dict(super().step_cost(work).terms)
        terms["decode_attention"] += 5e-6 * work.decode_window_context_tokens ** 1.2
        return StepCost(terms)


COSTS = [roofline, windowed_roofline, ContextCost, WindowedContextCost]


@st.composite
def hybrid_configs(draw, trace: Trace):
    preset = draw(st.sampled_from(["pagesim", "vllm-v1"]))
    bs = draw(st.sampled_from([1, 2, 4, 8]))
    window = draw(st.sampled_from([1, 3, bs, bs + 1, 2 * bs, 13, 32]))
    layout = draw(st.sampled_from(["sliding-full", "full-sliding", "all-sliding", "gemma", "two-windows"]))
    windows = {"sliding-full": (window, None), "full-sliding": (None, window), "all-sliding": (window,),
               "gemma": (window, window, window, None), "two-windows": (window, None, window + 5)}[layout]
    need = (trace.prompt_len + trace.output_len) * trace.n * len(windows)
    largest = int(need.max())
    slots = draw(st.sampled_from([largest + 2 * bs * len(windows), 2 * largest, int(need.sum()) + 64]))
    chunked = draw(st.booleans())
    settings_ = dict(block_size=bs, kv_group_windows=windows, reserve_null_block=True,
                     num_gpu_blocks=-(-slots // bs) + 1, max_model_len=256,
                     max_num_seqs=draw(st.sampled_from([2, 4, 256])), preemption_mode="recompute",
                     enable_prefix_caching=draw(st.booleans()),
                     eviction_policy=draw(st.sampled_from(["lru", "fifo", "lfu", "radix-leaf"])),
                     prefix_cache_retention_interval=draw(st.sampled_from([0, None, 4 * bs])),
                     enable_chunked_prefill=chunked,
                     max_num_batched_tokens=draw(st.sampled_from([8, 32, 512])) if chunked else 256)
    return preset, settings_


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_skip_ahead_with_sliding_windows_changes_no_decision_and_no_metric(data):
    trace = data.draw(workloads())
    preset, settings_ = data.draw(hybrid_configs(trace))
    cost = data.draw(st.sampled_from(COSTS))
    skipped = assert_same(trace, preset, settings_, cost)
    event("skipped steps" if skipped else "no step skipped")


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_windowed_cost_models_over_one_group_change_nothing(data):
    """A windowed model over a cache that keeps every block (vLLM's
    ``--disable-hybrid-kv-cache-manager``): the skipped steps' windowed contexts were once left at
    0, so their decode attention was too cheap."""
    from tests.test_skip_ahead import configs

    trace = data.draw(workloads())
    preset, settings_ = data.draw(configs(trace))
    assert_same(trace, preset, settings_, data.draw(st.sampled_from([windowed_roofline, WindowedContextCost])))


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_carried_hybrid_batch_is_the_batch_decode_batch_finds(data):
    """The batch ``advance`` and ``update_decode_step`` leave (drops counted) equals the one
    ``decode_batch`` builds from the scheduler's state."""
    trace = data.draw(workloads())
    preset, settings_ = data.draw(hybrid_configs(trace))
    carried = check_carried_batches(trace, preset, settings_, windowed_roofline())
    event("a carried batch was used" if carried else "no carried batch")


@pytest.mark.parametrize("windows", [(6, None), (None, 6), (6,), (6, 6, 6, None), (6, None, 11)])
@pytest.mark.parametrize("caching", [True, False])
def test_decode_heavy_hybrid_runs_mostly_skip_and_drop(windows, caching, monkeypatch):
    """Most steps are skipped, and the skipped steps do drop blocks behind the windows."""
    drops = Counter()
    real = window_decode.apply_hybrid_events

    def spy(events, e, through_step, seqs, computed, kv, counts):
        out = real(events, e, through_step, seqs, computed, kv, counts)
        drops["entries"] += sum(counts.dropped)
        return out

    monkeypatch.setattr(fast_forward, "apply_hybrid_events", spy)
    trace = single_samples(decode_heavy())
    settings_ = dict(block_size=4, kv_group_windows=windows, reserve_null_block=True, num_gpu_blocks=800,
                     max_model_len=256, enable_prefix_caching=caching)
    skipped = assert_same(trace, "pagesim", settings_, windowed_roofline)
    plain, _, _ = run(trace, "pagesim", settings_, windowed_roofline(), skip_ahead=False)
    assert skipped > 0.6 * plain.summary["steps"]
    assert drops["entries"] > 0


def single_samples(trace: Trace) -> Trace:
    """The trace with one sample per request (a hybrid cache skips only those: window_decode)."""
    return replace(trace, n=np.ones(len(trace), dtype=np.int64))


def test_tight_hybrid_pool_with_recomputes_still_identical():
    trace = single_samples(decode_heavy(16))
    settings_ = dict(block_size=4, kv_group_windows=(8, None), reserve_null_block=True, num_gpu_blocks=70,
                     max_model_len=256, enable_prefix_caching=True)
    skipped = assert_same(trace, "pagesim", settings_, windowed_roofline)
    plain, _, _ = run(trace, "pagesim", settings_, windowed_roofline(), skip_ahead=False)
    assert plain.summary["preemptions"]["recompute"] > 0 and skipped > 0


@pure_python_only("pagesim.sim.replica", "the test replaces queues_stay_refused, which the replica's loop calls")
def test_a_head_refused_for_blocks_does_not_stay_refused_under_windows(monkeypatch):
    """Drops free blocks, so a waiting head refused for blocks may fit a few steps later: skipping
    on as if it stayed refused (as it does without windows) delays its admission; caught. Four
    requests decode through a 16-token window (each holding 4 or 5 blocks as its window moves);
    the fifth waits for 8 free blocks, which it finds when the windows' drops run ahead."""
    trace = Trace(arrival_s=np.array([0.0027, 0.0066, 0.0118, 0.0127, 0.0482]),
                  prompt_len=np.array([12, 9, 4, 10, 30]), output_len=np.array([60, 50, 62, 69, 10]),
                  n=np.ones(5, dtype=np.int64), beam_width=np.ones(5, dtype=np.int64))
    settings_ = dict(block_size=4, kv_group_windows=(16,), reserve_null_block=True, num_gpu_blocks=25,
                     max_model_len=256, enable_prefix_caching=False, enable_chunked_prefill=False)
    assert assert_same(trace, "pagesim", settings_, windowed_roofline) > 0

    def without_the_window_rule(s):  # queues_stay_refused as it is without windows: "blocks" stays refused
        waiting, hint = s.waiting, s._pure_decode_step
        return not waiting or (hint is not None and hint[0] == s.next_step - 1 and not s._finished_in_last_update
                               and hint[1] in fast_forward.STABLE_WAITING_STOPS)

    monkeypatch.setattr("pagesim.sim.replica.queues_stay_refused", without_the_window_rule)
    with pytest.raises(AssertionError, match="decision record"):
        assert_same(trace, "pagesim", settings_, windowed_roofline)


@given(computed=st.lists(st.integers(0, 60), max_size=8), window=st.integers(1, 40), k=st.integers(1, 90))
def test_window_contexts_are_the_sums_of_min(computed, window, k):
    assert window_contexts(computed, window, k) == [sum(min(c + j, window) for c in computed) for j in range(1, k + 1)]


def test_roofline_windowed_decode_forms_match_step_cost():
    """The vectorized and Python forms of a windowed model's decode attention give ``step_cost``'s
    float, bit for bit (0 without context)."""
    model = windowed_roofline()
    for n, context, windowed in [(1, 7, 7), (3, 300, 60), (8, 5000, 192), (2, 0, 0)]:
        work = StepWork(num_seqs=n, num_tokens=n, num_decode_seqs=n, num_sampled=n, decode_context_tokens=context,
                        decode_window_context_tokens=windowed, block_size=16)
        expected = model.step_cost(work).terms["decode_attention"]
        assert model.decode_attention_fn(work)(context, windowed) == expected
        assert model.decode_attention_s(work, np.array([context]), np.array([windowed]))[0] == expected
    assert model.decode_attention_s(work, np.array([5])) is None  # (no windowed contexts: no form)


def summaries_with_and_without_skip_ahead(capsys, args: list[str]) -> list[dict]:
    """``pagesim`` ``args`` (a ``--json`` simulate) run twice, skip-ahead on then off: both summaries,
    less the wall time."""
    from pagesim.engine.cli import main

    summaries = []
    for flags in ([], ["--no-skip-ahead"]):
        assert main(args + flags) == 0
        summary = json.loads(capsys.readouterr().out)
        summary.pop("sim_wall_s")
        summaries.append(summary)
    return summaries


@pytest.mark.parametrize("extra", [[], ["--disable-hybrid-kv-cache-manager"], ["--enable-prefix-caching",
                                                                                 "--kv-cache-gb", "0.3"]])
def test_cli_summary_of_a_sliding_window_model_is_the_same_without_skip_ahead(capsys, extra):
    summaries = summaries_with_and_without_skip_ahead(
        capsys, ["simulate", "--model", "gpt-oss-20b", "--gpu", "h200", "--workload", "kwon2023-sharegpt", "--rate",
                 "8", "--num-requests", "60", "--json", "--no-progress", *extra])
    assert summaries[0] == summaries[1]
    assert set(TERMS) >= set(summaries[0]["time_by_term_s"])
