"""The fast path leaves the policy's state exactly as ``schedule()`` + ``update()`` leave it.

``tests/test_skip_ahead.py`` compares what a run *reports* with skip-ahead on and off (decision
logs, step and request columns, summaries). A sequence counter the fast path sets wrong may not
show there until some later decision reads it (``num_registered_blocks``, for instance, is read
only when a sequence is preempted or freed). So here two schedulers take the same requests at the
same steps, one step by step, the other through ``pagesim.engine.policy.fast_path.fast_forward`` wherever the
simulator would (``advance`` over steady stretches up to the next arrival, ``schedule_decode_step``
+ ``update_decode_step`` for a step that admits beside the decodes or must preempt for them,
``pagesim.engine.policy.fast_path.preempting_decode``), and after every step both
have taken, every sequence's fields and the pool's blocks are compared.

Both schedulers make every block key when due (``kv.lazy_keys`` off, as the simulator's reference
path does), so the pools can be compared block for block; a second test keeps lazy keys on both
(each block compared as unkeyed, lazily keyed or keyed), where a batch whose sequences all key
lazily leaves their keys to settling (``DecodeRun.eager``).

With implicit decoders (``pagesim.engine.policy.fast_path.bulk_decode``) the fast scheduler's running sequences lag
until something reads them; the state compared is what a reader finds, taken from a copy settled
as ``Scheduler.settle`` settles it, so that the scheduler itself goes on lagging as in a run.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pagesim.engine.policy import Request, Scheduler, make_config
from pagesim.engine.policy.fast_path import bulk_decode
from pagesim.engine.policy.scheduling import lag
from pagesim.engine.policy.fast_path import fast_forward as ff
from pagesim.engine.policy.memory.block_pool import LAZY_KEY, BlockPool
from pagesim.engine.policy.scheduling.steps.vllm_v0 import VLLM_V0_ABORTS
from tests.conftest import pure_python_only, scaled_examples

# (The state compared is a settled deep copy's: see pure_python_only. tests/test_skip_ahead.py and the
# oracle's cases check the compiled build's decisions and metrics.)
pytestmark = pure_python_only("pagesim.engine.policy.scheduling.scheduler", "these tests deep-copy schedulers")

SEQUENCE_FIELDS = ("index", "num_computed_tokens", "num_filled_tokens", "block_table", "cpu_block_table",
                   "num_registered_blocks", "num_offered_blocks", "finished", "finish_reason", "parked", "decoding")


def _key_kind(key) -> str:
    return "none" if key is None else "lazy" if key is LAZY_KEY else "key"


def state(s: Scheduler) -> tuple:
    """Everything a later decision could read: each unfinished request's status and sequences,
    the queues, the pool's blocks (references, keyed or not) and its allocation order (of a
    settled copy, when sequences lag)."""
    if s._lazy_run is not None:
        s = copy.deepcopy(s)
        s.settle()
    requests = []
    for rid, request in sorted(s.requests.items()):
        seqs = [tuple(_copied(getattr(seq, name)) for name in SEQUENCE_FIELDS)
                + (len(seq.output_token_ids), len(seq.block_keys)) for seq in request.seqs]
        requests.append((rid, request.status, seqs))
    pool = s.pool
    return (s.next_step, requests, [r.request_id for r in s.running], [r.request_id for r in s.waiting],
            [r.request_id for r in s.swapped], list(pool.ref_counts), [_key_kind(k) for k in pool.keys],
            pool.free_block_order(), pool.num_evictions, s.num_finished_requests)


def _copied(value):
    """A field's value as it is now (a list is copied: the scheduler goes on changing it)."""
    return list(value) if isinstance(value, list) else value


def make_requests(spec: list[tuple[int, int, int, int]]) -> list[tuple[int, Request]]:
    """``(arrival step, prompt length, output length, n)`` -> requests by arrival step."""
    return [(step, Request(f"r{i}", prompt_len=prompt, max_tokens=output, n=n))
            for i, (step, prompt, output, n) in enumerate(spec)]


