"""A calibration profile: what ``pagesim calibrate`` measured on one device, as a versioned file.

A profile is one JSON document::

    {"schema": "pagesim-profile", "schema_version": 1, "complete": true,
     "device": {...}, "versions": {...}, "model": {...shapes and dtype...},
     "settings": {"warmup": ..., "repeats": ..., "threads": ...},
     "tables": {NAME: {"axes": [...], "grid": [[...], ...], "median_s": [...], "spread_s": [...],
                       "samples_s": [[...], ...], "per": "layer" | "step" | "sequence"}}}

Each table is one quantity timed over a rectilinear grid: ``axes`` name the grid's dimensions,
``grid[i]`` lists the values of axis ``i`` (ascending), and the per-point arrays
(``median_s``, ``spread_s`` = interquartile range, ``samples_s`` = every repeat) are flattened
in C order (the last axis varies fastest). ``per`` says what one value covers: one transformer
layer (the cost model multiplies by the layer count), a whole step, or one prefill sequence.

``TABLES`` is the contract between the calibrator (engine side) and the calibrated cost model
(sim side): the calibrator writes exactly these tables, the cost model reads exactly these.
A profile written by an incomplete run has ``"complete": false`` and is refused by the cost
model (``pagesim calibrate`` resumes it).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagesim.engine.files import InputFileError, read_json
from pagesim.engine.outputs import OutputFile

SCHEMA = "pagesim-profile"
SCHEMA_VERSION = 1


class ProfileError(ValueError):
    """A profile file that is missing, malformed, incomplete, or for other shapes."""


#: name -> (axes, per, what it times). The calibrator times these; the cost model reads them.
TABLES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "dense_layer": (("tokens",), "layer",
                    "one decoder layer without attention: norms, q/k/v/o projections, RoPE, SwiGLU MLP, residuals"),
    "model_outer": (("tokens",), "step", "token embedding, rotary angles and the final norm"),
    "lm_head": (("rows",), "step", "gathering the sampled rows and the vocabulary projection"),
    "cache_write": (("tokens",), "layer", "writing the step's K/V into their cache slots"),
    "decode_attention": (("block_size", "seqs", "context"), "layer",
                         "paged decode attention: seqs sequences of context tokens each"),
    "prefill_attention": (("tokens", "context"), "sequence",
                          "paged prefill attention of one sequence: tokens new after context cached, per layer"),
    "cow_copy": (("block_size", "blocks"), "layer", "copy-on-write block copies"),
    "swap_out": (("block_size", "blocks"), "layer", "blocks from the device cache to host memory"),
    "swap_in": (("block_size", "blocks"), "layer", "blocks from host memory to the device cache"),
    "sampling": (("rows",), "step", "the engine's sampling of that many rows (greedy)"),
    "batch_prep": (("seqs",), "step", "building a step's input tensors and kernel metadata from the scheduler output"),
    "policy": (("seqs",), "step", "the policy's schedule() and update() in steady decoding"),
}

#: The shapes a profile's timings depend on (a model of other shapes needs its own profile).
SHAPE_KEYS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size")
MODEL_KEYS = ("name", *SHAPE_KEYS, "dtype")


def grid_points(grid) -> list[tuple[float, ...]]:
    """Every point of a rectilinear grid (one sequence of values per axis), in C order."""
    return list(itertools.product(*grid))


@dataclass(frozen=True)
class Table:
    name: str
    axes: tuple[str, ...]
    grid: tuple[tuple[float, ...], ...]
    median_s: tuple[float, ...]
    spread_s: tuple[float, ...]
    samples_s: tuple[tuple[float, ...], ...]
    per: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(g) for g in self.grid)

    def points(self) -> list[tuple[float, ...]]:
        """Every grid point (a tuple of axis values) in C order, aligned with ``median_s``."""
        return grid_points(self.grid)

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, Any], *, where: str | None = None) -> Table:
        """The table ``name`` as a profile file holds it; ``where`` starts every error message
        (the file and the table)."""
        where = where or f"table {name!r}"
        try:
            axes = tuple(d["axes"])
            grid = tuple(tuple(float(x) for x in g) for g in d["grid"])
            median = tuple(float(x) for x in d["median_s"])
            spread = tuple(float(x) for x in d.get("spread_s", [0.0] * len(median)))
            samples = tuple(tuple(float(x) for x in s) for s in d.get("samples_s", [[m] for m in median]))
            per = str(d["per"])
        except (KeyError, TypeError, ValueError) as exc:
            reason = str(exc) if len(str(exc)) <= 80 else str(exc)[:79] + "…"  # it may quote the file
            raise ProfileError(f"{where}: malformed ({type(exc).__name__}: {reason})") from None
        expected_axes, expected_per, _ = TABLES[name]
        if axes != expected_axes or per != expected_per:
            raise ProfileError(f"{where}: axes {list(axes)} per {per!r}; this version reads axes {list(expected_axes)} "
                               f"per {expected_per!r}")
        if len(grid) != len(axes) or any(len(g) == 0 for g in grid):
            raise ProfileError(f"{where}: needs one non-empty list of values per axis")
        for axis, g in zip(axes, grid):
            if any(not math.isfinite(x) or x < 0 for x in g) or any(b <= a for a, b in zip(g, g[1:])):
                raise ProfileError(f"{where}: axis {axis!r} must list ascending, finite values >= 0, got {list(g)}")
        size = math.prod(len(g) for g in grid)
        if len(median) != size or len(spread) != size or len(samples) != size:
            raise ProfileError(f"{where}: {size} grid points but {len(median)} medians, {len(spread)} spreads and "
                               f"{len(samples)} sample lists")
        if any(not math.isfinite(x) or x < 0 for x in median):
            raise ProfileError(f"{where}: medians must be finite seconds >= 0")
        if any(not math.isfinite(x) or x < 0 for x in spread) or \
                any(not math.isfinite(x) or x < 0 for point in samples for x in point):
            raise ProfileError(f"{where}: spreads and timed samples must be finite seconds >= 0")
        return cls(name, axes, grid, median, spread, samples, per)

    def to_dict(self) -> dict[str, Any]:
        return {"axes": list(self.axes), "per": self.per, "grid": [list(g) for g in self.grid],
                "median_s": list(self.median_s), "spread_s": list(self.spread_s),
                "samples_s": [list(s) for s in self.samples_s], "what": TABLES[self.name][2]}


@dataclass(frozen=True)
class Profile:
    device: dict[str, Any]
    versions: dict[str, Any]
    model: dict[str, Any]
    settings: dict[str, Any]
    tables: dict[str, Table]
    complete: bool = True
    path: str | None = None
    conditions: dict[str, Any] | None = None  # the load while calibrating (engine.calibrate.probe.LoadMonitor)
    probe: dict[str, Any] | None = None  # a few grid points re-timed at the end (engine.calibrate.probe)

    @property
    def num_layers(self) -> int:
        return int(self.model["num_layers"])

    def shape_differences(self, shapes: Mapping[str, Any]) -> list[str]:
        """``"key value (profile: value)"`` for each of ``SHAPE_KEYS`` where ``shapes`` differs."""
        return [f"{k} {shapes[k]} (profile: {self.model[k]})" for k in SHAPE_KEYS if int(self.model[k]) != int(shapes[k])]

    def describe(self) -> str:
        dev = self.device
        return (f"{self.model['name']} ({self.model['dtype']}) on {dev.get('name', dev.get('type'))}"
                f"{' with ' + str(self.settings.get('threads')) + ' thread(s)' if dev.get('type') == 'cpu' else ''}")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "complete": self.complete,
                "device": self.device, "versions": self.versions, "model": self.model, "settings": self.settings,
                "tables": {name: t.to_dict() for name, t in self.tables.items()},
                **({"conditions": self.conditions} if self.conditions is not None else {}),
                **({"probe": self.probe} if self.probe is not None else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, path: str | None = None, require_complete: bool = True) -> Profile:
        where = path or "profile"
        if not isinstance(d, Mapping) or d.get("schema") != SCHEMA:
            raise ProfileError(f"{where}: not a pagesim calibration profile (no \"schema\": \"{SCHEMA}\")")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ProfileError(f"{where}: schema version {version!r}; this pagesim reads version {SCHEMA_VERSION} "
                               f"(run pagesim calibrate again)")
        for key in ("device", "versions", "model", "settings", "tables"):
            if not isinstance(d.get(key), Mapping):
                raise ProfileError(f"{where}: missing or malformed {key!r}")
        missing_model = [k for k in MODEL_KEYS if k not in d["model"]]
        if missing_model:
            raise ProfileError(f"{where}: model shapes lack {', '.join(missing_model)}")
        complete = bool(d.get("complete", False))
        unknown = sorted(set(d["tables"]) - set(TABLES))
        if unknown:
            names = ", ".join(unknown)
            raise ProfileError(f"{where}: unknown table(s) {names if len(names) <= 120 else names[:119] + '…'}")
        tables = {name: Table.from_dict(name, t, where=f"{where}: table {name!r}") for name, t in d["tables"].items()}
        missing = [name for name in TABLES if name not in tables]
        if require_complete and (not complete or missing):
            raise ProfileError(f"{where}: incomplete ({len(tables)} of {len(TABLES)} tables measured; missing "
                               f"{', '.join(missing) or 'none, but not marked complete'}): run the same pagesim "
                               f"calibrate command again to resume it")
        return cls(dict(d["device"]), dict(d["versions"]), dict(d["model"]), dict(d["settings"]), tables,
                   complete, path, _conditions(d.get("conditions"), where), _probe(d.get("probe"), where))


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _conditions(conditions: Any, where: str) -> dict[str, Any] | None:
    """A profile's load record, checked: numbers where numbers belong, a CPU count >= 1."""
    if conditions is None:
        return None
    ok = isinstance(conditions, Mapping) and all(
        conditions.get(key) is None or _number(conditions[key])
        for key in ("load_average_start", "load_average_max", "cpu_share", "wall_s"))
    cpus = conditions.get("cpus") if isinstance(conditions, Mapping) else None
    if not ok or not (cpus is None or (_number(cpus) and int(cpus) == cpus and cpus >= 1)):
        raise ProfileError(f"{where}: malformed 'conditions' (calibrate again to record new ones)")
    return dict(conditions)


