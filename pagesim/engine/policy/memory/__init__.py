"""The KV memory: the block pool (allocation, reference counts, forks, cached-but-free blocks), block
keys, the prefix cache and its eviction orders, the KV-cache managers (one group, and vLLM's hybrid
manager for sliding windows), the swap pool, and the usage figures. It knows blocks and tables, not
steps: the scheduler (``policy.scheduling``) decides what to allocate, free and evict."""