def drive(config, spec, fast: bool, max_steps: int = 600, mid: dict | None = None,
          lazy_keys: bool = False) -> dict[int, tuple]:
    """Run the requests of ``spec`` to the end; the state after each step taken, by step number
    (and into ``mid``, the state between scheduling and updating each step that admits beside the
    decodes on the fast path, every step on the other: what a router reads at an arrival then)."""
    s = Scheduler(config)
    if not lazy_keys:
        s.kv.lazy_keys = False  # (both sides: every key made when due, so the pools compare block for block)
    arrivals = sorted(make_requests(spec), key=lambda a: a[0])
    states: dict[int, tuple] = {}
    a = 0
    while (s.has_unfinished_requests or a < len(arrivals)) and s.next_step < max_steps:
        while a < len(arrivals) and arrivals[a][0] <= s.next_step:
            s.add_request(arrivals[a][1])
            a += 1
        if not s.has_unfinished_requests:  # (idle until the next arrival: the step numbers wait)
            if a == len(arrivals):  # (the last ones were rejected on arrival: nothing is left to run)
                break
            s.next_step = arrivals[a][0]
            continue
        run = ff.decode_batch(s) if fast else None
        if fast and run is None and ff.takes_decode_steps(s):
            run = ff.preempting_batch(s)  # (a batch whose next step must preempt: engine.policy.preempting_decode)
        next_arrival = arrivals[a][0] if a < len(arrivals) else max_steps
        if run is not None and run.max_steps and ff.queues_stay_refused(s) and next_arrival > s.next_step:
            ff.advance(run, min(run.max_steps, next_arrival - s.next_step))
            states[s.next_step - 1] = state(s)
            continue
        try:  # (None: a vllm-v0 step that admits, which runs the prefills alone through schedule())
            step = ff.schedule_decode_step(run) if run is not None and ff.takes_decode_steps(s) else None
            output = s.schedule() if step is None else None
        except VLLM_V0_ABORTS as exc:  # (where vLLM 0.6.3 stops: the same error, the queues left alike)
            states[s.next_step - 1] = ("aborted", str(exc), [r.request_id for r in s.running],
                                       [r.request_id for r in s.waiting], [r.request_id for r in s.swapped])
            break
        if step is not None:
            if mid is not None:
                mid[s.next_step - 1] = state(s)
            ff.update_decode_step(step)
        else:
            if mid is not None and not fast:
                mid[s.next_step - 1] = state(s)
            s.update(output, None)
        states[s.next_step - 1] = state(s)
    return states


