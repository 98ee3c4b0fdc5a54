"""``sim.gc_policy.collecting_less``: the collector's settings during a run, and put back after it."""

from __future__ import annotations

import gc

import pytest

from sim.gc_policy import YOUNG_THRESHOLD, collecting_less


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
