"""``--num-warmups N`` on the real engine: N copies of the first request served before the measured run.

vllm bench serve (vLLM 0.33 benchmarks/serve.py:926-951) sends N copies of the first request, at
most ``--max-concurrency`` at once, waits for all of them, and only then starts the run it
measures; the warm-ups count in no figure. What they are for is the server's cold start: the
first calls into the model compile kernels and grow the allocator's pools. ``pagesim run`` has
the same cold start (torch's first calls, Triton's compilation), so it serves the warm-ups for
real, on an engine of its own with the same model and settings, and then measures the run on a
fresh engine: the process is warm, the KV cache starts empty, and no warm-up touches the
measured run's figures, counters or decision log.

NOTE: vLLM's warm-ups also leave the first prompt in the server's prefix cache; a fresh engine
does not have it. That is the one state pagesim's warm-ups leave out, on purpose: the measured
run's prefix hits are then all its own. (``simulate`` has no cold start at all: there
``--num-warmups`` changes nothing, and says so.)
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable


def serve_warmups(make_engine: Callable[[], object], first_request, count: int, *,
                  max_concurrency: int | None = None) -> float:
    """Serve ``count`` copies of ``first_request`` (all due at once) on an engine from
    ``make_engine``, which is then dropped; returns the wall seconds they took."""
    import time

    if count < 1:
        return 0.0
    print(f"pagesim run: warming up with {count} request(s) (copies of the first; counted in no figure)",
          file=sys.stderr, flush=True)
    copies = []
    for k in range(count):
        request = copy.deepcopy(first_request)
        request.request_id = f"warmup-{k}"
        request.arrival_time_s = 0.0
        copies.append(request)
    from pagesim.engine.policy.scheduling.steps.vllm_v0 import VLLM_V0_ABORTS, abort_words
    from pagesim.engine.runtime.engine import EngineStalled

    started = time.perf_counter()
    try:
        engine = make_engine()
    except (RuntimeError, MemoryError) as exc:  # as the measured run's engine reports it
        raise ValueError(f"cannot allocate the warm-up engine's KV cache: {str(exc).splitlines()[0]}") from None
    try:
        engine.run(copies, max_concurrency=max_concurrency)
    except EngineStalled as exc:
        raise ValueError(f"warming up: the scheduler stopped making progress: {exc}") from None
    except VLLM_V0_ABORTS as exc:
        raise ValueError(f"warming up: {abort_words(exc)}") from None
    del engine  # (its KV cache goes before the measured run's is made)
    return time.perf_counter() - started
