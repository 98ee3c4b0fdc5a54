"""What keeps a vLLM bench result file (real or pagesim's) from being read: one line naming the key.

``result_problem(result)`` checks every figure ``pagesim compare`` and ``pagesim calibrate
--from-measurements`` read: each is null or a finite number >= 0 (counts whole), every per-request
list is a list with an entry per request (all of one length), its entries finite numbers >= 0
(``itls``: a list of them per request; ``errors`` and ``generated_texts``: text); it quotes none of
the file.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import numpy as np

from pagesim.engine.files import describe_value, number_problem

SCALARS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
           "request_goodput", "output_throughput", "total_token_throughput", "max_concurrent_requests",
           "max_output_tokens_per_s")
LATENCY_KEY = re.compile(r"^(mean|median|std|p[0-9.]+)_([a-z0-9_]+)_ms$")
COUNTS = ("completed", "failed", "total_input_tokens", "total_output_tokens")  # whole numbers
# vLLM's per-request lists (--save-detailed) and what each entry is
PER_REQUEST = {"input_lens": "count", "output_lens": "count", "ttfts": "seconds", "latencies": "seconds",
               "start_times": "time", "itls": "gaps", "errors": "text", "generated_texts": "text"}


def result_problem(result: dict[str, Any]) -> str | None:
    """The first thing that keeps ``result`` (a result file's object) from being compared, as
    ``KEY: problem`` (``ttfts[2]: must be a number, found null``), or None."""
    for key in [k for k in SCALARS if k in result] + sorted(k for k in result if LATENCY_KEY.match(k)):
        value = result[key]
        problem = None if value is None else number_problem(value, integer=key in COUNTS)
        if problem is not None:
            return f"{key}: {problem}"
    lengths: dict[str, int] = {}
    for key, kind in PER_REQUEST.items():
        values = result.get(key)
        if values is None:
            continue
        if not isinstance(values, list):
            return f"{key}: must be a list (an entry per request), found {describe_value(values)}"
        problem = _entries_problem(key, values, kind)
        if problem is not None:
            return problem
        lengths[key] = len(values)
    by_length: dict[int, list[str]] = {}
    for key, length in lengths.items():
        by_length.setdefault(length, []).append(key)
    if len(by_length) > 1:  # the most keys agree on the number of requests; name the first that does not
        (n_most, most), (n_odd, odd) = sorted(by_length.items(), key=lambda item: -len(item[1]))[:2]
        return (f"{_keys(odd)} {'has' if len(odd) == 1 else 'have'} {n_odd:,} entries but {_keys(most)} "
                f"{'has' if len(most) == 1 else 'have'} {n_most:,} (a per-request list has an entry per request)")
    return None


def _keys(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else f"{', '.join(keys[:-1])} and {keys[-1]}"


def _entries_problem(key: str, values: list, kind: str) -> str | None:
    """What is wrong with the first bad entry of a per-request list, or None (numbers are checked
    together with numpy once their types are known to be right)."""
    if kind == "text":
        bad = next((k for k, v in enumerate(values) if not isinstance(v, str)), None)
        return None if bad is None else f"{key}[{bad}]: must be text, found {describe_value(values[bad])}"
    if kind == "gaps":
        bad = next((k for k, v in enumerate(values) if not isinstance(v, list)), None)
        if bad is not None:
            return f"{key}[{bad}]: must be a list of gaps (seconds), found {describe_value(values[bad])}"
        numbers = list(itertools.chain.from_iterable(values))
    else:
        numbers = values
    if all(type(v) in (int, float) for v in numbers):  # (not bool, not a subclass)
        array = np.asarray(numbers, dtype=float)
        fine = np.isfinite(array) & ((array >= 0) if kind != "time" else True)
        if kind == "count":
            fine &= array == np.floor(array)
        if fine.all():
            return None
    for k, v in enumerate(values):  # name the first bad one
        for j, number in enumerate(v if kind == "gaps" else [v]):
            problem = number_problem(number, minimum=None if kind == "time" else 0, integer=kind == "count")
            if problem is not None:
                return f"{key}[{k}]{f'[{j}]' if kind == 'gaps' else ''}: {problem}"
    return None
