"""Study presets: specs that ship with pagesim, named instead of a TOML path.

``demo`` is the README's first command: a small study a laptop finishes in a couple of minutes,
on a workload embedded in pagesim (``shared-system-prompt``: requests sharing a few long system
prompts, so prefix caching, eviction and block size all matter) with a KV cache small enough
that requests get preempted, so swap and recompute differ.
"""

from __future__ import annotations

DEMO = """
name = "demo"
description = "Llama 3 8B on one A100 40 GB with a 2 GiB KV cache, serving requests that share a few long system prompts: which block size, eviction policy and preemption mode, and how paging compares with contiguous reservation."

[source]
workload = "shared-system-prompt"
rate = 6.0
num_requests = 300
seed = 0

[base]
model = "llama3-8b"
gpu = "a100-40gb"
kv_cache_gb = 2.0
block_size = 16
eviction = "lru"
preemption = "recompute"

[[grid]]  # the question: block size x eviction x preemption
block_size = [8, 16, 32]
eviction = ["lru", "fifo"]
preemption = ["recompute", "swap"]

[[grid]]  # load: throughput and latency vs request rate per block size
block_size = [8, 16, 32]
rate_scale = [0.5, 1.0, 1.5]

[[grid]]  # memory: paging vs the Orca baselines' contiguous reservations
allocator = ["paged", "max", "pow2", "oracle"]

[[grid]]  # prefix cache: hit rate vs cache size per eviction policy
kv_cache_gb = [1.0, 2.0, 4.0]
eviction = ["lru", "fifo", "lfu", "radix-leaf"]
"""

PRESETS = {"demo": DEMO}
