"""The cost model's free parameters a fit to measurements moves, with the bounds that keep them physical.

Each describes the GPU and the serving stack, not one model, so a profile fitted on one model
applies to another on the same GPU and stack (``pagesim.sim.cost.roofline.RooflineParams`` says
what each prices):

- ``mem_efficiency``: the fraction of HBM bandwidth weights and KV reads reach (decode);
- ``mfu``: the fraction of peak FLOP/s the linear layers reach (prefill);
- ``cpu_step_s``: the engine's per-step time besides its kernels (sampler sync, output handling);
- ``frontend_in_s``: the serving path's time from the client's send to the engine core's queue
  (``pagesim.sim.serving_path``): the first-token path's fixed term, which TTFT carries whole and
  per-token latency not at all;
- ``interconnect_efficiency``: the fraction of the GPU link's bandwidth the all-reduces reach,
  free only when a measurement ran with tensor parallelism (otherwise nothing measured moves it);
- ``cpu_per_seq_s``: the scheduler's and input preparation's CPU time per scheduled sequence,
  free only when a measurement's server does not schedule asynchronously (otherwise it runs
  beside the forward pass, and nothing measured moves it).

The optimizer works in ``x = log(value / start)``: every parameter is positive, its scale is
relative, and the start is ``x = 0``. Bounds are ``LOWER <= value <= UPPER`` (efficiencies at most 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagesim.sim.cost.roofline import RooflineParams
from pagesim.sim.serving_path import VLLM_FRONTEND_IN_S, VLLM_FRONTEND_OUT_S


@dataclass(frozen=True)
class FreeParam:
    name: str
    lower: float
    upper: float
    start: float
    what: str
    serving_path: bool = False  # a serving-path term, not a roofline parameter

    def __post_init__(self) -> None:
        if not 0 < self.lower <= self.start <= self.upper:
            raise ValueError(f"{self.name}: start {self.start!r} outside its bounds [{self.lower!r}, {self.upper!r}]")


_DEFAULTS = RooflineParams()

#: Every parameter a fit may free, in the order profiles list them.
FREE_PARAMS: dict[str, FreeParam] = {p.name: p for p in (
    FreeParam("mem_efficiency", 0.3, 1.0, _DEFAULTS.mem_efficiency, "fraction of HBM bandwidth reached"),
    FreeParam("mfu", 0.2, 1.0, _DEFAULTS.mfu, "fraction of peak FLOP/s in the linear layers"),
    FreeParam("cpu_step_s", 1e-5, 0.02, _DEFAULTS.cpu_step_s, "per-step engine time besides the kernels, s"),
    FreeParam("frontend_in_s", 1e-4, 0.2, VLLM_FRONTEND_IN_S, "client send to the engine core's queue, s",
              serving_path=True),
    FreeParam("interconnect_efficiency", 0.1, 1.0, _DEFAULTS.interconnect_efficiency,
              "fraction of the GPU link's bandwidth in all-reduces"),
    FreeParam("cpu_per_seq_s", 1e-7, 1e-3, _DEFAULTS.cpu_per_seq_s, "per scheduled sequence CPU time, s"),
)}


def free_params(max_tp: int, overlapped: bool = True) -> tuple[FreeParam, ...]:
    """The parameters measurements of at most ``max_tp`` GPUs per replica can move; with
    ``overlapped`` (every measurement's server schedules asynchronously, so the per-sequence CPU
    work hides behind the forward pass) ``cpu_per_seq_s`` is not among them."""
    skip = {"interconnect_efficiency"} if max_tp <= 1 else set()
    if overlapped:
        skip.add("cpu_per_seq_s")
    return tuple(p for p in FREE_PARAMS.values() if p.name not in skip)


def values(free: tuple[FreeParam, ...], x: np.ndarray) -> dict[str, float]:
    """The parameter values at optimizer point ``x`` (clipped into their bounds)."""
    return {p.name: min(max(p.start * math.exp(float(v)), p.lower), p.upper) for p, v in zip(free, x)}


def bounds(free: tuple[FreeParam, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The bounds on ``x``."""
    return (np.array([math.log(p.lower / p.start) for p in free]),
            np.array([math.log(p.upper / p.start) for p in free]))


def simulation_settings(params: dict[str, float]) -> tuple[dict[str, float], tuple[float, float] | None]:
    """``params`` split into roofline overrides and the serving path's frontend terms in ms (in,
    out; None: the path's own), as ``--cost-param`` and ``--frontend-latency-ms`` take them."""
    roofline = {k: v for k, v in params.items() if k not in FREE_PARAMS or not FREE_PARAMS[k].serving_path}
    frontend = None
    if "frontend_in_s" in params:
        frontend = (params["frontend_in_s"] * 1e3, VLLM_FRONTEND_OUT_S * 1e3)
    return roofline, frontend