def _probe(probe: Any, where: str) -> dict[str, Any] | None:
    """A profile's probe record, checked: points of known tables at points of their axes' length,
    with finite medians > 0 summing to ``total_s``."""
    if probe is None:
        return None
    bad = ProfileError(f"{where}: malformed 'probe' (calibrate again to record a new one)")
    if not isinstance(probe, Mapping) or not isinstance(probe.get("points"), list) or not probe["points"]:
        raise bad
    points = []
    for p in probe["points"]:
        if not isinstance(p, Mapping) or not isinstance(p.get("point"), list) or p.get("table") not in TABLES:
            raise bad
        point, median = p["point"], p.get("median_s")
        if len(point) != len(TABLES[p["table"]][0]) or not all(_number(x) for x in point) \
                or not _number(median) or median <= 0:
            raise bad
        points.append({**p, "point": [float(x) for x in point], "median_s": float(median)})
    total = probe.get("total_s")
    if not _number(total) or abs(total - sum(p["median_s"] for p in points)) > 1e-9 * max(1.0, total):
        raise bad
    return {**probe, "points": points, "total_s": total}


MAX_PROFILE_BYTES = 256 * 2**20  # a calibrated profile is well under 1 MiB
#: Profiles shipped with pagesim, loadable by name (``--profile tiny-cpu``).
SHIPPED = Path(__file__).resolve().parent.parent / "profiles"


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.json"))


