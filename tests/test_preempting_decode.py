"""``pagesim.engine.policy.fast_path.preempting_decode``: a decode step that must preempt, or that copies on write
after a parallel-sampling fork, leaves the policy's state exactly as ``schedule()`` + ``update()``
leave it, under every built-in victim policy, both preemption modes, with and without prefix
caching, and the simulator reports the same run.

The two schedulers of ``tests/test_fast_path_state.py`` (one step by step, one through the fast
path as the simulator takes it) take requests that outgrow a small pool; each case checks that
the fast path did take steps that preempt, so the comparison cannot pass without them.
"""

from __future__ import annotations

import pytest

from pagesim.engine.policy.fast_path import fast_forward as ff
from pagesim.engine.policy import Scheduler, make_config
from pagesim.engine.policy.fast_path import preempting_decode
from pagesim.engine.policy.scheduling.preemption import VICTIM_POLICIES
from tests.conftest import pure_python_only
from tests.test_fast_path_state import drive

pytestmark = pure_python_only("pagesim.engine.policy.scheduling.scheduler", "these tests deep-copy schedulers (test_fast_path_state.drive)")

#: Eight requests of different lengths arriving over eight steps, two with two parallel samples:
#: far more than 40 blocks of 4 hold.
SPEC = [(step, prompt, output, n) for step, (prompt, output, n) in
        enumerate([(9, 50, 1), (21, 40, 2), (5, 60, 1), (30, 35, 1), (13, 55, 2), (7, 45, 1), (25, 50, 1), (11, 40, 1)])]


def _preempting_steps(monkeypatch, name: str = "decodes_with_preemptions", what=lambda run, st: st.step,
                      after=None) -> list:
    """Count the fast path's preempting steps (``what`` of each call: its step number; ``name``:
    the ``vllm-v1`` or the ``vllm-v0`` running pass). With ``after``, each entry is
    ``after(run, st, result)`` instead, taken once the pass has run."""
    steps: list = []
    real = getattr(preempting_decode, name)

    def counted(run, st):
        if after is None:
            steps.append(what(run, st))
            return real(run, st)
        result = real(run, st)
        steps.append(after(run, st, result))
        return result

    monkeypatch.setattr(ff, name, counted)
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


#: ``SPEC``'s lengths with one sequence each: ``vllm-v0``'s decode steps preempt on the fast path
#: only for such batches (vLLM 0.6.3 cannot recompute a request with several running sequences).
SINGLE = [(step, prompt, output, 1) for step, prompt, output, _ in SPEC]


def _v0_config(mode: str, victim: str = "running-tail", num_cpu_blocks: int = 200, max_num_seqs: int = 256):
    return make_config("vllm-v0", block_size=4, num_gpu_blocks=40, max_model_len=256, num_cpu_blocks=num_cpu_blocks,
                       preemption_mode=mode, victim_policy=victim, max_num_seqs=max_num_seqs, record_decisions=False)


def _v0_steps(monkeypatch) -> list[tuple[int, int]]:
    """Count the fast path's ``vllm-v0`` preempting steps: (step, the batch's ``widest``)."""
    return _preempting_steps(monkeypatch, "decodes_with_v0_preemptions", lambda run, st: (st.step, run.widest))


@pytest.mark.parametrize("mode", ["vllm-v0", "swap"])
@pytest.mark.parametrize("victim", sorted(VICTIM_POLICIES))
def test_vllm_v0_preempting_steps_with_parallel_samples(monkeypatch, victim, mode):
    """Groups of two sequences (``SPEC``, PagedAttention's parallel sampling): while fewer blocks
    are free than two, every request is visited, and one whose two sequences are not covered
    preempts though it may allocate nothing or one block."""
    config = _v0_config(mode, victim)
    plain_mid, fast_mid = {}, {}
    plain = drive(config, SPEC, fast=False, max_steps=2_000, mid=plain_mid)
    preempting = _v0_steps(monkeypatch)
    fast = drive(config, SPEC, fast=True, max_steps=2_000, mid=fast_mid)
    assert any(widest == 2 for _, widest in preempting), "no preempting step with a group of two: untested"
    assert set(fast) <= set(plain)
    for step in sorted(fast):
        assert fast[step] == plain[step], f"state after step {step} differs"
    for step, _ in preempting:
        assert fast_mid[step] == plain_mid[step], f"state in the middle of step {step} differs"


