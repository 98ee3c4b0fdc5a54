"""Length distributions: how many prompt or output tokens a synthetic request has.

- ``Fixed(tokens)``; ``Uniform(low, high)`` (integers, both ends included);
- ``LogNormal(mean, cv, low=1, high=None)``: a lognormal with that mean and coefficient of
  variation, rounded to whole tokens and clipped to ``[low, high]`` (clipping moves the mean a
  little; with ``high=None`` only the rare draws below ``low`` move);
- ``TruncatedLogNormal(mean, cv, high)``: a lognormal of shape ``cv`` rounded to whole tokens,
  with lengths outside ``[1, high]`` redrawn, whose location is solved so that the lengths drawn
  have mean ``mean`` exactly in expectation (a hard cap such as a benchmark's, without moving the
  mean);
- ``Empirical(values)``: resampled with replacement from observed lengths;
- ``LengthPairs(prompt, output)``: (prompt, output) *pairs* resampled together from a length
  file such as the ShareGPT table, keeping their correlation.

``parse_lengths("lognormal:mean=161.31,cv=1")`` builds one from a CLI flag.

Every length lies in ``[1, MAX_LENGTH_TOKENS]`` (``pagesim.traces.limits``): a bound that asks
for more (a fixed length of 1e14 tokens, a uniform or lognormal reaching past it) is refused, and
a lognormal without a ``high`` is cut at it, so a generated trace never holds a length no model
could take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pagesim.traces.limits import MAX_LENGTH_TOKENS


def _check_tokens(what: str, tokens: int) -> None:
    if not 1 <= tokens <= MAX_LENGTH_TOKENS:
        raise ValueError(f"{what} must be from 1 to {MAX_LENGTH_TOKENS:,} tokens, got {tokens:,}")


@dataclass(frozen=True)
class Fixed:
    tokens: int

    def __post_init__(self) -> None:
        _check_tokens("a fixed length", self.tokens)

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(count, self.tokens, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(self.tokens)


@dataclass(frozen=True)
class Uniform:
    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"uniform lengths need 1 <= low <= high, got {self.low}..{self.high}")
        _check_tokens("a uniform length's high end", self.high)

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, count, dtype=np.int64)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class LogNormal:
    mean: float
    cv: float
    low: int = 1
    high: int | None = None

    def __post_init__(self) -> None:
        if not (np.isfinite(self.mean) and 1 <= self.mean <= MAX_LENGTH_TOKENS):
            raise ValueError(f"a lognormal length needs a mean from 1 to {MAX_LENGTH_TOKENS:,} tokens, got {self.mean}")
        if not (np.isfinite(self.cv) and 0 < self.cv <= 1000):
            raise ValueError(f"a lognormal length needs 0 < cv <= 1000, got {self.cv}")
        if self.low < 1 or (self.high is not None and self.high < self.low):
            raise ValueError(f"lognormal bounds need 1 <= low <= high, got {self.low}..{self.high}")
        _check_tokens("a lognormal length's low end", self.low)
        if self.high is not None:
            _check_tokens("a lognormal length's high end", self.high)

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        sigma2 = np.log1p(self.cv**2)
        mu = np.log(self.mean) - sigma2 / 2
        # NOTE: clipped as floats: a draw past int64 must not wrap around before it is cut
        draws = np.clip(rng.lognormal(mu, np.sqrt(sigma2), count), self.low, self.high or MAX_LENGTH_TOKENS)
        return np.rint(draws).astype(np.int64)


@dataclass(frozen=True)
class TruncatedLogNormal:
    mean: float  # of the whole-token lengths drawn
    cv: float  # shape: the coefficient of variation of the lognormal before truncation
    high: int  # longest length kept
    mu: float = field(init=False, repr=False)
    _kept: float = field(init=False, repr=False)  # share of draws inside [1, high]

    MAX_HIGH = 1 << 16  # the mean is solved over every length 1..high

    def __post_init__(self) -> None:
        if not (np.isfinite(self.cv) and self.cv > 0):
            raise ValueError(f"a lognormal length needs cv > 0, got {self.cv}")
        if not 2 <= self.high <= self.MAX_HIGH:
            raise ValueError(f"a truncated lognormal needs 2 <= high <= {self.MAX_HIGH}, got {self.high}")
        if not (np.isfinite(self.mean) and 1 < self.mean < self.high):
            raise ValueError(f"a truncated lognormal needs 1 < mean < high, got {self.mean} and {self.high}")
        sigma = self.sigma
        # a draw x becomes length k = rint(x); k in [1, high] is kept: edges at k +- 0.5
        log_edges = np.log(np.arange(self.high + 1) + 0.5)
        lengths = np.arange(1, self.high + 1)

        def stats(mu: float) -> tuple[float, float]:
            cdf = 0.5 * (1.0 + _erf((log_edges - mu) / (sigma * math.sqrt(2.0))))
            mass = np.diff(cdf)
            kept = float(mass.sum())
            return (float(lengths @ mass) / kept if kept > 0 else float("nan")), kept

        lo, hi = math.log(0.5) - 10 * sigma, math.log(self.high + 0.5) + 10 * sigma
        for _ in range(100):  # bisection: the mean of the kept lengths grows with mu
            mid = (lo + hi) / 2
            mean, _ = stats(mid)
            if not mean >= self.mean:
                lo = mid
            else:
                hi = mid
        mu = (lo + hi) / 2
        mean, kept = stats(mu)
        if not abs(mean / self.mean - 1) < 1e-6 or kept < 0.05:
            raise ValueError(f"no lognormal of cv {self.cv} cut to [1, {self.high}] has mean {self.mean} "
                             f"while keeping at least 5% of its draws")
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "_kept", kept)

    @property
    def sigma(self) -> float:
        return math.sqrt(math.log1p(self.cv**2))

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        out = np.empty(0, dtype=np.int64)
        while out.size < count:
            draws = rng.lognormal(self.mu, self.sigma, int((count - out.size) / self._kept * 1.1) + 16)
            kept = draws[(draws >= 0.5) & (draws < self.high + 0.5)]
            out = np.concatenate([out, np.rint(kept).astype(np.int64)])
        return np.clip(out[:count], 1, self.high)


_erf = np.vectorize(math.erf, otypes=[float])


@dataclass(frozen=True, eq=False)
class Empirical:
    values: np.ndarray

    def __post_init__(self) -> None:
        if len(self.values) == 0 or np.min(self.values) < 1 or np.max(self.values) > MAX_LENGTH_TOKENS:
            raise ValueError(f"empirical lengths need at least one value, all from 1 to {MAX_LENGTH_TOKENS:,}")

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), count)]

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))


@dataclass(frozen=True, eq=False)
class LengthPairs:
    prompt: np.ndarray
    output: np.ndarray
    source: str = ""

    def sample(self, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        rows = rng.integers(0, len(self.prompt), count)
        return self.prompt[rows], self.output[rows]

    @classmethod
    def from_file(cls, path, **load_options) -> LengthPairs:
        """The (prompt, output) pairs of any trace file (e.g. the ShareGPT length table)."""
        from pagesim.traces.loaders import load_trace

        trace = load_trace(path, **load_options)
        return cls(trace.prompt_len, trace.output_len, source=str(path))


def parse_lengths(text: str) -> Fixed | Uniform | LogNormal:
    """``N`` | ``fixed:N`` | ``uniform:LOW:HIGH`` | ``lognormal:mean=M,cv=C[,low=L][,high=H]``."""
    kind, _, args = text.strip().partition(":")
    usage = (f"cannot read length distribution {text!r}: use N, fixed:N, uniform:LOW:HIGH "
             "or lognormal:mean=M,cv=C[,low=L][,high=H]")
    try:
        if kind.isdigit() and not args:
            return Fixed(int(kind))
        if kind == "fixed":
            return Fixed(int(args))
        if kind == "uniform":
            low, high = (int(v) for v in args.split(":"))
            return Uniform(low, high)
        if kind == "lognormal":
            options = dict(part.split("=", 1) for part in args.split(",") if part)
            if set(options) - {"mean", "cv", "low", "high"} or not {"mean", "cv"} <= set(options):
                raise ValueError(usage)
            mean, cv = float(options["mean"]), float(options["cv"])
            low = int(options.get("low", 1))
            high = int(options["high"]) if "high" in options else None
            return LogNormal(mean, cv, low, high)
    except ValueError as exc:
        # our own range checks say what is wrong; a number that does not parse gets the usage
        if "must" in str(exc) or "need" in str(exc) or str(exc) == usage:
            raise
        raise ValueError(usage) from None
    raise ValueError(usage)
