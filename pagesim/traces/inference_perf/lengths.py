"""Token counts as inference-perf configures them: a fixed number, or a clipped, rounded normal.

inference-perf's ``Distribution`` (``config/common.py``; ``config.py`` in 2025 releases) holds
``min``, ``max``, ``mean``, ``std_dev`` and, from 2026, a ``type``. Its generators draw lengths
with ``generate_distribution`` (random, synthetic) or ``sample_from_distribution`` (shared_prefix;
``utils/numeric/distribution/utils.py``); for the two types read here both do the same:

- ``normal`` (the only one before 2026): ``normal(mean, std_dev)``, clipped to ``[min, max]``,
  rounded, clipped again;
- ``fixed``: ``int(mean)`` every time.

The other types (``uniform``, ``lognormal``, ``skew_normal``, ``poisson``) are refused: the two
functions parametrise some of them differently and pagesim does not guess which one ran.
pagesim draws from its own seeded generator: inference-perf seeds its own (or not at all, before
2026), so the lengths follow the same distribution, not the same sequence.

A prompt or an output of 0 tokens is refused (``min`` must be >= 1): pagesim's requests have at
least one of each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagesim.traces.inference_perf.keys import Node
from pagesim.traces.limits import MAX_LENGTH_TOKENS

DISTRIBUTION_TYPES = ("normal", "fixed")


@dataclass(frozen=True)
class Lengths:
    """Token counts: ``mean`` exactly when ``fixed``, else a normal clipped to ``[min, max]``."""

    mean: float
    std_dev: float = 0.0
    min_tokens: int | None = None  # None when fixed
    max_tokens: int | None = None

    @property
    def fixed(self) -> bool:
        return self.min_tokens is None

    @property
    def largest(self) -> int:
        return int(self.mean) if self.fixed else self.max_tokens

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` lengths (int64), as inference-perf draws them."""
        if self.fixed:
            return np.full(count, int(self.mean), dtype=np.int64)
        drawn = np.clip(rng.normal(self.mean, self.std_dev, count), self.min_tokens, self.max_tokens)
        return np.clip(np.round(drawn), self.min_tokens, self.max_tokens).astype(np.int64)

    def describe(self) -> str:
        if self.fixed:
            return f"{int(self.mean)}"
        return f"normal(mean {self.mean:g}, sd {self.std_dev:g}, {self.min_tokens}..{self.max_tokens})"


def fixed_length(node: Node, *, minimum: int = 1) -> Lengths:
    """A length written as a whole number of tokens."""
    return Lengths(float(node.count(minimum=minimum, maximum=MAX_LENGTH_TOKENS)))


def distribution(node: Node) -> Lengths:
    """A ``Distribution`` mapping. ``mean`` is required, and for a normal ``min``, ``max`` and
    ``std_dev`` (or ``variance``) too: pagesim reads what the run wrote (its ``config.yaml`` holds
    every field) rather than fill in inference-perf's defaults."""
    node.required()
    kind = node["type"].choice(DISTRIBUTION_TYPES, default="normal")
    if kind == "fixed":
        mean = node["mean"].number(minimum=1, maximum=MAX_LENGTH_TOKENS)
        if int(mean) < 1:
            raise node["mean"].error("must be at least 1 token once truncated to a whole number")
        return Lengths(float(int(mean)))
    low = node["min"].count(minimum=1, maximum=MAX_LENGTH_TOKENS)
    high = node["max"].count(minimum=1, maximum=MAX_LENGTH_TOKENS)
    if low > high:
        raise node["min"].error(f"({low}) must not exceed {node['max'].key} ({high})")
    mean = node["mean"].number(minimum=None)
    if not low <= mean <= high:
        raise node["mean"].error(f"must lie between {node['min'].key} and {node['max'].key} ({low}..{high})")
    if node["variance"].present:
        if node["std_dev"].present and node["std_dev"].number(minimum=0) > 0:
            raise node.error("gives both std_dev and variance: keep one")
        std_dev = math.sqrt(node["variance"].number(minimum=0))
    else:
        std_dev = node["std_dev"].number(minimum=0)
    if not std_dev < 1e12:
        raise node["std_dev"].error("must be below 1e12 tokens")
    return Lengths(mean, std_dev, low, high)


def length_or_distribution(node: Node, *, minimum: int = 1) -> Lengths:
    """A length field that may hold a whole number or (inference-perf 2026) a distribution."""
    return distribution(node) if isinstance(node.required().value, dict) else fixed_length(node, minimum=minimum)
