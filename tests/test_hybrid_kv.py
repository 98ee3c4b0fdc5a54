"""The hybrid KV cache (vLLM v1's layer groups with sliding windows) on the policy alone.

Hand-built timelines pin vLLM's rules (which blocks leave the window and when, what a prefix hit
touches, admission with the sliding cap); hypothesis drives generated workloads through every
window layout and checks, after every step: the pool is whole (``Scheduler.check``), a sliding
group holds exactly the blocks its window still reaches (never more than ``ceil(window /
block_size) + 1`` while decoding, ``ceil((window - 1 + n) / block_size) + 1`` while computing ``n``
tokens), every block a query of the step can see is held, full groups drop nothing, and every
request finishes with the pool empty.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from pagesim.engine.policy import Request, Scheduler, make_config
from pagesim.engine.policy.memory.block_key import BlockKey
from pagesim.engine.policy.memory.hybrid_kv import GroupKey, HybridKVCacheManager, skipped_blocks
from tests.conftest import scaled_examples


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hybrid(windows=(8, None), **settings) -> Scheduler:
    settings.setdefault("num_gpu_blocks", 200)
    settings.setdefault("block_size", 4)
    settings.setdefault("max_model_len", 512)
    return Scheduler(make_config("vllm-v1", kv_group_windows=windows, **settings))


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def run(s: Scheduler, steps: int | None = None) -> list:
    outs = []
    while s.has_unfinished_requests and (steps is None or len(outs) < steps):
        out = s.schedule()
        s.check()
        s.update(out)
        outs.append(out)
    return outs


# ------------------------------------------------------------------------- the window
def test_decoding_drops_blocks_as_they_leave_the_window():
    # window 8, 4-token blocks, group 0 slides (as gpt-oss's layer 0 does), group 1 is full
    s = hybrid()
    s.add_request(Request("a", prompt_len=0, prompt_token_ids=ids(1, 10), max_tokens=12))
    seq = s.requests["a"].seqs[0]
    out = s.schedule()  # the prompt: 10 tokens in 3 blocks per group, nothing dropped yet
    assert isinstance(s.kv, HybridKVCacheManager)
    assert len(seq.block_table) == len(seq.extra_tables[0]) == 3 and None not in seq.block_table
    assert out.scheduled[0].extra_block_tables == (tuple(seq.extra_tables[0]),)
    s.update(out)
    dropped = []
    for _ in range(11):
        out = s.schedule()
        start = out.scheduled[0].num_computed_tokens
        # vLLM: before the step, blocks wholly before start - window + 1 are released
        assert seq.block_table.count(None) == ((start - 8 + 1) // 4 if start >= 8 else 0)
        assert None not in seq.extra_tables[0]  # the full group keeps everything
        held = sum(b is not None for b in seq.block_table)
        assert held <= cdiv(8, 4) + 1
        dropped.append(seq.block_table.count(None))
        s.check()
        s.update(out)
    assert dropped == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3]  # (computed - 7) // 4 for computed 10..20
    assert not s.has_unfinished_requests and s.pool.num_used_blocks == 0


def test_dropped_entries_reach_the_executor_as_the_null_block():
    s = hybrid()
    s.add_request(Request("a", prompt_len=0, prompt_token_ids=ids(1, 20), max_tokens=3))
    run(s, 1)
    out = s.schedule()  # a decode at position 20: blocks 0..2 (tokens 0..11) are out of the window
    table = out.scheduled[0].block_table
    assert table[:3] == (0, 0, 0) and 0 not in table[3:]
    record = out.to_record()
    assert record["block_ids"]["a"]["0"] == list(table)
    assert record["group_block_ids"]["a"]["0"] == [list(out.scheduled[0].extra_block_tables[0])]
    assert out.scheduled[0].slot_mapping(0) == [table[5] * 4 + 0]  # position 20 = block 5, offset 0


def test_released_window_blocks_free_tail_first_and_stay_cached():
    s = hybrid(enable_prefix_caching=True, prefix_cache_retention_interval=None)  # every block keyed
    s.add_request(Request("a", prompt_len=0, prompt_token_ids=ids(1, 16), max_tokens=8))
    out = s.schedule()
    first_blocks = list(out.scheduled[0].block_table[:2])  # full blocks 0, 1 of the sliding group
    s.update(out)
    cached_before = s.pool.num_cached_free_blocks
    out = s.schedule()  # computed 16: (16 - 8 + 1) // 4 = 2 blocks leave the window
    assert out.scheduled[0].block_table[:2] == (0, 0)
    assert s.pool.num_cached_free_blocks == cached_before + 2  # keyed: findable until evicted
    for b in first_blocks:
        assert s.pool.keys[b] is not None and s.pool.ref_counts[b] == 0


def test_all_sliding_model_is_one_group():
    # Mistral 7B v0.1: every layer slides, so there is one group and it is group 0
    s = hybrid(windows=(8,))
    s.add_request(Request("a", prompt_len=0, prompt_token_ids=ids(1, 30), max_tokens=4))
    run(s)
    assert s.pool.num_used_blocks == 0


# ------------------------------------------------------------------------ prefix hits
def test_a_hit_touches_only_the_blocks_the_window_still_needs():
    s = hybrid(enable_prefix_caching=True, prefix_cache_retention_interval=None)
    prompt = ids(1, 40)
    s.add_request(Request("a", prompt_len=0, prompt_token_ids=prompt, max_tokens=2))
    run(s)
    s.add_request(Request("b", prompt_len=0, prompt_token_ids=prompt + ids(500, 8), max_tokens=2))
    b = s.requests["b"].seqs[0]
    hit = s.kv.find_cached_prefix(b)
    # full group: a's 10 prompt blocks; sliding: blocks 8, 9 are a run of ceil(7 / 4) = 2
    assert len(hit) == 10
    out = s.schedule()
    assert out.new["b"] == 40
    assert b.block_table[:8] == [None] * 8  # (40 - 8 + 1) // 4 = 8 blocks skipped
    assert all(x is not None for x in b.block_table[8:])
    assert None not in b.extra_tables[0]


def test_a_sliding_hit_shortens_to_a_run_of_the_window():
    s = hybrid(enable_prefix_caching=True, eviction_policy="lru", prefix_cache_retention_interval=None)
    prompt = ids(1, 40)
    s.add_request(Request("a", prompt_len=0, prompt_token_ids=prompt, max_tokens=2))
    run(s)
    # Evict the sliding group's block 8 of a's prompt (what an eviction does to one chosen block):
    # the window's run must then end before it.
    probe = Request("p", prompt_len=0, prompt_token_ids=prompt + [999], max_tokens=1).seqs[0]
    sliding_block_8 = s.kv.find_cached_prefix(probe).tables[0][8]
    pool = s.pool
    pool.eviction.remove(sliding_block_8)
    key, pool.keys[sliding_block_8] = pool.keys[sliding_block_8], None
    pool.cache.remove(key, sliding_block_8)
    pool._free.appendleft(sliding_block_8)
    s.check()
    hit = s.kv.find_cached_prefix(Request("q", prompt_len=0, prompt_token_ids=prompt + [999], max_tokens=1).seqs[0])
    # from the right within 10 blocks: 9 hits, 8 misses, then 7, 6 make a run of 2: the hit is 8 blocks
    assert len(hit) == 8
    assert hit.tables[0][:6] == (None,) * 6 and None not in hit.tables[0][6:8]
    assert None not in hit.tables[1]


# ------------------------------------------------------- sparse retention (vLLM 0.33's default)
def sliding_keyed(s: Scheduler) -> list[int]:
    """Positions in request "a"'s sliding table (group 0) of the blocks that carry a key."""
    table = s.requests["a"].seqs[0].block_table
    return [i for i, b in enumerate(table) if b is not None and s.pool.keys[b] is not None]


