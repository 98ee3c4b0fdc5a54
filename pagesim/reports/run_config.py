"""One run of a study, as a config: its id, the settings that mean nothing to it, its name.

A run's config (``RunConfig``) is a flat dict: ``source`` (the workload or trace) and the run's
settings (``pagesim.reports.spec`` makes them from a spec's base and grids). Its id (``run_id``) is
a hash of that dict, so the same run keeps its id across invocations: the runner stamps it on the
run's record (``pagesim.reports.runner``) and the results store checks it against the record's
config (``pagesim.reports.store``). A setting is *moot* for a run when it means nothing to it
(``moot_settings``: the offload policy of a run without an offload store, ``offloading``; the
KV links, routers and pool settings of a run that is not a P:D split, and the colocated router of
one that is, ``pagesim.reports.pd.moot``): a config leaves it out, so runs that differ only in it
are one run. ``describe_config`` names a run
by the settings that set it apart from the study's base, each value as the report writes it
(``value_label``); the seed (``SEED``) is the replicate axis, left out where a name is per setting.

Invariant: this module imports nothing of the study's (spec, runner, store, results): they all
import it. (It imports ``pagesim.reports.pd``, which imports nothing of the study's either.)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pagesim.reports.pd import moot as pd_moot

SEED = "seed"  # the replicate axis: never a plotted axis, averaged over

RunConfig = dict[str, Any]


def run_id(config: RunConfig) -> str:
    """Stable id of a run: the first 16 hex digits of SHA-256 over its canonical JSON."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def offloading(config: RunConfig) -> bool:
    """Whether the run has an offload store (a paged run of ``kv_offloading_size`` > 0)."""
    return bool(config.get("kv_offloading_size")) and config.get("allocator", "paged") == "paged"


def moot_settings(config: RunConfig) -> set[str]:
    """Settings that mean nothing to this run: the offload policy without an offload store, the
    P/D settings of a run that is not a P:D split (and the colocated router of one that is). A
    run's config leaves them out (so runs differing only in them are one run), and the report
    neither compares nor labels a run by them."""
    return (set() if offloading(config) else {"kv_offloading_policy"}) | pd_moot(config)


def describe_config(config: dict[str, Any], base: dict[str, Any], *, seed: bool = True) -> str:
    """The settings that distinguish a run from the study's base (or "base settings")."""
    diff = [f"{k}={value_label(v)}" for k, v in config.items()
            if k != "source" and k in base and base[k] != v and (seed or k != SEED)]
    return ", ".join(diff) or "base settings"


def value_label(value: Any) -> str:
    """A setting's value as the report writes it (None: the preset's default)."""
    return "preset default" if value is None else str(value)