def load_profile(path: str | os.PathLike, *, require_complete: bool = True) -> Profile:
    """A profile file (a regular file of at most ``MAX_PROFILE_BYTES``), or the name of one
    shipped under ``pagesim/sim/profiles/``."""
    p = Path(path)
    if not os.path.lexists(p) and p.suffix == "" and len(p.parts) == 1 and (SHIPPED / f"{p}.json").is_file():
        p = SHIPPED / f"{p}.json"
    if not p.exists():
        shipped = ", ".join(shipped_profiles()) or "none"
        raise ProfileError(f"{p}: no such file (make one with pagesim calibrate; shipped profiles: {shipped})")
    try:
        data = read_json(p, limit_bytes=MAX_PROFILE_BYTES, what="profile")
    except InputFileError as exc:
        raise ProfileError(str(exc)) from None
    return Profile.from_dict(data, path=str(p), require_complete=require_complete)


#: Why a profile is written only to a regular file: calibrate rewrites it after every table and
#: resumes from it, which a device or FIFO cannot hold.
WHY_REGULAR = "a profile is rewritten after each table and resumed from, so give a regular file"


def profile_output(path: str | os.PathLike, flag: str | None = "--out") -> OutputFile:
    """``path`` checked as a profile to write (``pagesim.engine.outputs``): a regular file or nothing."""
    return OutputFile(path, flag, streams=False, why_regular=WHY_REGULAR)


def save_profile(profile: Profile, path: str | os.PathLike) -> None:
    """Write atomically (staged under a fresh name beside the target, renamed over it: a crash
    never leaves half a file, and no user's file is touched); only a regular file or nothing is
    replaced, a symbolic link's file where it lies (``pagesim.engine.outputs``)."""
    with profile_output(path, None).open() as fh:
        fh.write(json.dumps(profile.to_dict(), indent=1, sort_keys=True) + "\n")
