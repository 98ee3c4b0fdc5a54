"""The pre-PagedAttention baselines: contiguous KV reservations (the paper's Orca Max, Pow2 and
Oracle), their buddy or first-fit placement, and a scheduler with the paged one's interface."""