def test_a_sliding_group_keys_only_the_tail_at_the_replay_boundary():
    # window 8 needs runs of ceil(7 / 4) = 2 blocks; a 40-token prompt resumes at 39: blocks 7, 8
    s = hybrid(enable_prefix_caching=True)
    assert s.config.prefix_cache_retention_interval == 0
    s.add_request(Request("a", prompt_len=0, prompt_token_ids=ids(1, 40), max_tokens=9))
    out = s.schedule()
    s.update(out)
    assert sliding_keyed(s) == [7, 8]
    full = s.requests["a"].seqs[0].extra_tables[0]
    assert all(s.pool.keys[b] is not None for b in full[:10])  # the full group keys every block
    # Blocks that leave the window unkeyed go to the front of the free list, walked last first
    # (vLLM's free_blocks: prepend_n), so they are reused at once: at computed 40, (40 - 7) // 4 = 8
    # blocks go (entry 7 keyed, to the eviction order; 6..0 to the front), then the decode's new
    # block of each group is taken: the sliding group's is entry 6's, the full group's entry 5's.
    seq = s.requests["a"].seqs[0]
    before = list(seq.block_table)
    s.schedule()
    assert seq.block_table[:8] == [None] * 8
    assert seq.block_table[10] == before[6] and seq.extra_tables[0][10] == before[5]
    assert s.pool.free_block_order()[:5] == [before[4], before[3], before[2], before[1], before[0]]