@st.composite
def cases(draw):
    num = draw(st.integers(1, 8))
    spec = [(draw(st.integers(0, 40)), draw(st.integers(1, 40)), draw(st.integers(1, 60)),
             draw(st.sampled_from([1, 1, 1, 2]))) for _ in range(num)]
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    need = max((p + o) * n for _, p, o, n in spec)
    slots = draw(st.sampled_from([need + 2 * block_size, 2 * need, sum((p + o) * n for _, p, o, n in spec) + 64]))
    preset = draw(st.sampled_from(["pagesim", "vllm-v1", "vllm-v0"]))
    settings_ = dict(block_size=block_size, num_gpu_blocks=-(-slots // block_size) + 1, max_model_len=256,
                     enable_prefix_caching=draw(st.booleans()) and preset != "vllm-v0",  # (vLLM 0.6.3: off)
                     max_num_seqs=draw(st.sampled_from([2, 256])),
                     preemption_mode=draw(st.sampled_from(["recompute", "swap"])), num_cpu_blocks=64,
                     victim_policy=draw(st.sampled_from(["running-tail", "running-tail", "fewest-blocks",
                                                         "most-blocks", "latest-arrival"])),
                     record_decisions=draw(st.booleans()))  # (not recording: advance's bulk path)
    return preset, settings_, spec


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_fast_path_leaves_every_sequence_as_step_by_step(case):
    preset, settings_, spec = case
    config = make_config(preset, **settings_)
    plain_mid, fast_mid = {}, {}
    plain = drive(config, spec, fast=False, mid=plain_mid)
    fast = drive(config, spec, fast=True, mid=fast_mid)
    assert set(fast) <= set(plain), "the fast path took steps the step-by-step path did not"
    for step in sorted(fast):
        assert fast[step] == plain[step], f"state after step {step} differs"
    for step in sorted(fast_mid):  # (a step that admits beside the decodes, before its update)
        assert fast_mid[step] == plain_mid[step], f"state in the middle of step {step} differs"
    event("some steps skipped" if len(fast) < len(plain) else "no step skipped")


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_fast_path_gives_the_same_lazy_keys_as_step_by_step(case):
    """With lazy keys on both sides (the simulator's own setting): a batch of implicit decoders
    that all key lazily makes no registration as its steps fill blocks, and settling gives them
    ``LAZY_KEY``; every block must be keyed (lazily or not) exactly when the step-by-step path
    has keyed it, after every step and in the middle of a step that admits."""
    preset, settings_, spec = case
    settings_ = {**settings_, "enable_prefix_caching": preset != "vllm-v0"}
    config = make_config(preset, **settings_)
    plain_mid, fast_mid = {}, {}
    plain = drive(config, spec, fast=False, mid=plain_mid, lazy_keys=True)
    fast = drive(config, spec, fast=True, mid=fast_mid, lazy_keys=True)
    for step in sorted(fast):
        assert fast[step] == plain[step], f"state after step {step} differs"
    for step in sorted(fast_mid):
        assert fast_mid[step] == plain_mid[step], f"state in the middle of step {step} differs"


def test_lazy_key_comparison_has_teeth(monkeypatch):
    """Settling that forgets the keys a lazily keyed batch left to it is caught."""
    config = make_config("pagesim", block_size=4, num_gpu_blocks=200, max_model_len=256, enable_prefix_caching=True,
                         record_decisions=False)  # (implicit decoders)
    spec = [(0, 9, 30, 1), (3, 5, 30, 1), (6, 7, 20, 1), (9, 3, 25, 1)]
    plain = drive(config, spec, fast=False, lazy_keys=True)
    assert all(step_state == plain[step] for step, step_state in drive(config, spec, fast=True, lazy_keys=True).items())
    monkeypatch.setattr(lag, "key_lazily", lambda keys, seq, full: None)  # (settling's)
    monkeypatch.setattr(bulk_decode, "key_lazily", lambda keys, seq, full: None)  # (apply_in_bulk's)
    assert _compared_apart(monkeypatch, config, spec, plain, lazy_keys=True)
    assert _caught(monkeypatch, config, spec, plain, lazy_keys=True)


def _compared_apart(monkeypatch, config, spec, plain, **options) -> bool:
    """Whether the state comparison alone tells a mutated fast path from the step-by-step path:
    with every table freed as if its layout were unknown (the pool reads each block), so the
    pool's checks of a layout cannot catch the mutation first."""
    with monkeypatch.context() as patch:
        free_table = BlockPool.free_table
        patch.setattr(BlockPool, "free_table", lambda pool, block_ids, layout=None: free_table(pool, block_ids))
        fast = drive(config, spec, fast=True, **options)
    return any(fast[step] != plain[step] for step in fast)


def _caught(monkeypatch, config, spec, plain, **options) -> bool:
    """Whether a mutated fast path is caught as a run outside the test suite would catch it (the
    suite's full check of freed tables off): some step's state differs from the step-by-step
    path's, or the pool refuses a freed table whose keys are not as its layout says (the
    boundary check ``BlockPool.free_table`` always makes)."""
    with monkeypatch.context() as patch:
        patch.setattr(BlockPool, "check_layouts", False)
        try:
            fast = drive(config, spec, fast=True, **options)
        except AssertionError as exc:
            return "not as its layout says" in str(exc)
    return any(fast[step] != plain[step] for step in fast)


_REAL_DECODE_ONCE = ff._decode_once


def _decode_once_lagging(seqs, computed, kv, pool):
    """``_decode_once`` that leaves every sequence's registered-block counter where it was."""
    before = [seq.num_registered_blocks for seq in seqs]
    counts = _REAL_DECODE_ONCE(seqs, computed, kv, pool)
    for seq, b in zip(seqs, before):
        seq.num_registered_blocks = b
    return counts


_REAL_SETTLE_ONE = lag.settle_one


def _settle_one_lagging(seq, *args):
    """``lag.settle_one`` that leaves the sequence's registered-block counter where it was."""
    before = seq.num_registered_blocks
    _REAL_SETTLE_ONE(seq, *args)
    seq.num_registered_blocks = before


@pytest.mark.parametrize("implicit", [True, False])
def test_state_comparison_has_teeth(monkeypatch, implicit):
    """A decode step that leaves the registered-block counter behind is caught here, though no
    decision reads the counter until the sequence is freed or preempted: with implicit decoders
    (decisions not recorded) in settling, with every sequence written each step (recorded) in
    the admitting step's decodes."""
    config = make_config("pagesim", block_size=4, num_gpu_blocks=200, max_model_len=256, enable_prefix_caching=True,
                         record_decisions=not implicit)
    spec = [(0, 9, 30, 1), (3, 5, 30, 1), (6, 7, 20, 1), (9, 3, 25, 1)]
    plain = drive(config, spec, fast=False)
    unmodified = drive(config, spec, fast=True)
    assert all(unmodified[step] == plain[step] for step in unmodified)
    if implicit:
        monkeypatch.setattr(lag, "settle_one", _settle_one_lagging)  # (settle's, the scheduler's)
        monkeypatch.setattr(bulk_decode, "settle_one", _settle_one_lagging)  # (apply_in_bulk's)
    else:
        monkeypatch.setattr(ff, "_decode_once", _decode_once_lagging)
    assert _compared_apart(monkeypatch, config, spec, plain)
    assert _caught(monkeypatch, config, spec, plain)
