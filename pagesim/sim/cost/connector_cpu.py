"""The scheduler's CPU time in vLLM 0.15's KV offloading connector, and how much of it a step shows.

vLLM 0.15.1's ``OffloadingConnector`` decides a step's stores inside ``schedule()``
(``build_connector_meta``), and its CPU manager (``LRUOffloadingManager.prepare_store``) finds
room for a store by walking every block it holds, least recently used first, for one that is
not pinned. A store is reported done only once its request has finished, so a running request's
blocks stay pinned for its whole life (``pagesim.engine.policy.offload.manager``); once they fill
the store, every offer is refused after a walk through all of it, logs a warning, and is made
again at the next step. With 128 long requests and a 4,096-block store that is tens of
milliseconds of Python a step: the scheduler, not the GPU, then sets the pace.

The offload store counts what the walks visit (``OffloadStore.step_scan_entries``, and the
refused offers, ``step_refusals``); this module prices them:

- ``OFFLOAD_SCAN_ENTRY_S`` per entry walked, and ``OFFLOAD_REFUSAL_S`` per refused offer (its
  hashes filtered against the store and the warning line written to the server's log file):
  measured by ``benchmarks/bench_offload_scan.py``, which builds the same structures (an
  ``OrderedDict`` of ``ctypes`` block states, ordered by LRU touches as a long run leaves it) and
  times the same Python operations under Python 3.12, vLLM's image's: 83 ns an entry for a
  4,096-entry store (61 at 1,024, 146 at 16,384; 56-62 for a freshly built one) and 10.4 us a
  refusal on this project's machine. The same for every model and GPU: it is the host's Python,
  not the accelerator.
- Under asynchronous scheduling (vLLM's default) ``schedule()`` for the next step runs while the
  current one computes (``step_with_batch_queue``), so only the part of this time beyond the
  step's forward pass lengthens it (``exposed_cpu_s``); without it, all of it does.

vLLM 0.33's manager keeps a heap of the evictable blocks instead (its ``policies/lru.py``): no
walk, nothing to price.
"""

from __future__ import annotations

#: Seconds per entry vLLM 0.15's CPU offload manager walks looking for an unpinned block.
OFFLOAD_SCAN_ENTRY_S = 80e-9
#: Seconds per offer it refuses, besides the walk: the offered hashes filtered, a warning logged.
OFFLOAD_REFUSAL_S = 10e-6


def exposed_cpu_s(cpu_s: float, forward_s: float, *, overlap: bool) -> float:
    """The part of a step's scheduler CPU time ``cpu_s`` that lengthens it: beyond the forward
    pass ``forward_s`` when the two overlap (asynchronous scheduling), else all of it."""
    return max(0.0, cpu_s - forward_s) if overlap else cpu_s