def test_a_shared_prefix_is_keyed_at_its_junction_for_the_next_request():
    """vLLM's Marconi-style junction: the second request sharing a prefix finds it in the full
    group only (its sliding groups never kept that prefix's tail), so it misses and keys the tail
    there; the third hits it."""
    results = {}
    for interval in (0, None):
        s = hybrid(enable_prefix_caching=True, num_gpu_blocks=300, prefix_cache_retention_interval=interval)
        prefix = ids(1, 32)
        hits = []
        for i, rid in enumerate("abc"):
            request = Request(rid, prompt_len=0, prompt_token_ids=prefix + ids(1000 * (i + 1), 10), max_tokens=3)
            s.add_request(request)
            out = s.schedule()
            hits.append((out.new[rid], request.shared_prefix_boundary))
            s.update(out)
            run(s)
        results[interval] = hits
    assert results[0] == [(0, 0), (0, 32), (32, 0)]
    assert results[None] == [(0, 0), (32, 0), (32, 0)]  # dense: every block is there already


def test_a_retention_interval_also_keys_each_segments_tail():
    s = hybrid(enable_prefix_caching=True, prefix_cache_retention_interval=16)  # segments of 4 blocks
    s.add_request(Request("a", prompt_len=0, prompt_token_ids=ids(1, 40), max_tokens=2))
    s.update(s.schedule())
    # each segment's last 2 blocks (2, 3 and 6, 7), and the replay boundary's 7, 8
    assert sliding_keyed(s) == [2, 3, 6, 7, 8]


def test_group_keys_differ_by_group_and_equal_by_content():
    a = BlockKey(None, (1, 2, 3, 4))
    b = BlockKey(None, (1, 2, 3, 4))
    assert GroupKey(a, 1) == GroupKey(b, 1) and hash(GroupKey(a, 1)) == hash(GroupKey(b, 1))
    assert GroupKey(a, 1) != GroupKey(a, 2) and GroupKey(a, 1) != a
    child = BlockKey(a, (5, 6, 7, 8))
    assert GroupKey(child, 1).parent == GroupKey(a, 1) and GroupKey(a, 1).parent is None


# ------------------------------------------------------------------------ admission
def test_admission_counts_a_sliding_group_at_its_cap():
    # budget 8: a sliding group needs at most cdiv(min(8 - 1 + 8, 512), 4) + 1 = 5 blocks
    s = hybrid(max_num_batched_tokens=8, num_gpu_blocks=1 + 16 + 5)
    s.add_request(Request("a", prompt_len=0, prompt_token_ids=ids(1, 60), max_tokens=4))  # 16 full blocks
    assert s.requests["a"].reject_reason is None
    run(s)
    assert s.num_finished_requests == 1 and s.pool.num_used_blocks == 0


def test_a_request_beyond_the_pool_in_every_group_is_rejected():
    s = hybrid(max_num_batched_tokens=8, num_gpu_blocks=1 + 16 + 4)
    request = Request("a", prompt_len=0, prompt_token_ids=ids(1, 60), max_tokens=4)
    assert not s.add_request(request)
    assert "over 2 layer groups" in request.reject_reason


@pytest.mark.parametrize(("settings", "message"), [
    (dict(step_order="vllm-v0", enable_prefix_caching=False, reserve_extent="whole", seq_limit_counts="sequences",
          watermark_only_when_running=False, on_swap_exhausted="raise"), "vllm-v0 step order"),
    (dict(preemption_mode="swap"), "recompute only"),
    (dict(reserve_null_block=False), "null block"),
])
def test_what_vllm_v1_hybrid_does_not_do_is_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        make_config("pagesim", kv_group_windows=(8, None), **settings)


