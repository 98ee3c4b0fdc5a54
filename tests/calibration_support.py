"""Profiles for tests: a synthetic one whose tables follow known formulas, a tiny grid for
timing the real code in seconds, and ``calibrate_tiny`` to time it."""

from __future__ import annotations

from pagesim.sim.cost.profile import TABLES, Profile, Table, grid_points

#: A grid small enough to calibrate ``tiny`` in a few seconds (two or three points per axis).
TINY_GRID = {
    "dense_layer": [[1, 64]], "model_outer": [[1, 64]], "lm_head": [[1, 8]], "cache_write": [[1, 64]],
    "decode_attention": [[8, 16], [1, 4], [1, 64]], "prefill_attention": [[1, 32], [0, 64]],
    "cow_copy": [[16], [1, 4]], "swap_out": [[16], [1, 4]], "swap_in": [[16], [1, 4]],
    "sampling": [[1, 8]], "batch_prep": [[1, 8]], "policy": [[1, 8]],
}

PAIR_S = 2e-9

FORMULAS = {
    "dense_layer": lambda t: 1e-4 + 1e-6 * t,
    "model_outer": lambda t: 5e-5 + 1e-7 * t,
    "lm_head": lambda r: 2e-5 + 4e-7 * r,
    "cache_write": lambda t: 1e-5 + 5e-8 * t,
    "decode_attention": lambda bs, n, c: 3e-5 + 1e-6 * n + 2e-9 * n * c,
    "prefill_attention": lambda q, c: 4e-5 + 1e-7 * q + PAIR_S * q * (c + (q + 1) / 2) + 1e-9 * (q + c),
    "cow_copy": lambda bs, b: 1e-5 + 1e-7 * b * bs,
    "swap_out": lambda bs, b: 2e-5 + 2e-7 * b * bs,
    "swap_in": lambda bs, b: 2e-5 + 3e-7 * b * bs,
    "sampling": lambda r: 1e-5 + 2e-6 * r,
    "batch_prep": lambda n: 3e-5 + 3e-6 * n,
    "policy": lambda n: 5e-5 + 5e-6 * n,
}

GRID = {
    "dense_layer": [[1, 16, 256, 2048]], "model_outer": [[1, 16, 256, 2048]], "lm_head": [[1, 16, 256]],
    "cache_write": [[1, 16, 256, 2048]],
    "decode_attention": [[8, 16, 32], [1, 4, 16, 256], [1, 16, 64, 512]],
    "prefill_attention": [[1, 16, 64, 512, 2048], [0, 16, 64, 512]],
    "cow_copy": [[8, 16, 32], [1, 4, 64]], "swap_out": [[8, 16, 32], [1, 4, 256]], "swap_in": [[8, 16, 32], [1, 4, 256]],
    "sampling": [[1, 16, 256]], "batch_prep": [[1, 16, 256]], "policy": [[1, 16, 256]],
}


def synthetic_profile() -> Profile:
    tables = {}
    for name, (axes, per, _) in TABLES.items():
        grid = tuple(tuple(float(x) for x in g) for g in GRID[name])
        med = tuple(FORMULAS[name](*p) for p in grid_points(grid))
        tables[name] = Table(name, axes, grid, med, (0.0,) * len(med), tuple((m, m, m) for m in med), per)
    model = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
             "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 512, "dtype": "float64"}
    return Profile({"type": "cpu", "name": "synthetic", "threads": 1}, {"torch": "n/a"}, model,
                   {"threads": 1, "backend": "torch", "warmup": 0, "repeats": 3}, tables)


synthetic_profile.formulas = {**FORMULAS, "pair_s": PAIR_S}


def calibrate_tiny(out, *, dtype=None, warmup: int = 1, repeats: int = 3) -> Profile:
    """``tiny`` calibrated on the CPU over ``TINY_GRID`` (torch kernels, one thread, float64 unless
    ``dtype``) into ``out``, the caller's torch thread count put back after."""
    import torch

    from pagesim.engine.calibrate.calibrate import calibrate
    from pagesim.engine.model.config import LlamaConfig

    threads = torch.get_num_threads()
    try:
        return calibrate(LlamaConfig.named("tiny"), out=out, device=torch.device("cpu"), dtype=dtype or torch.float64,
                         backend="torch", threads=1, warmup=warmup, repeats=repeats, grid=TINY_GRID)
    finally:
        torch.set_num_threads(threads)
