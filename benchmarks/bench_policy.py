"""Speed of pagesim's serving policy (pure Python), each figure beside a simple baseline timed in the same run.

What is measured
----------------
1. ``BlockPool`` allocate + free pairs per second:

   - *single*: ``free(allocate())`` repeated, against a baseline doing the same with a plain list
     used as a stack (``pop()`` / ``append()``) plus a reference-count list, written inline;
   - *table of 16*: ``allocate_many(16)`` then ``free_table(...)`` (a request's block table),
     against the same list stack filling and releasing a 16-entry list;
   - *evicting*: every free block is a cached one (carries a prefix-cache key), so each
     allocation evicts through the eviction policy (``lru``, ``fifo``, ``lfu``, ``radix-leaf``).
     One pair is ``allocate()`` (an eviction) + ``cache_block()`` (a fresh key, so the block is
     cached again) + ``free()``; the table variant does the same with a 16-block chain of keys.
     Shown against the plain single pair, so the ratio is the cost of going through the cache.
     Keys are laid out so that every policy picks the oldest block (chain) here: this measures
     each policy's bookkeeping, not the quality of its choice.

   The target is at least 1M pairs/s for the plain single pair.

2. ``Scheduler`` time per decode step with 256 running sequences (``make_config("pagesim")``,
   block size 16, 512-token prompts sharing a 256-token system prompt, outputs long enough that
   nothing finishes, a pool large enough that nothing is preempted, ``max_num_seqs=256``). After
   the batch is filled (every sequence decoding), ``out = s.schedule(); s.update(out)`` is timed
   for prefix caching on / off x 10 / 10,000 requests waiting behind the full batch x decision log
   on / off. The baseline is a naive loop doing the least bookkeeping a step needs for 256
   sequences: visit each object, take a block from a list every 16 tokens, bump a counter, append
   a tuple to the step's batch and the batch to a log. (A step also copies every running
   sequence's block table into its output, so step time grows slowly with context length; the
   sequences here hold ~513-800 tokens.)

3. The ``vllm-v0`` step order's decode step against ``vllm-v1``'s on that batch (prefix caching
   and the decision log off, 10 waiting): v0 counts touched blocks per sequence and keeps its
   keyed budget, so some extra cost per step is expected; the ratio says how much.

How to read it
--------------
Shared machines are noisy, so nothing here asserts a time. Each figure is the *best* of several
short repeats (other processes only ever make a repeat slower, so the best is the steadiest
figure; ``--json`` also holds the median and every sample), and a subject and its baseline
alternate within each repeat (the nine step-time subjects are all built first, then timed
round-robin), so a slow spell hits both. Ratios are taken between best figures. Compare *ratios*
across machines, not absolute numbers; a ratio off by 10-20% in one run is noise, one that stays
off across runs is not:

- ``pool / list``: how much slower ``BlockPool`` is than the bare list stack (method calls, the
  deque, release ticks, the eviction check);
- ``10000 / 10 waiting``: should be ~1.0: a step's work must not grow with the waiting queue
  (shown for wall time and, as a cross-check less exposed to other processes, this process's CPU
  time over the same windows);
- ``log on / off``: what the per-step decision-log record costs (best and median: the log keeps
  every record, and the collections that brings on show in the median more than in the best);
- ``sched / naive``: the scheduler's overhead factor over the least work a step needs.

Python's garbage collector stays on (it is part of the real cost), but a best-of figure tends to
leave out the rare full collections. All eight scheduler configurations live in one heap while
they are timed, so a collection triggered by one is paid by whichever is running; this is
symmetric across configurations (and means the 10,000 waiting requests' objects weigh on every
configuration's full collections alike).

Usage: ``python benchmarks/bench_policy.py [--quick] [--json PATH]``. ``--quick`` (CI) runs in well
under a minute on two cores; the default takes longer for steadier numbers.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from time import perf_counter, process_time

try:
    import pagesim.engine.policy  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagesim.engine.policy import EVICTION_POLICIES, BlockPool, Request, Scheduler, make_config
from pagesim.engine.policy.memory.block_key import BlockKey, chain_keys

TARGET_PAIRS_PER_S = 1_000_000
TABLE_BLOCKS = 16  # blocks per table in the batched variants (256 tokens at block size 16)

MODES = {
    # Short repeats, many of them: on a busy machine a short window has a fair chance of running
    # undisturbed, and the best of many such windows is what the tables print.
    "quick": dict(
        pairs=100_000,  # single pairs per repeat (the table variant: as many blocks)
        pool_repeats=10,
        evict_pairs=25_000,
        evict_repeats=5,
        step_rounds=30,  # round-robin passes over the nine step-time subjects
        steps_per_round=2,
    ),
    "default": dict(
        pairs=200_000,
        pool_repeats=25,
        evict_pairs=50_000,
        evict_repeats=12,
        step_rounds=100,
        steps_per_round=2,
    ),
}

POOL_BLOCKS = 8192  # pool size for the plain pair benchmarks
EVICT_POOL_BLOCKS = 4096  # cached blocks in the eviction benchmarks

NUM_SEQS = 256
BLOCK_SIZE = 16
PROMPT_LEN = 512
SHARED_PREFIX = 256  # tokens of system prompt every running request shares
WAITING = (10, 10_000)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def summarize(samples: list[float], *, higher_is_better: bool) -> dict:
    """Best and median of repeats. Interference from other processes only ever makes a repeat
    slower, so the best is the steadier figure and the one printed."""
    best = max(samples) if higher_is_better else min(samples)
    return {"best": best, "median": statistics.median(samples), "samples": samples}


# ============================================================== 1. block pool
def time_pool_pairs(n: int) -> float:
    pool = BlockPool(POOL_BLOCKS)
    allocate, free = pool.allocate, pool.free
    t0 = perf_counter()
    for _ in range(n):
        free(allocate())
    dt = perf_counter() - t0
    assert pool.num_free_blocks == pool.num_usable_blocks
    return dt


def time_list_pairs(n: int) -> float:
    free_list = list(range(POOL_BLOCKS - 1, -1, -1))
    ref_counts = [0] * POOL_BLOCKS
    pop, push = free_list.pop, free_list.append
    t0 = perf_counter()
    for _ in range(n):
        b = pop()
        ref_counts[b] = 1
        count = ref_counts[b] - 1
        ref_counts[b] = count
        if count == 0:
            push(b)
    dt = perf_counter() - t0
    assert len(free_list) == POOL_BLOCKS
    return dt


def time_pool_tables(n_tables: int, k: int) -> float:
    pool = BlockPool(POOL_BLOCKS)
    allocate_many, free_table = pool.allocate_many, pool.free_table
    t0 = perf_counter()
    for _ in range(n_tables):
        free_table(allocate_many(k))
    dt = perf_counter() - t0
    assert pool.num_free_blocks == pool.num_usable_blocks
    return dt


def time_list_tables(n_tables: int, k: int) -> float:
    free_list = list(range(POOL_BLOCKS - 1, -1, -1))
    ref_counts = [0] * POOL_BLOCKS
    pop, push = free_list.pop, free_list.append
    t0 = perf_counter()
    for _ in range(n_tables):
        table = []
        for _ in range(k):
            b = pop()
            ref_counts[b] = 1
            table.append(b)
        for b in reversed(table):
            count = ref_counts[b] - 1
            ref_counts[b] = count
            if count == 0:
                push(b)
    dt = perf_counter() - t0
    assert len(free_list) == POOL_BLOCKS
    return dt


def _all_cached_pool(policy: str) -> BlockPool:
    return BlockPool(EVICT_POOL_BLOCKS, eviction_policy=policy)


def time_evicting_pairs(policy: str, n: int) -> float:
    """Every free block is cached: each allocate() evicts. Keys rotate through 2x the pool, so a
    key is always re-registered after it was evicted (every policy here evicts the oldest)."""
    m = EVICT_POOL_BLOCKS
    pool = _all_cached_pool(policy)
    keys = [BlockKey(None, ("bench", i)) for i in range(2 * m)]
    blocks = [pool.allocate() for _ in range(m)]
    for i, b in enumerate(blocks):
        pool.cache_block(b, keys[i])
    for b in blocks:  # oldest release = keys[0]
        pool.free(b)
    assert pool.num_cached_free_blocks == pool.num_free_blocks == m
    allocate, cache_block, free = pool.allocate, pool.cache_block, pool.free
    evictions0 = pool.num_evictions
    j, wrap = m, 2 * m
    t0 = perf_counter()
    for _ in range(n):
        b = allocate()
        cache_block(b, keys[j])
        free(b)
        j += 1
        if j == wrap:
            j = 0
    dt = perf_counter() - t0
    assert pool.num_evictions - evictions0 == n, "an allocation did not evict"
    assert pool.num_cached_free_blocks == m
    return dt


def time_evicting_tables(policy: str, n_tables: int, k: int) -> float:
    """Tables of k blocks with chained keys (a request's prompt), all free blocks cached: each
    allocate_many(k) evicts the oldest whole chain."""
    m = EVICT_POOL_BLOCKS
    num_chains = m // k
    pool = _all_cached_pool(policy)
    chains = [chain_keys([("bench", c, i) for i in range(k)]) for c in range(2 * num_chains)]
    for c in range(num_chains):
        table = pool.allocate_many(k)
        for b, key in zip(table, chains[c]):
            pool.cache_block(b, key)
        pool.free_table(table)
    assert pool.num_cached_free_blocks == num_chains * k
    # Any leftover (m not a multiple of k) stays plain free and is taken first; keep it out.
    spare = pool.allocate_many(pool.num_free_blocks - pool.num_cached_free_blocks)
    allocate_many, cache_block, free_table = pool.allocate_many, pool.cache_block, pool.free_table
    evictions0 = pool.num_evictions
    j, wrap = num_chains, 2 * num_chains
    t0 = perf_counter()
    for _ in range(n_tables):
        table = allocate_many(k)
        for b, key in zip(table, chains[j]):
            cache_block(b, key)
        free_table(table)
        j += 1
        if j == wrap:
            j = 0
    dt = perf_counter() - t0
    assert pool.num_evictions - evictions0 == n_tables * k, "an allocation did not evict"
    pool.free_table(spare)
    return dt


def bench_block_pool(cfg: dict) -> dict:
    n = cfg["pairs"]
    k = TABLE_BLOCKS
    n_tables = n // k
    results: dict = {}

    def paired(subject: Callable[[], float], baseline: Callable[[], float], pairs: int, repeats: int) -> dict:
        subject(), baseline()  # warm up
        s_rates, b_rates = [], []
        for r in range(repeats):  # alternate which goes first
            order = [(subject, s_rates), (baseline, b_rates)]
            for fn, rates in order if r % 2 == 0 else reversed(order):
                gc.collect()
                rates.append(pairs / fn())
        s, b = summarize(s_rates, higher_is_better=True), summarize(b_rates, higher_is_better=True)
        return {"pool_pairs_per_s": s, "list_pairs_per_s": b, "ratio_pool_over_list": s["best"] / b["best"]}

    results["single"] = paired(lambda: time_pool_pairs(n), lambda: time_list_pairs(n), n, cfg["pool_repeats"])
    results["table"] = paired(
        lambda: time_pool_tables(n_tables, k), lambda: time_list_tables(n_tables, k), n_tables * k, cfg["pool_repeats"]
    )

    ne = cfg["evict_pairs"]
    ne_tables = ne // k
    policies = list(EVICTION_POLICIES)
    single: dict[str, list[float]] = {p: [] for p in policies}
    table: dict[str, list[float]] = {p: [] for p in policies}
    for policy in policies:  # warm up
        time_evicting_pairs(policy, ne // 10), time_evicting_tables(policy, ne_tables // 10 + 1, k)
    for r in range(cfg["evict_repeats"]):  # round-robin over the policies, so drift hits all alike
        shift = r % len(policies)
        for policy in policies[shift:] + policies[:shift]:
            gc.collect()
            single[policy].append(ne / time_evicting_pairs(policy, ne))
            gc.collect()
            table[policy].append(ne_tables * k / time_evicting_tables(policy, ne_tables, k))
    results["evicting"] = {
        policy: {
            "single_pairs_per_s": summarize(single[policy], higher_is_better=True),
            "table_pairs_per_s": summarize(table[policy], higher_is_better=True),
        }
        for policy in policies
    }
    results["settings"] = {
        "pairs_per_repeat": n,
        "repeats": cfg["pool_repeats"],
        "evicting_pairs_per_repeat": ne,
        "evicting_repeats": cfg["evict_repeats"],
        "pool_blocks": POOL_BLOCKS,
        "evicting_cached_blocks": EVICT_POOL_BLOCKS,
        "table_blocks": k,
    }
    return results


def print_block_pool(res: dict) -> None:
    print("\n1. BlockPool allocate + free pairs per second (best of repeats; higher is better)")
    st = res["settings"]
    print(
        f"   {st['pairs_per_repeat']:,} pairs x {st['repeats']} repeats, pool of {st['pool_blocks']:,} blocks; "
        f"target: >= {TARGET_PAIRS_PER_S / 1e6:.1f}M pairs/s for the plain single pair\n"
    )
    print(f"   {'variant':<28}{'BlockPool':>14}{'list stack':>14}{'pool/list':>11}{'target':>9}")
    for name, label in (("single", "single: free(allocate())"), ("table", f"table of {TABLE_BLOCKS}: many+free_table")):
        r = res[name]
        pool, base = r["pool_pairs_per_s"]["best"], r["list_pairs_per_s"]["best"]
        ok = "met" if pool >= TARGET_PAIRS_PER_S else "MISSED"
        print(f"   {label:<28}{pool / 1e6:>13.2f}M{base / 1e6:>13.2f}M{r['ratio_pool_over_list']:>11.2f}{ok:>9}")
    plain = res["single"]["pool_pairs_per_s"]["best"]
    print(
        f"\n   every free block cached ({st['evicting_cached_blocks']:,}), so each allocation evicts; "
        f"pair = allocate + cache_block + free; {st['evicting_pairs_per_repeat']:,} pairs x "
        f"{st['evicting_repeats']} repeats"
    )
    print(f"   {'eviction policy':<28}{'single':>14}{'vs plain':>11}{f'table of {TABLE_BLOCKS}':>14}{'vs plain':>11}")
    for policy, r in res["evicting"].items():
        single, table = r["single_pairs_per_s"]["best"], r["table_pairs_per_s"]["best"]
        print(
            f"   {policy:<28}{single / 1e6:>13.2f}M{single / plain:>11.2f}"
            f"{table / 1e6:>13.2f}M{table / plain:>11.2f}"
        )


# ============================================================== 2. scheduler
def build_scheduler(
    *, caching: bool, waiting: int, record: bool, max_tokens: int, preset: str = "pagesim"
) -> tuple[Scheduler, int]:
    """A scheduler with NUM_SEQS decoding sequences and ``waiting`` requests queued behind them."""
    blocks_per_request = cdiv(PROMPT_LEN + max_tokens, BLOCK_SIZE)
    num_gpu_blocks = int(NUM_SEQS * blocks_per_request * 1.05) + 64  # + the 1% watermark, slack
    config = make_config(
        preset,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=num_gpu_blocks,
        max_num_seqs=NUM_SEQS,
        max_num_batched_tokens=NUM_SEQS * PROMPT_LEN + 1024,
        max_model_len=PROMPT_LEN + max_tokens + BLOCK_SIZE,
        enable_prefix_caching=caching,
        record_decisions=record,
    )
    s = Scheduler(config)
    system_prompt = list(range(SHARED_PREFIX))
    for i in range(NUM_SEQS):
        base = 1_000_000 + i * PROMPT_LEN
        tokens = system_prompt + list(range(base, base + PROMPT_LEN - SHARED_PREFIX))
        if not s.add_request(Request(f"run{i}", prompt_len=PROMPT_LEN, prompt_token_ids=tokens, max_tokens=max_tokens)):
            raise RuntimeError("benchmark setup: a running request was rejected")
    for i in range(waiting):  # prompts without token ids: contents unique to each request
        if not s.add_request(Request(f"wait{i}", prompt_len=PROMPT_LEN, max_tokens=max_tokens)):
            raise RuntimeError("benchmark setup: a waiting request was rejected")
    fill_steps = 0
    while not (
        len(s.running) == NUM_SEQS and all(not q.is_prefilling for r in s.running for q in r.seqs)
    ):
        s.update(s.schedule())
        fill_steps += 1
        if fill_steps > 100:
            raise RuntimeError("benchmark setup: the batch did not fill with decoding sequences")
    return s, fill_steps


def check_steady(s: Scheduler, waiting: int) -> None:
    """The timed steps were what they claim: NUM_SEQS decodes, nothing preempted, finished or admitted."""
    out = s.schedule()
    s.update(out)
    problems = []
    if s.num_preemptions:
        problems.append(f"{s.num_preemptions} preemptions")
    if s.num_finished_requests:
        problems.append(f"{s.num_finished_requests} finished")
    if len(s.running) != NUM_SEQS or len(s.waiting) != waiting:
        problems.append(f"{len(s.running)} running / {len(s.waiting)} waiting")
    if len(out.scheduled) != NUM_SEQS or out.total_num_scheduled_tokens != NUM_SEQS:
        problems.append(f"last step scheduled {len(out.scheduled)} seqs / {out.total_num_scheduled_tokens} tokens")
    if problems:
        raise RuntimeError("benchmark setup is not the steady decode state: " + ", ".join(problems))


def time_steps(s: Scheduler, n: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) for ``n`` decode steps."""
    schedule, update = s.schedule, s.update
    c0, t0 = process_time(), perf_counter()
    for _ in range(n):
        update(schedule())
    return perf_counter() - t0, process_time() - c0


class NaiveSeq:
    __slots__ = ("seq_id", "num_tokens", "blocks")

    def __init__(self, seq_id: str, num_tokens: int):
        self.seq_id = seq_id
        self.num_tokens = num_tokens
        self.blocks: list[int] = []


class NaiveLoop:
    """The least bookkeeping a decode step needs: one token per sequence, a block every 16 tokens."""

    def __init__(self, num_blocks: int):
        self.free = list(range(num_blocks - 1, -1, -1))
        self.seqs = [NaiveSeq(f"run{i}#0", PROMPT_LEN + 1) for i in range(NUM_SEQS)]
        for q in self.seqs:
            q.blocks = [self.free.pop() for _ in range(cdiv(q.num_tokens, BLOCK_SIZE))]
        self.log: list[list[tuple[str, int]]] = []
        self.steps = 0

    def step(self) -> None:
        pop = self.free.pop
        batch = []
        for q in self.seqs:
            n = q.num_tokens
            if n % BLOCK_SIZE == 0:
                q.blocks.append(pop())
            q.num_tokens = n + 1
            batch.append((q.seq_id, n))
        self.log.append(batch)
        self.steps += 1


def time_naive(loop: NaiveLoop, n: int) -> tuple[float, float]:
    step = loop.step
    c0, t0 = process_time(), perf_counter()
    for _ in range(n):
        step()
    return perf_counter() - t0, process_time() - c0


def _label(caching: bool, waiting: int, record: bool) -> str:
    return f"caching_{'on' if caching else 'off'}_waiting_{waiting}_log_{'on' if record else 'off'}"


def bench_scheduler(cfg: dict) -> dict:
    rounds, per_round = cfg["step_rounds"], cfg["steps_per_round"]
    warm = max(2, per_round)
    max_tokens = warm + rounds * per_round + 64  # nothing finishes while timed
    configs = [
        (caching, waiting, record) for caching in (True, False) for waiting in WAITING for record in (True, False)
    ]
    schedulers: dict = {}
    fill: dict = {}
    t_build = perf_counter()
    for c in configs:
        caching, waiting, record = c
        schedulers[c], fill[c] = build_scheduler(caching=caching, waiting=waiting, record=record, max_tokens=max_tokens)
    t_build = perf_counter() - t_build
    naive = NaiveLoop(NUM_SEQS * cdiv(PROMPT_LEN + max_tokens, BLOCK_SIZE) + NUM_SEQS)
    subjects: list[tuple[object, Callable[[int], tuple[float, float]]]] = [
        (c, (lambda n, s=schedulers[c]: time_steps(s, n))) for c in configs
    ]
    subjects.append(("naive", lambda n: time_naive(naive, n)))
    for _, fn in subjects:
        fn(warm)
    wall: dict = {key: [] for key, _ in subjects}
    cpu: dict = {key: [] for key, _ in subjects}
    for r in range(rounds):  # round-robin, starting point rotating, so drift hits all alike
        shift = r % len(subjects)
        for key, fn in subjects[shift:] + subjects[:shift]:
            w, c = fn(per_round)
            wall[key].append(w / per_round * 1e6)
            cpu[key].append(c / per_round * 1e6)
    for c in configs:
        check_steady(schedulers[c], c[1])
    tokens_at_end = schedulers[configs[0]].running[0].seqs[0].num_tokens

    us = {key: summarize(v, higher_is_better=False) for key, v in wall.items()}
    cpu_us = {key: summarize(v, higher_is_better=False) for key, v in cpu.items()}
    w0, w1 = WAITING
    rows = []
    for caching in (True, False):
        for record in (True, False):
            lo, hi = (caching, w0, record), (caching, w1, record)
            rows.append(
                {
                    "prefix_caching": caching,
                    "record_decisions": record,
                    f"us_per_step_waiting_{w0}": us[lo],
                    f"us_per_step_waiting_{w1}": us[hi],
                    f"cpu_us_per_step_waiting_{w0}": cpu_us[lo],
                    f"cpu_us_per_step_waiting_{w1}": cpu_us[hi],
                    "ratio_waiting": us[hi]["best"] / us[lo]["best"],
                    "ratio_waiting_cpu": cpu_us[hi]["best"] / cpu_us[lo]["best"],
                    f"ratio_over_naive_waiting_{w0}": us[lo]["best"] / us["naive"]["best"],
                    f"ratio_over_naive_waiting_{w1}": us[hi]["best"] / us["naive"]["best"],
                }
            )
    log_cost = {
        f"caching_{'on' if caching else 'off'}_waiting_{waiting}": {
            "best": us[(caching, waiting, True)]["best"] / us[(caching, waiting, False)]["best"],
            "median": us[(caching, waiting, True)]["median"] / us[(caching, waiting, False)]["median"],
            "cpu_best": cpu_us[(caching, waiting, True)]["best"] / cpu_us[(caching, waiting, False)]["best"],
        }
        for caching in (True, False)
        for waiting in WAITING
    }
    return {
        "num_running_seqs": NUM_SEQS,
        "block_size": BLOCK_SIZE,
        "prompt_len": PROMPT_LEN,
        "tokens_per_seq_at_end": tokens_at_end,
        "step_rounds": rounds,
        "steps_per_round": per_round,
        "fill_steps": fill[configs[0]],
        "build_s": t_build,
        "naive_us_per_step": us["naive"],
        "naive_cpu_us_per_step": cpu_us["naive"],
        "rows": rows,
        "ratio_log_on_over_off": log_cost,
        "decision_log_records": {_label(*c): len(schedulers[c].decision_log) for c in configs},
    }


def bench_step_orders(cfg: dict) -> dict:
    """The ``vllm-v0`` step order against ``vllm-v1``'s on the same steady decode batch (prefix
    caching off, which v0 needs; decision log off; 10 waiting), alternating within each round."""
    rounds, per_round = cfg["step_rounds"], cfg["steps_per_round"]
    max_tokens = max(2, per_round) + rounds * per_round + 64
    schedulers = {
        preset: build_scheduler(caching=False, waiting=WAITING[0], record=False, max_tokens=max_tokens, preset=preset)[0]
        for preset in ("vllm-v1", "vllm-v0")
    }
    for s in schedulers.values():
        time_steps(s, max(2, per_round))
    wall: dict = {preset: [] for preset in schedulers}
    for r in range(rounds):
        order = list(schedulers) if r % 2 == 0 else list(reversed(schedulers))
        for preset in order:
            w, _ = time_steps(schedulers[preset], per_round)
            wall[preset].append(w / per_round * 1e6)
    for s in schedulers.values():
        check_steady(s, WAITING[0])
    us = {preset: summarize(v, higher_is_better=False) for preset, v in wall.items()}
    return {"us_per_step": us, "ratio_v0_over_v1": us["vllm-v0"]["best"] / us["vllm-v1"]["best"]}


def print_step_orders(res: dict) -> None:
    us = res["us_per_step"]
    print(f"\n3. Step orders, the same {NUM_SEQS} decoding sequences (prefix caching and decision log off)")
    print(
        f"   vllm-v1 {us['vllm-v1']['best']:8.0f} us   vllm-v0 {us['vllm-v0']['best']:8.0f} us   "
        f"v0 / v1 {res['ratio_v0_over_v1']:.2f}"
    )


def print_scheduler(res: dict) -> None:
    w0, w1 = WAITING
    n = res["num_running_seqs"]
    print(
        f"\n2. Scheduler time per decode step, {n} running sequences (block {res['block_size']}, "
        f"{res['prompt_len']}-token prompts, ~{res['tokens_per_seq_at_end']} tokens each at the end)"
    )
    print(
        f"   best of {res['step_rounds']} repeats of {res['steps_per_round']} steps per configuration, "
        f"round-robin; lower is better; filled in {res['fill_steps']} step(s), 8 schedulers built in "
        f"{res['build_s']:.1f} s"
    )
    print("   ratio columns: wall time (perf_counter) and, after the slash, this process's CPU time\n")
    ratio_hdr = f"{w1:,}/{w0} waiting"
    print(
        f"   {'caching':<9}{'decision log':<14}{f'{w0} waiting':>12}{f'{w1:,} waiting':>16}"
        f"{ratio_hdr:>20}{'sched/naive':>13}{'us/seq':>9}"
    )
    for row in res["rows"]:
        lo = row[f"us_per_step_waiting_{w0}"]["best"]
        hi = row[f"us_per_step_waiting_{w1}"]["best"]
        ratio = f"{row['ratio_waiting']:.2f} / {row['ratio_waiting_cpu']:.2f}"
        print(
            f"   {'on' if row['prefix_caching'] else 'off':<9}{'on' if row['record_decisions'] else 'off':<14}"
            f"{lo:>9.0f} us{hi:>13.0f} us{ratio:>20}"
            f"{row[f'ratio_over_naive_waiting_{w0}']:>12.1f}x{lo / n:>9.1f}"
        )
    naive = res["naive_us_per_step"]["best"]
    print(f"   {'naive loop (baseline)':<23}{naive:>9.0f} us{'':>49}{naive / n:>9.2f}")
    print(f"   (sched/naive and us/seq: {w0} waiting; {ratio_hdr} should be ~1.0: a step's work must")
    print("    not grow with the waiting queue)")
    print("\n   decision log cost, record_decisions on / off (best / median; the median also carries the")
    print("   garbage collections the growing log brings on, which short best-of windows tend to miss):")
    for name, ratio in res["ratio_log_on_over_off"].items():
        print(f"     {name.replace('_', ' '):<28}{ratio['best']:>6.2f} / {ratio['median']:.2f}")


# ============================================================== main
def _load_avg() -> float | None:
    """1-minute load average (other processes competing for the CPUs), where the OS reports one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _fmt_load(load: float | None) -> str:
    return "n/a" if load is None else f"{load:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small counts (CI); well under a minute")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "default"
    cfg = MODES[mode]

    meta = {
        "mode": mode,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "cpu_count": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_avg_1m_at_start": _load_avg(),
        "settings": cfg,
    }
    print(f"pagesim policy benchmark ({mode} mode)")
    print(
        f"Python {meta['python']} ({meta['implementation']}) on {meta['platform']}, {meta['machine']}, "
        f"{meta['cpu_count']} CPUs, load average {_fmt_load(meta['load_avg_1m_at_start'])} at start"
    )
    print("figures: best of repeats (medians in --json); baselines timed in the same run; compare ratios")

    t0 = perf_counter()
    pool_res = bench_block_pool(cfg)
    print_block_pool(pool_res)
    sched_res = bench_scheduler(cfg)
    print_scheduler(sched_res)
    orders_res = bench_step_orders(cfg)
    print_step_orders(orders_res)
    meta["elapsed_s"] = perf_counter() - t0
    meta["load_avg_1m_at_end"] = _load_avg()
    print(f"\ntotal {meta['elapsed_s']:.1f} s; load average {_fmt_load(meta['load_avg_1m_at_end'])} at end")

    if args.json:
        def keyed(obj):
            return {str(k): keyed(v) for k, v in obj.items()} if isinstance(obj, dict) else obj

        Path(args.json).write_text(
            json.dumps(keyed({"meta": meta, "block_pool": pool_res, "scheduler": sched_res, "step_orders": orders_res}), indent=2) + "\n",
            encoding="utf-8",
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
