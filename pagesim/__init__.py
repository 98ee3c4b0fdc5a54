"""pagesim: a what-if simulator and a real engine for paged KV-cache LLM serving.

Every module pagesim installs is under this one name (it installs no other top-level package):

- ``pagesim.engine``: the serving policy (``pagesim.engine.policy``, pure Python: block pool,
  prefix cache, scheduler), the model catalog, the command line, and the real engine on KV
  tensors (``pagesim.engine.runtime``; torch, the ``engine`` extra);
- ``pagesim.kernels``: the Triton and torch kernels the engine runs (the ``engine`` extra);
- ``pagesim.sim``: the SimPy simulator that drives the same policy, and its cost models;
- ``pagesim.traces``: request traces and vLLM bench / inference-perf workloads;
- ``pagesim.reports``: what-if studies, their reports, and the engine-vs-simulator validation.

Importing ``pagesim`` imports nothing else.
"""