# ------------------------------------------------------------- generated workloads
@st.composite
def workloads(draw):
    bs = draw(st.sampled_from([1, 2, 4, 8]))
    window = draw(st.sampled_from([1, 3, bs, bs + 1, 2 * bs, 13, 32]))
    layout = draw(st.sampled_from(["sliding-full", "full-sliding", "all-sliding", "gemma", "two-windows"]))
    windows = {"sliding-full": (window, None), "full-sliding": (None, window), "all-sliding": (window,),
               "gemma": (window, window, window, None), "two-windows": (window, None, window + 5)}[layout]
    shared = [ids(1000, draw(st.integers(0, 40))), ids(2000, draw(st.integers(0, 25)))]
    requests = []
    for i in range(draw(st.integers(1, 7))):
        prefix = draw(st.sampled_from(shared))
        prompt = prefix + ids(10_000 * (i + 1), draw(st.integers(1, 30)))
        n = draw(st.sampled_from([1, 1, 1, 2, 3]))
        beam = draw(st.sampled_from([1, 1, 1, 2])) if n == 1 else 1
        requests.append((Request(f"r{i}", prompt_len=0, prompt_token_ids=prompt, max_tokens=draw(st.integers(1, 30)),
                                 n=n, beam_width=beam), draw(st.integers(0, 5))))
    chunked = draw(st.booleans())
    budget = draw(st.sampled_from([4, 16, 64])) if chunked else 128
    settings_ = dict(block_size=bs, kv_group_windows=windows, enable_chunked_prefill=chunked,
                     max_num_batched_tokens=budget, max_model_len=128, max_num_seqs=draw(st.sampled_from([2, 8])),
                     enable_prefix_caching=draw(st.booleans()),
                     eviction_policy=draw(st.sampled_from(["lru", "fifo", "lfu", "radix-leaf"])),
                     victim_policy=draw(st.sampled_from(["running-tail", "latest-arrival", "fewest-blocks"])),
                     num_gpu_blocks=draw(st.sampled_from([24, 48, 400])), reserve_null_block=True,
                     prefix_cache_retention_interval=draw(st.sampled_from([0, None, 4 * bs])))
    return requests, settings_, draw(st.sampled_from(["vllm-v1", "pagesim"]))


def check_step(s: Scheduler, out) -> None:
    s.check()
    bs = s.block_size
    windows = s.config.kv_group_windows
    for sched in out.scheduled:
        seq = s.requests[sched.request_id].seqs[sched.seq_index]
        start, n = sched.num_computed_tokens, sched.num_new_tokens
        tables = [seq.block_table, *seq.extra_tables]
        assert len(tables) == len(windows)
        for window, table in zip(windows, tables):
            note(f"{sched.seq_id} start {start} n {n} window {window} table {table}")
            assert len(table) == cdiv(start + n, bs)
            dropped = table.count(None)
            if window is None:
                assert dropped == 0
                continue
            # exactly vLLM's rule, and every block a query of this step sees is held
            assert dropped == min(skipped_blocks(window, start, bs), len(table))
            first_seen = max(0, start - window + 1)
            assert all(b is not None for b in table[first_seen // bs:])
            held = len(table) - dropped
            assert held <= cdiv(window - 1 + n, bs) + 1
            if n == 1:
                assert held <= cdiv(window, bs) + 1


@settings(max_examples=scaled_examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_generated_workloads_keep_the_window_and_the_pool_whole(case):
    requests, settings_, policy = case
    s = Scheduler(make_config(policy, **settings_))
    pending = sorted(requests, key=lambda r: r[1])
    step = 0
    while pending or s.has_unfinished_requests:
        while pending and pending[0][1] <= step:
            s.add_request(pending.pop(0)[0])
        out = s.schedule()
        check_step(s, out)
        s.update(out)
        step += 1
        assert step < 5000, "no progress"
    s.check()
    assert s.pool.num_used_blocks == 0
    assert s.num_finished_requests + s.num_rejected_requests == len(requests)


def test_generated_cases_reach_every_mechanism():
    """The strategy is not vacuous: across draws, windows drop blocks, recompute preemptions,
    copy-on-write copies and prefix hits in a sliding group all happen."""
    from hypothesis import find

    seen = set()

    def exercised(case) -> bool:
        requests, settings_, policy = case
        s = Scheduler(make_config(policy, **settings_))
        for request, _ in requests:
            s.add_request(request)
        while s.has_unfinished_requests:
            out = s.schedule()
            if out.preempted:
                seen.add("preempt")
            if out.blocks_to_copy:
                seen.add("cow")
            if any(0 in t for sched in out.scheduled for t in (sched.block_table, *sched.extra_block_tables)):
                seen.add("drop")
            if any(out.new.values()) and any(w is not None for w in s.config.kv_group_windows):
                seen.add("hit")
            s.update(out)
        return seen >= {"preempt", "cow", "drop", "hit"}

    find(workloads(), exercised, settings=settings(max_examples=400, deadline=None, database=None, derandomize=True))
    assert seen == {"preempt", "cow", "drop", "hit"}
