"""A calibration run: every table of ``pagesim.sim.cost.profile.TABLES`` timed over its grid, written as
a profile after each table, so an interrupted run resumes where it stopped.

Resuming: when ``out`` already holds a profile made with the same settings (model shapes,
dtype, device, backend, threads, warm-up, repeats and grids), its finished tables are kept and
only the rest are measured; a profile made with other settings is never overwritten unless
``force`` is given. Each grid point keeps every sample, its median and its interquartile range.

Every profile also records the load the machine was under while it was measured and, once all
tables are done, its probe: a few of its own grid points re-timed, so that a later run can tell
whether the profile still describes the machine (``pagesim.engine.calibrate.probe``).
"""

from __future__ import annotations

import datetime
import gc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from pagesim.engine.calibrate.grids import grids as default_grids
from pagesim.engine.calibrate.machine import device_info, versions
from pagesim.engine.calibrate.measure import Bench, summarize_samples
from pagesim.engine.calibrate.probe import LoadMonitor, probe_points, run_probe
from pagesim.engine.model.config import LlamaConfig
from pagesim.engine.model.weights import dtype_name
from pagesim.sim.cost.profile import TABLES, Profile, ProfileError, Table, grid_points, load_profile, save_profile


class SettingsMismatch(ValueError):
    """``out`` holds a profile made with other settings."""


def model_shapes(config: LlamaConfig, dtype: torch.dtype) -> dict:
    return {"name": config.name, "num_layers": config.num_layers, "hidden_size": config.hidden_size,
            "num_heads": config.num_heads, "num_kv_heads": config.num_kv_heads, "head_dim": config.head_dim,
            "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_position_embeddings, "dtype": dtype_name(dtype)}


def calibrate(config: LlamaConfig, *, out: Path, device: torch.device, dtype: torch.dtype, backend: str,
              threads: int, warmup: int, repeats: int, quick: bool = False, force: bool = False,
              seed: int = 0, grid: dict[str, list[list[int]]] | None = None,
              on_point: Callable[[str], object] | None = None, on_table: Callable[[str, int], object] | None = None,
              ) -> Profile:
    """Measure (or finish measuring) a profile into ``out``; returns it complete. ``grid`` replaces
    the default grids (``pagesim.engine.calibrate.grids``) table by table."""
    grid = {**default_grids(config, quick=quick), **(grid or {})}
    settings = {"warmup": warmup, "repeats": repeats, "threads": threads, "backend": backend, "quick": quick,
                "timed_layers": 1, "grids": {name: grid[name] for name in TABLES}}
    shapes = model_shapes(config, dtype)
    device_desc = device_info(device, threads)
    done, old = _resumable(out, shapes, device_desc, settings, force)
    if old is not None and old.complete and old.probe is not None and set(done) == set(TABLES):
        return old  # nothing left to measure: the profile (and the probe taken when it was made) as it is
    monitor = LoadMonitor(device.type, threads, earlier=old.conditions if old is not None else None)
    gc.collect()
    gc.freeze()  # as validate's timed runs: no scans of long-lived objects inside a measurement
    try:
        done = _measure(config, grid, done, out, device_desc, shapes, settings, dtype=dtype, device=device,
                        backend=backend, warmup=warmup, repeats=repeats, seed=seed, on_point=on_point,
                        on_table=on_table, monitor=monitor)
        stamp = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        profile = Profile(device_desc, {**versions(), **stamp}, shapes, settings, dict(done), complete=True,
                          path=str(out))
        points = probe_points(profile)
        if on_table is not None:
            on_table("probe", len(points))
        probe = run_probe(config, points, device=device, dtype=dtype, backend=backend, seed=seed)
        if on_point is not None:
            for _ in points:
                on_point("probe")
    finally:
        gc.unfreeze()
    profile = replace(profile, conditions=monitor.conditions(), probe=probe)
    save_profile(profile, out)
    return profile


def _measure(config, grid, done, out, device_desc, shapes, settings, *, dtype, device, backend, warmup, repeats, seed,
             on_point, on_table, monitor: LoadMonitor) -> dict[str, Table]:
    bench = None
    for name in TABLES:
        if name in done:
            continue
        if bench is None:
            bench = Bench(config, dtype=dtype, device=device, backend=backend, warmup=warmup, repeats=repeats, seed=seed)
        measure = getattr(bench, f"time_{name}")
        axes = tuple(tuple(float(x) for x in values) for values in grid[name])
        points = grid_points(axes)
        if on_table is not None:
            on_table(name, len(points))
        samples, medians, spreads = [], [], []
        for point in points:
            s = [float(x) for x in measure(point)]
            med, iqr = summarize_samples(s)
            samples.append(tuple(s))
            medians.append(med)
            spreads.append(iqr)
            if on_point is not None:
                on_point(name)
        done[name] = Table(name, TABLES[name][0], axes, tuple(medians), tuple(spreads), tuple(samples), TABLES[name][1])
        monitor.sample()
        save_profile(Profile(device_desc, versions(), shapes, settings, dict(done), complete=False, path=str(out),
                             conditions=monitor.conditions()), out)
    return done


def _resumable(out: Path, shapes: dict, device_desc: dict, settings: dict,
               force: bool) -> tuple[dict[str, Table], Profile | None]:
    """The tables of ``out`` that this run can keep (none if it has no profile there), and the
    profile they come from (its load conditions and probe)."""
    if force or not out.exists():
        return {}, None
    try:
        old = load_profile(out, require_complete=False)
    except ProfileError as exc:
        raise SettingsMismatch(f"{out} exists and is not a profile this run can resume ({exc}); --force overwrites it, "
                               f"or give another --out") from None
    differ = [k for k, v in shapes.items() if old.model.get(k) != v]
    differ += [f"device {k}" for k, v in device_desc.items() if old.device.get(k) != v]
    differ += [k for k, v in settings.items() if k != "grids" and old.settings.get(k) != v]
    keep = {}
    for name, table in old.tables.items():
        if name in settings["grids"] and [list(map(float, g)) for g in settings["grids"][name]] == [list(g) for g in table.grid]:
            keep[name] = table
        elif name in settings["grids"]:
            differ.append(f"the {name} grid")
    if differ:
        raise SettingsMismatch(f"{out} holds a profile made with other settings ({', '.join(differ[:4])} differ); "
                               f"--force overwrites it, or give another --out")
    return keep, old if keep else None
