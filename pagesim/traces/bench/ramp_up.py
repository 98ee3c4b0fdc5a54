"""``vllm bench serve --ramp-up-strategy linear|exponential --ramp-up-start-rps A --ramp-up-end-rps B``:
send times at a request rate that rises over the run, as vLLM 0.33 makes them.

vLLM 0.33 (benchmarks/serve.py ``_get_current_request_rate``, :406-428, and ``get_request``,
:431-528) gives request ``i`` of ``n`` the rate

- linear: ``A + (B - A) * p``, exponential: ``A * (B / A) ** p``, with ``p = i / max(n - 1, 1)``,

then draws its delay after the previous one from a gamma distribution of shape ``burstiness`` and
scale ``1 / (rate * burstiness)`` (exponential for burstiness 1, ``1 / rate`` for an infinite
one) with NumPy's global generator, seeded by ``--seed`` (serve.py:2060-2061); the send times are the
running sum of the delays, the first request's own delay included. Unlike a constant rate, the
times are not rescaled to end at ``n / rate``. vLLM's checks (serve.py:2076-2094) are kept, as
one-line errors: no ``--request-rate`` besides ``inf`` (the default), both rates given, neither
negative, start <= end, and, for exponential, a start above 0. A linear start of 0 passes those
checks but then fails vLLM's assertion that every rate is positive (serve.py:493-494); here it is
refused up front. The rates are whole numbers of requests per second, as vLLM's flags are
(``type=int``).

vLLM also records, in the result file's ``rps_change_events``, each whole rate the ramp reaches
and the wall-clock time its first request was sent (serve.py:1053-1077); ``change_events`` gives
the same list with the simulated send time.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

STRATEGIES = ("linear", "exponential")


@dataclass(frozen=True)
class RampUp:
    strategy: str  # linear | exponential
    start_rps: int
    end_rps: int

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"--ramp-up-strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.start_rps < 0 or self.end_rps < 0:
            raise ValueError("--ramp-up-start-rps and --ramp-up-end-rps must be >= 0")
        if self.start_rps > self.end_rps:
            raise ValueError(f"--ramp-up-start-rps ({self.start_rps}) must not exceed --ramp-up-end-rps "
                             f"({self.end_rps})")
        if self.start_rps == 0:
            raise ValueError("--ramp-up-start-rps must be > 0 (a ramp from 0 sends its first request at rate 0, "
                             "which vLLM 0.33 refuses too)")

    def rates_rps(self, count: int) -> np.ndarray:
        """Each request's rate, in the order sent."""
        progress = np.arange(count, dtype=float) / max(count - 1, 1)
        if self.strategy == "linear":
            return self.start_rps + (self.end_rps - self.start_rps) * progress
        return self.start_rps * (self.end_rps / self.start_rps) ** progress

    def send_times_s(self, count: int, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
        """The send times of ``count`` requests (seconds from the start of the run)."""
        if count < 1:
            raise ValueError("ramp-up arrivals need at least one request")
        if not burstiness > 0:
            raise ValueError(f"--burstiness must be > 0, got {burstiness}")
        rates = self.rates_rps(count)
        if math.isinf(burstiness):
            delays = 1.0 / rates
        else:  # NOTE: drawn together, the legacy generator gives the draws vLLM makes one at a time
            delays = np.random.RandomState(seed).gamma(shape=burstiness, scale=1.0 / (rates * burstiness))
        return np.cumsum(delays)

    def change_events(self, send_times_s: np.ndarray) -> list[dict]:
        """vLLM's ``rps_change_events``: the start rate at time 0, then each whole rate reached,
        at the send time of the first request sent at it (``send_time_s``, simulated)."""
        events = [{"rps": self.start_rps, "send_time_s": 0.0}]
        reached = self.start_rps
        for rate, when in zip(self.rates_rps(len(send_times_s)), send_times_s):
            whole = int(rate)
            if whole > reached:
                events.extend({"rps": r, "send_time_s": float(when)} for r in range(reached + 1, whole + 1))
                reached = whole
        return events

    def describe(self) -> str:
        return f"{self.strategy} ramp-up from {self.start_rps} to {self.end_rps} requests/s"

    def file_name_part(self) -> str:
        """What vLLM's default result file name says instead of the rate (serve.py:1623-1624)."""
        return f"ramp-up-{self.strategy}-{self.start_rps}qps-{self.end_rps}qps"


def ramp_up_from_args(args: argparse.Namespace) -> RampUp | None:
    """The ramp-up the flags ask for (None: none), checked as vLLM checks it, with pagesim's own
    rule: a ramp-up sends a ``--dataset-name`` dataset's requests (a trace keeps its own times, a
    workload has ``--arrival``)."""
    strategy = getattr(args, "ramp_up_strategy", None)
    start, end = getattr(args, "ramp_up_start_rps", None), getattr(args, "ramp_up_end_rps", None)
    if strategy is None:
        if start is not None or end is not None:
            raise ValueError("--ramp-up-start-rps and --ramp-up-end-rps apply with --ramp-up-strategy "
                             "linear|exponential")
        return None
    rate = getattr(args, "rate", None)
    if rate is not None and not math.isinf(rate):
        raise ValueError("--ramp-up-strategy sets the request rate as it goes: leave out --request-rate "
                         "(as vllm bench serve requires)")
    if start is None or end is None:
        raise ValueError("--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps")
    if getattr(args, "dataset_name", None) is None:
        raise ValueError("--ramp-up-strategy sends a --dataset-name dataset's requests (a --trace keeps its own "
                         "times; a --workload takes --arrival piecewise:DUR@RATE,...)")
    return RampUp(strategy, start, end)