def test_vllm_v0_recompute_of_a_group_stops_both_paths_alike(monkeypatch):
    """vLLM 0.6.3 cannot recompute a group of several running sequences (it asserts): with
    ``preemption_mode='recompute'`` and parallel samples both paths stop at the same step with
    the same error and the queues left alike, the fast path in its preempting step."""
    config = _v0_config("recompute")
    plain = drive(config, SPEC, fast=False, max_steps=2_000)
    preempting = _v0_steps(monkeypatch)
    fast = drive(config, SPEC, fast=True, max_steps=2_000)
    last = max(plain)
    assert plain[last][0] == "aborted" and "by recompute" in plain[last][1]
    assert max(fast) == last and preempting[-1][0] == last, "the fast path did not stop in its preempting step"
    for step in sorted(fast):
        assert fast[step] == plain[step], f"state after step {step} differs"


@pytest.mark.parametrize("max_num_seqs", [256, 4])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("victim", sorted(VICTIM_POLICIES))
def test_vllm_v0_preempting_steps_leave_the_state_of_step_by_step(monkeypatch, victim, mode, max_num_seqs):
    """vLLM 0.6.3's running pass (a block free per request, needed or not; victims from the
    requests after it) and its swapped pass after a step that preempted nothing; with
    ``max_num_seqs=4`` the prefill and swapped passes' heads are refused by the sequence budget
    too. With requests running, only a step that admits goes through ``schedule()``."""
    config = _v0_config(mode, victim, max_num_seqs=max_num_seqs)
    plain_mid, fast_mid = {}, {}
    plain = drive(config, SINGLE, fast=False, max_steps=2_000, mid=plain_mid)
    preempting = _preempting_steps(monkeypatch, "decodes_with_v0_preemptions")
    swapped_in, whole = [], []
    real_step, real_schedule = ff.schedule_decode_step, Scheduler.schedule

    def step_counted(run):
        step = real_step(run)
        if step is not None and step.output.swapped_in:
            swapped_in.append(step.output.step)
        return step

    def schedule_counted(s):
        running = bool(s.running)
        output = real_schedule(s)
        if running:  # (with nothing running there is no batch: schedule() swaps in or admits)
            whole.append(output)
        return output

    monkeypatch.setattr(ff, "schedule_decode_step", step_counted)
    monkeypatch.setattr(Scheduler, "schedule", schedule_counted)
    fast = drive(config, SINGLE, fast=True, max_steps=2_000, mid=fast_mid)
    assert preempting, "the fast path took no vllm-v0 step that preempts: the case tests nothing"
    if mode == "swap":
        assert swapped_in, "no decode step swapped a request in: its swapped pass is untested"
    assert all(out.new or out.resumed for out in whole), "a step that admits nothing went through schedule()"
    assert set(fast) <= set(plain)
    for step in sorted(fast):
        assert fast[step] == plain[step], f"state after step {step} differs"
    for step in preempting + swapped_in:  # (between the step's schedule and its update)
        assert fast_mid[step] == plain_mid[step], f"state in the middle of step {step} differs"


@pytest.mark.parametrize(("victim", "num_cpu_blocks"), [("running-tail", 12), ("fewest-blocks", 4)])
def test_vllm_v0_swap_space_running_out_stops_both_paths_alike(monkeypatch, victim, num_cpu_blocks):
    """Where vLLM 0.6.3 stops (a swap-out needs more CPU blocks than are free), the fast path's
    preempting step stops too, with the same error, the same step and the queues left alike
    (with ``fewest-blocks`` and 4 CPU blocks a victim of that step was swapped out before)."""
    config = _v0_config("swap", victim, num_cpu_blocks=num_cpu_blocks)
    plain = drive(config, SINGLE, fast=False, max_steps=2_000)
    preempting = _preempting_steps(monkeypatch, "decodes_with_v0_preemptions")
    fast = drive(config, SINGLE, fast=True, max_steps=2_000)
    last = max(plain)
    assert plain[last][0] == "aborted" and "CPU blocks" in plain[last][1]
    assert max(fast) == last and preempting[-1] == last, "the fast path did not stop in its preempting step"
    assert fast[last] == plain[last]
    for step in sorted(fast):
        assert fast[step] == plain[step], f"state after step {step} differs"


# ------------------------------------------------------------ a fork's first decode: copy on write
def _copying_steps(monkeypatch, v0: bool) -> list[int]:
    """The steps in which the fast path's running pass made copies on write (its batch had
    ``DecodeRun.copies``): the first decode after a parallel-sampling fork."""
    return _preempting_steps(monkeypatch, "decodes_with_v0_preemptions" if v0 else "decodes_with_preemptions",
                             lambda run, st: st.step if run.copies else None)


def _whole_steps(monkeypatch) -> list:
    """The outputs of the ``schedule()`` calls made with requests running."""
    whole: list = []
    real = Scheduler.schedule

    def counted(s):
        running = bool(s.running)
        output = real(s)
        if running:
            whole.append(output)
        return output

    monkeypatch.setattr(Scheduler, "schedule", counted)
    return whole


