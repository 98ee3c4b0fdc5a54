"""Whether a profile still describes this machine: its probe, its fingerprint, and its load.

A profile is a set of timings of one machine under one set of conditions. Three records let a
later run tell when those no longer hold (``check_profile``):

- **probe**: a few of the profile's own grid points, re-timed at the end of the calibration by a
  fresh one-layer model with ``PROBE_WARMUP`` and ``PROBE_REPEATS`` calls each: per table of
  ``PROBE_TABLES`` (a dense layer, decode and prefill attention, the policy) the middle point by
  size of those whose median is under ``PROBE_POINT_S`` and the largest such point (large batches
  are where a load-inflated calibration errs most). Re-timed the same way later, the geometric
  mean of the points' ratios (each point counts the same) says whether the machine runs as it did:
  more than ``tolerance`` off either way (default ``TOLERANCE``; 0.8x and 1.25x are both 25% off,
  ``off_by``) and the profile no longer describes it. The probe at calibration against the
  profile's tables at the same points (likewise) says whether the machine held steady while the
  tables were measured (the two methods differ a little: a fresh model, fewer repeats; about 10%
  on a quiet CPU here);
- **fingerprint**: the profile's device name and Python, torch and (where it used them) Triton
  versions, compared with this machine's, and its CPU threads against the CPUs this process may
  use;
- **conditions**: the load while calibrating, sampled after every table: the 1-minute load average
  (host-wide, as ``os.getloadavg``) against the CPUs this process may use, and, on CPU with one
  thread, the share of a CPU the calibrating process got (its CPU time over wall time); a load
  average above the CPU count, or less than ``BUSY_SHARE`` of a CPU, means other work competed for
  the CPU and the timings may be inflated. (With more threads the serial parts of a step keep the
  share low on a quiet machine too, so only the load average speaks.)
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

PROBE_TABLES = ("dense_layer", "decode_attention", "prefill_attention", "policy")
PROBE_POINT_S = 0.05  # the largest median a probe point may have (seconds per call)
PROBE_WARMUP, PROBE_REPEATS = 2, 9
TOLERANCE = 0.2
BUSY_SHARE = 0.85


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


class LoadMonitor:
    """Samples the machine's load while a calibration runs (``sample()`` after every table); a
    resumed calibration passes the conditions its earlier tables were measured under
    (``earlier``), and the worst of both is recorded."""

    def __init__(self, device_type: str, threads: int, earlier: dict[str, Any] | None = None):
        self.device_type, self.threads = device_type, max(1, threads)
        self.earlier = earlier
        self.cpus = usable_cpus()
        self.start = load_average()  # (the minute before: reported, not judged)
        self.loads: list[float] = []
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def sample(self) -> None:
        x = load_average()
        if x is not None:
            self.loads.append(x)

    def conditions(self) -> dict[str, Any]:
        self.sample()
        wall = time.perf_counter() - self._wall
        share = (time.process_time() - self._cpu) / (wall * self.threads) if wall > 0 else None
        out: dict[str, Any] = {"cpus": self.cpus, "load_average_start": self.start,
                               "load_average_max": max(self.loads) if self.loads else None, "wall_s": round(wall, 3)}
        if self.device_type == "cpu" and self.threads == 1 and share is not None:
            out["cpu_share"] = round(min(share, 1.0), 3)
        if self.earlier:
            for key, pick in (("load_average_max", max), ("cpu_share", min)):
                values = [x for x in (self.earlier.get(key), out.get(key)) if x is not None]
                if values:
                    out[key] = pick(values)
            out["wall_s"] = round(float(self.earlier.get("wall_s") or 0) + wall, 3)
            out["resumed"] = True
        out["busy"] = bool(busy_words(out))
        return out


def busy_words(conditions: dict[str, Any] | None) -> str | None:
    """Why ``conditions`` (a profile's) were busy, in words; ``None`` if they were quiet or unknown."""
    if not conditions:
        return None
    why = []
    load, cpus = conditions.get("load_average_max"), conditions.get("cpus")
    if load is not None and cpus and load > cpus:
        why.append(f"1-minute load average up to {load:.1f} on {cpus} CPU{'s' if cpus != 1 else ''}")
    share = conditions.get("cpu_share")
    if share is not None and share < BUSY_SHARE:
        why.append(f"the calibrating process got {share:.0%} of a CPU (its CPU time over wall time)")
    return "; ".join(why) or None


def tolerance_from(value: float | None) -> float:
    """``--profile-tolerance`` (``None``: ``TOLERANCE``), refused outside (0, 10)."""
    tolerance = TOLERANCE if value is None else value
    if not 0 < tolerance < 10:
        raise ValueError(f"--profile-tolerance must be in (0, 10), got {value}")
    return tolerance


def show_warnings(command: str, path, warnings: list[str], *, strict: bool) -> None:
    """Each warning about the profile at ``path`` as one stderr line of ``pagesim COMMAND``; with
    ``strict``, any warning is an error."""
    import sys

    for warning in warnings:
        print(f"pagesim {command}: warning: {warning}", file=sys.stderr)
    if warnings and strict:
        raise ValueError(f"{path} does not hold on this machine ({len(warnings)} warning(s) above) (--strict)")


def busy_warning(profile) -> str | None:
    """The warning a profile measured on a busy machine deserves, or ``None``."""
    busy = busy_words(profile.conditions)
    return None if busy is None else (f"the profile was measured on a busy machine ({busy}): its timings may be "
                                      f"inflated; calibrate again on a quiet machine")


# ------------------------------------------------------------------ the probe
def probe_points(profile) -> list[tuple[str, tuple[float, ...]]]:
    """Per table of ``PROBE_TABLES``, among the grid points whose median is under
    ``PROBE_POINT_S``: the middle one by size and the largest (one point if they are the same).
    Size is the product of the point's axis values, not its measured time, so that a sample
    inflated by a hiccup is not picked for being slow."""
    chosen = []
    for name in PROBE_TABLES:
        table = profile.tables.get(name)
        if table is None:
            continue
        points = table.points()
        by_size = sorted(range(len(points)), key=lambda i: (math.prod(max(x, 1.0) for x in points[i]), i))
        cheap = [i for i in by_size if table.median_s[i] <= PROBE_POINT_S] or \
            [min(range(len(points)), key=lambda i: table.median_s[i])]
        for i in dict.fromkeys((cheap[len(cheap) // 2], cheap[-1])):
            chosen.append((name, points[i]))
    return chosen


def run_probe(config, points, *, device, dtype, backend: str, seed: int = 0) -> dict[str, Any]:
    """Time ``points`` (``(table, point)``) on a fresh one-layer model; the profile's ``probe`` record."""
    from pagesim.engine.calibrate.measure import Bench, summarize_samples

    started = time.perf_counter()
    bench = Bench(config, dtype=dtype, device=device, backend=backend, warmup=PROBE_WARMUP, repeats=PROBE_REPEATS,
                  seed=seed)
    rows = []
    for name, point in points:
        median, spread = summarize_samples([float(x) for x in getattr(bench, f"time_{name}")(point)])
        rows.append({"table": name, "point": [float(x) for x in point], "median_s": median, "spread_s": spread})
    return {"warmup": PROBE_WARMUP, "repeats": PROBE_REPEATS, "points": rows,
            "total_s": sum(r["median_s"] for r in rows), "wall_s": round(time.perf_counter() - started, 3)}


def probe_config(profile):
    """The ``LlamaConfig`` of the profile's shapes (the probe needs shapes only)."""
    from pagesim.engine.model.config import LlamaConfig

    m = profile.model
    return LlamaConfig(name=str(m["name"]), vocab_size=int(m["vocab_size"]), hidden_size=int(m["hidden_size"]),
                       intermediate_size=int(m["intermediate_size"]), num_layers=int(m["num_layers"]),
                       num_heads=int(m["num_heads"]), num_kv_heads=int(m["num_kv_heads"]), head_dim=int(m["head_dim"]),
                       max_position_embeddings=int(m.get("max_position_embeddings") or 2048))


# ------------------------------------------------------------------ the check
def off_by(ratio: float) -> float:
    """How far ``ratio`` is from 1, the same either way: 0.8x and 1.25x are both 0.25 off."""
    return max(ratio, 1 / ratio) - 1 if ratio > 0 else math.inf


@dataclass
class ProfileCheck:
    """What ``check_profile`` found; ``warnings`` are the sentences to show. The probe's figures:
    ``probe_then_s`` at the end of the calibration, ``probe_now_s`` re-timed now (the same method:
    their ratio says whether the machine changed), and ``probe_profile_s`` what the profile's
    tables hold at those points (against ``probe_then_s``: whether the machine held steady while
    the tables were measured)."""

    tolerance: float
    probe_profile_s: float | None = None
    probe_then_s: float | None = None
    probe_now_s: float | None = None
    probe_points: list[dict[str, Any]] = field(default_factory=list)
    ratio: float | None = None  # now over then: the geometric mean of the points' ratios
    steady_ratio: float | None = None  # then over the tables, likewise
    fingerprint_differences: list[str] = field(default_factory=list)
    calibration_busy: str | None = None
    load_average_now: float | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def probe_ok(self) -> bool | None:
        r = self.ratio
        return None if r is None else off_by(r) <= self.tolerance

    @property
    def ok(self) -> bool:
        return not self.warnings

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "tolerance": self.tolerance, "probe_then_s": _sig(self.probe_then_s),
                "probe_now_s": _sig(self.probe_now_s), "probe_ratio": _sig(self.ratio), "probe_ok": self.probe_ok,
                "probe_profile_s": _sig(self.probe_profile_s), "probe_steady_ratio": _sig(self.steady_ratio),
                "probe_points": self.probe_points,
                "fingerprint_differences": self.fingerprint_differences, "calibration_busy": self.calibration_busy,
                "load_average_now": self.load_average_now, "warnings": self.warnings}


def _sig(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(f"{x:.4g}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def fingerprint_differences(profile) -> list[str]:
    """How this machine differs from the one the profile was measured on (device name, Python,
    torch, Triton where the profile used it, and CPU threads beyond the CPUs usable here), one
    ``"what: profile X, here Y"`` each."""
    import torch

    from pagesim.engine.calibrate.machine import device_info, versions

    dev = profile.device
    if dev.get("type") == "cuda" and not torch.cuda.is_available():
        return [f"device: profile CUDA ({dev.get('name')}), here no CUDA"]
    threads = int(profile.settings.get("threads") or 1)
    here = device_info(torch.device(dev.get("type", "cpu")), threads)
    out = []
    if "name" in dev and dev.get("name") != here.get("name"):
        out.append(f"device name: profile {dev.get('name')}, here {here.get('name')}")
    if dev.get("type") == "cpu" and threads > usable_cpus():
        out.append(f"CPU threads: profile {threads}, here {usable_cpus()} CPUs usable")
    now = versions()
    keys = ["python", "torch"] + (["triton"] if profile.settings.get("backend") == "triton" else [])
    for key in keys:
        if profile.versions.get(key) != now.get(key):
            out.append(f"{key}: profile {profile.versions.get(key)}, here {now.get(key)}")
    return out


def _table_median(profile, table: str, point) -> float | None:
    points = profile.tables[table].points()
    key = tuple(float(x) for x in point)
    return profile.tables[table].median_s[points.index(key)] if key in points else None


def check_profile(profile, *, tolerance: float = TOLERANCE, retime: bool = True, seed: int = 0) -> ProfileCheck:
    """Compare ``profile`` with this machine: the load it was measured under, its fingerprint, and
    (``retime``) its probe re-timed now against its time at the end of the calibration, and that
    time against the profile's tables at the probe's points. Every finding is one sentence of
    ``warnings``; nothing here raises for a profile that loaded."""
    import torch

    from pagesim.engine.model.weights import DTYPES

    check = ProfileCheck(tolerance=tolerance, load_average_now=load_average())
    check.calibration_busy = busy_words(profile.conditions)
    if check.calibration_busy:
        check.warnings.append(busy_warning(profile))
    check.fingerprint_differences = fingerprint_differences(profile)
    if check.fingerprint_differences:
        check.warnings.append("the profile was measured elsewhere: " + "; ".join(check.fingerprint_differences))
    if not retime:
        return check
    probe = profile.probe
    if not probe or not probe.get("points"):
        check.warnings.append("the profile has no probe (an older pagesim made it), so whether its timings still hold "
                              "here cannot be checked: calibrate again to record one")
        return check
    device_type = profile.device.get("type", "cpu")
    if device_type == "cuda" and not torch.cuda.is_available():
        return check  # (the fingerprint difference says so)
    tables = [_table_median(profile, p["table"], p["point"]) for p in probe["points"]]
    if None in tables:
        check.warnings.append("the profile's probe names points its tables do not hold: calibrate again")
        return check
    threads = torch.get_num_threads()
    if device_type == "cpu":
        torch.set_num_threads(int(profile.settings.get("threads") or 1))
    try:
        now = run_probe(probe_config(profile), [(p["table"], tuple(p["point"])) for p in probe["points"]],
                        device=torch.device(device_type), dtype=DTYPES[profile.model["dtype"]],
                        backend=str(profile.settings.get("backend", "torch")), seed=seed)
    except (ImportError, RuntimeError, ValueError, KeyError, MemoryError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        check.warnings.append(f"could not re-time the profile's probe here ({type(exc).__name__}: {first})")
        return check
    finally:
        torch.set_num_threads(threads)
    check.probe_profile_s, check.probe_then_s = sum(tables), float(probe["total_s"])
    check.probe_now_s = float(now["total_s"])
    check.probe_points = [{"table": a["table"], "point": a["point"], "profile_s": _sig(t), "then_s": _sig(a["median_s"]),
                           "now_s": _sig(b["median_s"])}
                          for a, b, t in zip(probe["points"], now["points"], tables)]
    check.ratio = _geometric_mean([b["median_s"] / a["median_s"] for a, b in zip(probe["points"], now["points"])])
    check.steady_ratio = _geometric_mean([a["median_s"] / t for a, t in zip(probe["points"], tables)])
    n = len(tables)
    if not check.probe_ok:
        load = check.load_average_now
        busy_now = f"; this machine's 1-minute load average is {load:.1f} on {usable_cpus()} CPUs now" \
            if load is not None else ""
        check.warnings.append(
            f"the profile no longer describes this machine: its probe ({n} of its grid points) took "
            f"{_ms(check.probe_then_s)} at calibration and takes {_ms(check.probe_now_s)} now; per point it takes "
            f"{check.ratio:.2f}x its time at calibration (geometric mean), more than {tolerance:.0%} off{busy_now}: "
            f"the profile's step times are likely too {'long' if check.ratio < 1 else 'short'} here; calibrate again here")
    steady = check.steady_ratio
    if off_by(steady) > tolerance:
        check.warnings.append(
            f"the machine did not hold steady while the profile was measured: at its probe's {n} grid points its "
            f"tables say {_ms(check.probe_profile_s)}, and the same points re-timed at the end of the calibration took "
            f"{_ms(check.probe_then_s)}; per point {steady:.2f}x the tables' times (geometric mean), more than "
            f"{tolerance:.0%} off: calibrate again on a quiet machine")
    return check


def _geometric_mean(ratios: list[float]) -> float:
    """Each point counts the same, whether it takes microseconds (the policy) or milliseconds."""
    return math.exp(sum(math.log(max(r, 1e-12)) for r in ratios) / len(ratios))  # (a 0 s sample: clock resolution)
