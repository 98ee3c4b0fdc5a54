"""``engine.policy.preempting_decode``: a decode step that must preempt leaves the policy's state
exactly as ``schedule()`` + ``update()`` leave it, under every built-in victim policy, both
preemption modes, with and without prefix caching, and the simulator reports the same run.

The two schedulers of ``tests/test_fast_path_state.py`` (one step by step, one through the fast
path as the simulator takes it) take requests that outgrow a small pool; each case checks that
the fast path did take steps that preempt, so the comparison cannot pass without them.
"""

from __future__ import annotations

import pytest

from engine.policy import fast_forward as ff
from engine.policy import make_config, preempting_decode
from engine.policy.preemption import VICTIM_POLICIES
from tests.test_fast_path_state import drive

#: Eight requests of different lengths arriving over eight steps, two with two parallel samples:
#: far more than 40 blocks of 4 hold.
SPEC = [(step, prompt, output, n) for step, (prompt, output, n) in
        enumerate([(9, 50, 1), (21, 40, 2), (5, 60, 1), (30, 35, 1), (13, 55, 2), (7, 45, 1), (25, 50, 1), (11, 40, 1)])]


def _preempting_steps(monkeypatch) -> list[int]:
    """Count the fast path's preempting steps (each call's step number)."""
    steps: list[int] = []
    real = preempting_decode.decodes_with_preemptions

    def counted(run, st):
        steps.append(st.step)
        return real(run, st)

    monkeypatch.setattr(ff, "decodes_with_preemptions", counted)
    return steps


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("victim", sorted(VICTIM_POLICIES))
def test_preempting_steps_leave_the_state_of_step_by_step(monkeypatch, victim, mode, caching):
    config = make_config("vllm-v1", block_size=4, num_gpu_blocks=40, max_model_len=256, num_cpu_blocks=200,
                         enable_prefix_caching=caching, preemption_mode=mode, victim_policy=victim,
                         record_decisions=False)  # (implicit decoders: the only batches that preempt in a step)
    plain_mid, fast_mid = {}, {}
    plain = drive(config, SPEC, fast=False, max_steps=2_000, mid=plain_mid)
    preempting = _preempting_steps(monkeypatch)
    fast = drive(config, SPEC, fast=True, max_steps=2_000, mid=fast_mid)
    assert preempting, "the fast path took no step that preempts: the case tests nothing"
    assert set(fast) <= set(plain)
    for step in sorted(fast):
        assert fast[step] == plain[step], f"state after step {step} differs"
    for step in preempting:  # (between the preempting step's schedule and its update)
        assert fast_mid[step] == plain_mid[step], f"state in the middle of step {step} differs"
