"""Disaggregated prefill and decode in the simulator: two pools, a proxy, KV over a network.

``cluster.py`` runs it (``DisaggCluster``), ``network.py`` moves the KV (placement, links, ports),
``setup.py`` builds and checks the pools, ``metrics.py`` summarizes (TTFT split, per-pool figures,
goodput per GPU) and ``cli.py`` is ``pagesim simulate --prefill-replicas P --decode-replicas D``.
The policy on both sides is the shared scheduler with vLLM 0.33's NixlConnector
(``pagesim.engine.policy.disagg``).
"""
