"""``math.fsum`` of a float64 array, bit for bit, in a few vectorized passes instead of a Python
float per element.

The idea is Rump, Ogita and Oishi's error-free extraction ("Accurate floating-point summation,
part I", SIAM J. Sci. Comput. 31(1), 2008): for ``n`` values with ``max |p_i| <= 2**e`` and
``sigma = 2**(M + e)``, ``M = ceil(log2(n + 2))``,

- ``q_i = (sigma + p_i) - sigma`` is computed exactly (Sterbenz: both operands lie in
  ``[sigma/2, 2 sigma]``) and is a multiple of ``2**-53 sigma``;
- ``p_i - q_i`` is the rounding error of ``sigma + p_i``, so it is representable and computed
  exactly: ``p_i = q_i + (p_i - q_i)`` with ``|p_i - q_i| <= 2**-53 sigma``;
- every partial sum of the ``q_i``, in any order, is a multiple of ``2**-53 sigma`` below
  ``sigma`` in magnitude, hence exact: ``np.sum`` (pairwise) returns ``sum(q_i)`` exactly.

So each level takes the top ``53 - M`` bits or so of every value into one exact float, and
leaves exact residuals ``2**(53 - M)`` times smaller; a few levels leave nothing. The exact sum
of the values is then the exact sum of the levels' floats, and ``math.fsum`` of those few floats
rounds it once, to nearest even: the float ``math.fsum`` of the values gives (both are the
exact sum correctly rounded).

Invariant: ``exact_sum(values) == math.fsum(values)`` bit for bit, or the same error, for every
1-D float64 array. Whatever the extraction cannot take safely (NaN or infinities, values whose
``sigma`` would overflow or reach the subnormal range, more than ``MAX_LEVELS`` levels, all
zeros, short arrays) goes to ``math.fsum`` itself.
"""

from __future__ import annotations

import math

import numpy as np

#: Below this many values ``math.fsum`` costs less than the passes' set-up.
MIN_VECTORIZED = 512
#: Levels tried before handing the values to ``math.fsum`` (a value range beyond ~200 bits).
MAX_LEVELS = 6
_MAX_EXPONENT = 1000  # sigma = 2**k: far from overflow (and n * max|p| < sigma)
_MIN_EXPONENT = -960  # 2**-53 sigma far above the subnormal range: no extraction underflows


def exact_sum(values: np.ndarray) -> float:
    """``math.fsum(values)`` for a 1-D float64 array (module docstring)."""
    n = len(values)
    if n < MIN_VECTORIZED:
        return math.fsum(memoryview(np.ascontiguousarray(values)))
    m = (n + 1).bit_length()  # ceil(log2(n + 2))
    levels: list[float] = []
    p = values
    q = np.empty(n)
    for _ in range(MAX_LEVELS):
        top = max(float(p.max()), -float(p.min()))  # max |p| (NaN if any is)
        if top == 0.0:
            if not levels:  # (zeros only: their sign is fsum's business)
                break
            return math.fsum(levels)
        if not math.isfinite(top):
            break
        k = m + math.frexp(top)[1]  # top < 2**frexp(top)[1]
        if not _MIN_EXPONENT <= k <= _MAX_EXPONENT:
            break
        sigma = math.ldexp(1.0, k)
        np.add(p, sigma, out=q)
        q -= sigma
        levels.append(float(q.sum()))
        p = p - q if p is values else np.subtract(p, q, out=p)  # (the caller's array is never written)
    return math.fsum(memoryview(np.ascontiguousarray(values)))