#: Parallel samples (n = 2 and 3) among single ones, in a roomy pool: every fork's first decode
#: writes into the prompt's partly filled last block, which its siblings share.
FORKS = [(0, 9, 30, 2), (0, 13, 25, 1), (2, 6, 40, 3), (3, 21, 20, 1), (5, 10, 35, 2), (9, 5, 30, 1)]


@pytest.mark.parametrize(("preset", "caching"), [("pagesim", False), ("pagesim", True), ("vllm-v1", True),
                                                 ("vllm-v0", False)])
def test_a_forks_first_decode_copies_on_the_fast_path(monkeypatch, preset, caching):
    """The step after a fork copies the shared block for all but the last sibling, as
    ``schedule()`` does, without a whole ``schedule()``: with requests running, only a
    ``vllm-v0`` step that admits (its prefills run alone) goes through it."""
    config = make_config(preset, block_size=4, num_gpu_blocks=200, max_model_len=256, enable_prefix_caching=caching,
                         record_decisions=False)
    plain_mid, fast_mid = {}, {}
    plain = drive(config, FORKS, fast=False, mid=plain_mid)
    copying = _copying_steps(monkeypatch, preset == "vllm-v0")
    whole = _whole_steps(monkeypatch)
    fast = drive(config, FORKS, fast=True, mid=fast_mid)
    copied = [step for step in copying if step is not None]
    assert len(copied) >= 3, f"the fast path copied on write in {copied} only: the case tests too little"
    assert all(out.new or out.resumed for out in whole), "a step that admits nothing went through schedule()"
    assert set(fast) <= set(plain)
    for step in sorted(fast):
        assert fast[step] == plain[step], f"state after step {step} differs"
    for step in copied:  # (between the step's schedule and its update)
        assert fast_mid[step] == plain_mid[step], f"state in the middle of step {step} differs"


@pytest.mark.parametrize("preset", ["pagesim", "vllm-v0"])
def test_copies_and_new_blocks_are_taken_in_scheduling_order(monkeypatch, preset):
    """A fork's copies come in its place in the running order: here before the new block of a
    request admitted after it, which reaches a block boundary in the same step."""
    config = make_config(preset, block_size=4, num_gpu_blocks=200, max_model_len=256, record_decisions=False)
    spec = [(0, 5, 20, 2), (0, 8, 20, 1)]  # (step 1: the fork's parent copies, then the other allocates)
    plain = drive(config, spec, fast=False)
    copying = _copying_steps(monkeypatch, preset == "vllm-v0")
    fast = drive(config, spec, fast=True)
    assert 1 in copying
    for step in sorted(fast):
        assert fast[step] == plain[step], f"state after step {step} differs"


#: Forks in small pools (found by a random search): their first decodes' copies take the last free
#: blocks or run out of them, so the pass counts the blocks the fork takes and preempts.
TIGHT_FORKS = [(11, "recompute", [(0, 10, 12, 3), (1, 19, 22, 1), (2, 2, 18, 1), (3, 5, 9, 2)]),
               (24, "swap", [(3, 18, 12, 2), (1, 22, 12, 3), (2, 1, 18, 1), (1, 21, 28, 2), (0, 24, 15, 3)])]


@pytest.mark.parametrize(("num_gpu_blocks", "mode", "spec"), TIGHT_FORKS)
def test_a_forks_copies_under_memory_pressure(monkeypatch, num_gpu_blocks, mode, spec):
    """``vllm-v1``'s running pass asks for the blocks a fork's first decode takes (of ``n``
    siblings writing into their shared block, ``n - 1`` copy: the last writes in place), preempts
    while they are more than are free, then copies; both paths alike, in pools where those steps
    run out of blocks."""
    config = make_config("vllm-v1", block_size=4, num_gpu_blocks=num_gpu_blocks, max_model_len=256,
                         num_cpu_blocks=64, preemption_mode=mode, record_decisions=False)
    plain_mid, fast_mid = {}, {}
    plain = drive(config, spec, fast=False, mid=plain_mid)
    # (step, victims, blocks left free) of each step whose batch copied on write (the pass makes
    # new runs: the one it was given keeps its copies)
    calls = _preempting_steps(monkeypatch, after=lambda run, st, result: (
        (st.step, len(result[3]), run.scheduler.pool.num_free_blocks) if run.copies else None))
    fast = drive(config, spec, fast=True, mid=fast_mid)
    copying = [call for call in calls if call is not None]
    copied = [step for step, _, _ in copying]
    assert any(victims or not free for _, victims, free in copying), \
        f"no copying step preempted or took the last free block ({copying}): the pool is not tight"
    assert set(fast) <= set(plain)
    for step in sorted(fast):
        assert fast[step] == plain[step], f"state after step {step} differs"
    for step in copied:
        assert fast_mid[step] == plain_mid[step], f"state in the middle of step {step} differs"
