"""How many tokens a served request generates: ``max_tokens`` with ``ignore_eos``, else a drawn length.

A real model stops at its end-of-sequence token; pagesim's outputs are synthetic, so where a
request honours EOS (no ``ignore_eos``) each sample's length is drawn from a distribution the
user sets with ``--output-lens`` and then bounded by the request: at least ``min_tokens`` (and 1),
at most ``max_tokens`` (a sample that reaches ``max_tokens`` ends with finish reason ``length``,
one that stops before it with ``stop``). The spellings:

- ``max`` (the default): no EOS comes; every sample runs to ``max_tokens``, as with ``ignore_eos``;
- ``fixed:N``: EOS after N tokens;
- ``uniform:A:B``: uniform on A..B;
- ``trace:PATH``: drawn from the output lengths of a trace pagesim reads (Azure, Mooncake, BurstGPT,
  ShareGPT, a CSV or JSONL of lengths: ``pagesim trace`` lists the formats).

Draws come from one generator seeded by ``--seed``, in the order requests arrive.
"""

from __future__ import annotations

import numpy as np

SPELLINGS = "max, fixed:N, uniform:A:B or trace:PATH"


class OutputLengths:
    def __init__(self, spec: str = "max", *, seed: int = 0):
        self.spec = spec
        self._rng = np.random.default_rng([seed, 7])
        self._values: np.ndarray | None = None  # the lengths drawn from (None: "max")
        self._uniform: tuple[int, int] | None = None
        kind, _, rest = spec.partition(":")
        if kind == "max" and not rest:
            pass
        elif kind == "fixed":
            self._values = np.array([_positive(rest, spec)])
        elif kind == "uniform":
            low, _, high = rest.partition(":")
            a, b = _positive(low, spec), _positive(high, spec)
            if a > b:
                raise ValueError(f"--output-lens {spec}: A must be at most B")
            self._uniform = (a, b)
        elif kind == "trace" and rest:
            from pagesim.traces.loaders import load_trace

            lengths = np.asarray(load_trace(rest).output_len, dtype=np.int64)
            lengths = lengths[lengths >= 1]
            if not len(lengths):
                raise ValueError(f"--output-lens {spec}: the trace has no output length of at least 1")
            self._values = lengths
        else:
            raise ValueError(f"--output-lens: {spec!r} is not one of {SPELLINGS}")

    def describe(self) -> str:
        if self._values is None and self._uniform is None:
            return "no EOS: every sample runs to max_tokens"
        if self._uniform is not None:
            return f"EOS after a length uniform on {self._uniform[0]}..{self._uniform[1]}"
        if len(self._values) == 1:
            return f"EOS after {int(self._values[0])} tokens"
        return f"EOS after a length drawn from {self.spec[6:]} ({len(self._values):,} lengths, median " \
               f"{int(np.median(self._values))})"

    def draw(self, n: int, max_tokens: int, min_tokens: int, ignore_eos: bool) -> tuple[int, ...]:
        """Each of ``n`` samples' output length."""
        if ignore_eos or (self._values is None and self._uniform is None):
            return (max_tokens,) * n
        if self._uniform is not None:
            drawn = self._rng.integers(self._uniform[0], self._uniform[1] + 1, size=n)
        else:
            drawn = self._values[self._rng.integers(0, len(self._values), size=n)]
        low = max(1, min_tokens)
        return tuple(int(min(max_tokens, max(low, x))) for x in drawn)


def _positive(text: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"--output-lens {spec}: {text!r} is not a whole number of tokens >= 1")
    return value
