"""Study presets: specs that ship with pagesim, named instead of a TOML path.

``demo`` is the README's first command: a small study a laptop finishes in a couple of minutes,
on a workload embedded in pagesim (``shared-system-prompt``: requests sharing a few long system
prompts, so prefix caching, eviction and block size all matter) with a KV cache small enough
that requests get preempted, so swap and recompute differ. The base rate is near saturation (the
regime where a policy decides capacity), and the load grid covers one rate below and one past it.
"""

from __future__ import annotations

DEMO = """
name = "demo"
description = "Llama 3 8B on one A100 40 GB with a 2 GiB KV cache, serving requests that share a few long system prompts: which block size, eviction policy and preemption mode, and how paging compares with contiguous reservation. The base rate, 4 requests/s, is near saturation: the KV cache is full and about one request in three is preempted, but the queue stays short, so the policies' differences show; the load grid adds 2 requests/s (below saturation) and 6 (past it)."

[source]
workload = "shared-system-prompt"
rate = 4.0
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

KWON2023 = """
name = "kwon2023"
paper = "kwon2023"
description = "The PagedAttention paper's evaluation setup (Kwon et al., SOSP 2023, section 6): OPT-13B on one A100 40 GB with 12 GiB of KV cache, vLLM (pagesim's vllm-v0 preset) against the Orca baselines on ShareGPT- and Alpaca-like requests; memory (Fig. 2), batching (Fig. 13), sharing (Fig. 15), block size (Fig. 18b) and swap vs recompute (Fig. 19). Step times are the roofline plus the 2023 engine's per-step overhead derived in pagesim/sim/paper.py."

[source]
workload = "kwon2023-sharegpt"
rate = 2.0
num_requests = 1000
seed = 0

[base]
model = "opt-13b"
gpu = "a100-40gb"
policy = "vllm-v0"
kv_cache_gb = 12.0
max_model_len = 2048
max_num_batched_tokens = 2560
max_num_seqs = 256
engine_overhead_ms = "kwon2023"
sample_lengths = "same"

[[grid]]  # Fig. 2 and 13: ShareGPT at 2 req/s
allocator = ["max", "pow2", "oracle", "paged"]

[[grid]]  # Fig. 13: Alpaca at 30 req/s
allocator = ["max", "pow2", "oracle", "paged"]
workload = "kwon2023-alpaca"
rate = 30.0

[[grid]]  # Fig. 18b: block size, ShareGPT
block_size = [1, 2, 4, 8, 16, 32, 64, 128, 256]

[[grid]]  # Fig. 18b: block size, Alpaca
block_size = [1, 2, 4, 8, 16, 32, 64, 128, 256]
workload = "kwon2023-alpaca"
rate = 30.0

[[grid]]  # Fig. 19: swap vs recompute (ShareGPT at 3 req/s, so that requests are preempted)
preemption = ["swap", "recompute"]
block_size = [8, 16, 32, 64, 128, 256]
rate = 3.0

"""

# Fig. 15: parallel sampling and beam search on Alpaca at 20/k requests/s (no preemption). Beam search
# is not modelled by the v0 order: the same settings under the v1 order.
_BEAM_POLICY = 'policy = "pagesim"\nprefix_caching = false\nchunked_prefill = false\npreemption = "vllm-v0"\n'
for _field, _extra in (("n", 'sample_lengths = "drawn"\n'), ("beam_width", _BEAM_POLICY)):
    for _k in (2, 4, 6):
        KWON2023 += f'\n[[grid]]\nworkload = "kwon2023-alpaca"\n{_field} = {_k}\nrate = {20.0 / _k!r}\n{_extra}'

PRESETS["kwon2023"] = KWON2023
