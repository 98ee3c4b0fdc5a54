"""``pagesim.sim.gc_policy.collecting_less``: the collector's settings during a run, and put back after it;
and the work it is spared: finished requests freed by reference counting."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from pagesim.engine.policy import Request, Scheduler, make_config
from pagesim.engine.policy.scheduling.request import Sequence
from pagesim.sim.gc_policy import YOUNG_THRESHOLD, collecting_less
from pagesim.sim.simulator import SimOptions, Simulation
from tests.test_skip_ahead import roofline
from pagesim.traces.trace import Trace


@pytest.fixture
def saved_gc():
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_freezes_and_raises_the_young_threshold_then_puts_both_back(saved_gc):
    gc.set_threshold(700, 10, 10)
    assert gc.get_freeze_count() == 0
    with collecting_less():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0  # (the objects that existed are frozen)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_puts_everything_back_when_the_run_fails(saved_gc):
    gc.set_threshold(500, 7, 3)
    with pytest.raises(RuntimeError, match="boom"):
        with collecting_less():
            raise RuntimeError("boom")
    assert gc.get_threshold() == (500, 7, 3)
    assert gc.get_freeze_count() == 0


def test_leaves_a_callers_frozen_objects_and_disabled_collection_alone(saved_gc):
    gc.freeze()
    frozen = gc.get_freeze_count()
    with collecting_less():
        pass
    assert gc.get_freeze_count() == frozen  # (not unfrozen by us)
    gc.unfreeze()
    gc.set_threshold(0, 10, 10)  # automatic collection off by threshold
    with collecting_less():
        assert gc.get_threshold() == (0, 10, 10)
    gc.set_threshold(700, 10, 10)
    gc.disable()
    with collecting_less():
        assert gc.get_freeze_count() == 0
    assert not gc.isenabled()


def test_a_larger_threshold_of_the_callers_is_kept(saved_gc):
    gc.set_threshold(50_000, 10, 10)
    with collecting_less():
        assert gc.get_threshold() == (50_000, 10, 10)
    assert gc.get_threshold() == (50_000, 10, 10)


# ------------------------------------------------- finished requests, freed as they finish
@pytest.mark.parametrize("skip_ahead", [True, False], ids=["skip-ahead", "step-by-step"])
@pytest.mark.parametrize("samples", [{}, {"n": 3}, {"beam_width": 2}], ids=["n=1", "n=3", "beams"])
def test_finished_requests_are_never_cyclic_garbage(saved_gc, skip_ahead, samples):
    """A request and its sequences point at each other; the replica breaks that cycle once it has
    read a finished request, and the request factory builds each request once (n = 3 draws its
    samples' lengths), so reference counting frees every request and the cyclic collector never
    has to (it would walk every finished request's lists to find it)."""
    num = 30
    trace = Trace(arrival_s=np.arange(num) * 0.5, prompt_len=np.full(num, 300), output_len=np.full(num, 40),
                  **{name: np.full(num, value) for name, value in samples.items()})
    gc.collect()
    gc.disable()  # (nothing is collected during the run: what it frees, reference counting frees)
    sim = Simulation(trace, Scheduler(make_config("pagesim", block_size=16, num_gpu_blocks=2000, max_model_len=8192)),
                     roofline(), SimOptions(skip_ahead=skip_ahead, seed=3))
    result = sim.run()
    assert result.summary["requests_completed"] == num
    gc.set_debug(gc.DEBUG_SAVEALL)  # (unreachable objects go to gc.garbage, to be looked at)
    try:
        gc.collect()
        garbage = [o for o in gc.garbage if type(o) in (Request, Sequence)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert garbage == []
