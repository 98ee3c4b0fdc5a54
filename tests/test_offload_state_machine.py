"""The scheduler with both KV tiers (GPU prefix cache + offload store) on a simulated content model.

Random workloads (prompts drawn from a few shared prefixes, parallel samples and beams now and
then, arrivals spread over the first steps) run through ``Scheduler.schedule()`` / ``update()``
with a small GPU pool, an offload store from one block to roomy, every offload policy, recompute
and swap preemption, chunked prefill on and off, both ``offload_prompt_only`` settings and both
connectors (vLLM 0.33's and 0.15's).

A *two-tier shadow* executes every ``SchedulerOutput`` in the documented order (swap out, swap
in, offload loads, copy-on-write, the forward pass, offload stores) on contents: every slot of a
GPU block, swap block or offload block holds a fingerprint of the token prefix whose KV it would
hold (the KV of position ``p`` depends on every token through ``p``), written when a scheduled
sequence computes ``p``, copied by swaps, copy-on-write, loads and stores. Then:

- every scheduled sequence reads its whole context back through its block table (a load of the
  wrong slot, a load that never came, a store of the wrong block, all read wrong KV);
- a stored block holds exactly the content its key names (the HBM block it came from, whole);
- a loaded block brings exactly the content of the key its slot holds, which is the key of the
  block it fills in the loading sequence's table; an asynchronous load's request is parked (never
  scheduled) and its blocks join the GPU cache only when the load is done, a synchronous one's at once.

And after every ``schedule()``: the policy's invariants (``Scheduler.check``, ``store.check``),
every load names a pinned slot whose key is the key of the GPU block it fills, which is in use
(never free), every store names a slot being stored under the GPU block's key, the free offload
count is reported right, the offload hits are the loads of first admissions or resumes, and
every block whose last token the step computes (a prompt block, unless ``offload_prompt_only`` is
off) was offered: its key is in the store, unless the store refused an offer or evicted in that
step. At the end: everything finished or was rejected, both tiers whole, no copy left in flight.
An executor whose loads or stores copy nothing fails these checks (the comparison has teeth).

With ``num_offload_blocks=0`` the decision log is byte-identical to a configuration that never
mentions offloading, and its records carry no offload field.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest
from hypothesis import Phase, event, find, given, note, settings
from hypothesis import strategies as st

from pagesim.engine.policy import Request, RequestStatus, Scheduler, SchedulerOutput, make_config
from pagesim.engine.policy.memory.eviction import EVICTION_POLICIES
from pagesim.engine.policy.offload import OFFLOAD_POLICIES
from pagesim.engine.policy.offload.store import READY, STORING
from pagesim.engine.policy.scheduling.output import dump_record
from tests.conftest import scaled_examples

OFFLOAD_FIELDS = {"blocks_to_load", "blocks_to_store", "offload_hits", "num_free_offload_blocks"}
BUILT_IN_OFFLOAD_POLICIES = sorted(name for name, cls in OFFLOAD_POLICIES.items()
                                   if cls.__module__ == "pagesim.engine.policy.offload.policies")


def sampled_token(seq, sample_index: int) -> int:
    key = f"{seq.request.request_id}:{seq.index}:{sample_index}:{seq.num_tokens}"
    return 10_000 + zlib.crc32(key.encode()) % 40_000


def token_ids(seq) -> list[int]:
    return list(seq.request.prompt_token_ids) + list(seq.output_token_ids)


def fingerprints(tokens) -> list[int]:
    """``f[p]`` stands for the prefix ``tokens[:p + 1]`` (what position ``p``'s KV depends on)."""
    out, h = [], 0
    for token in tokens:
        h = hash((h, token))
        out.append(h)
    return out


def key_tokens(key) -> tuple:
    """The whole token prefix a block key stands for (its chain's contents, root first)."""
    parts = []
    while key is not None:
        parts.append(key.content)
        key = key.parent
    return tuple(t for content in reversed(parts) for t in content)


def key_block(key, bs: int) -> list[int]:
    """The content of the block a key names: its last ``bs`` prefix fingerprints."""
    return fingerprints(key_tokens(key))[-bs:]


class TwoTierShadow:
    """GPU blocks, swap blocks and offload slots as lists of per-slot prefix fingerprints
    (``None``: never written)."""

    def __init__(self, scheduler: Scheduler):
        cfg = scheduler.config
        self.scheduler = scheduler
        self.bs = bs = cfg.block_size
        self.gpu = [[None] * bs for _ in range(cfg.num_gpu_blocks)]
        self.cpu = [[None] * bs for _ in range(cfg.num_cpu_blocks)]
        self.slots: list[list | None] = [None] * cfg.num_offload_blocks
        self.num_loads = 0
        self.num_stores = 0

    def execute(self, out: SchedulerOutput) -> None:
        s = self.scheduler
        pool, bs = s.pool, self.bs
        split = len(out.blocks_to_store) - out.num_finished_stores
        for gpu, slot in out.blocks_to_store[split:]:  # finished requests' (freed) blocks: before anything
            self._store(out, gpu, slot)
        for gpu, cpu in out.blocks_to_swap_out:
            self.cpu[cpu] = list(self.gpu[gpu])
        for cpu, gpu in out.blocks_to_swap_in:
            self.gpu[gpu] = list(self.cpu[cpu])
        for slot, gpu in out.blocks_to_load:
            content = self.slots[slot]
            expected = key_block(s.offload.store.key_of[slot], bs)
            assert content == expected, f"step {out.step}: slot {slot} loaded into block {gpu} holds other content"
            self.gpu[gpu] = list(content)
        self.num_loads += len(out.blocks_to_load)
        for src, dst in out.blocks_to_copy:
            self.gpu[dst] = list(self.gpu[src])
        requests = s.requests
        reads = []
        for sched in out.scheduled:
            seq = requests[sched.request_id].seqs[sched.seq_index]
            prints = fingerprints(token_ids(seq))
            start = sched.num_computed_tokens
            for pos, slot in zip(range(start, start + sched.num_new_tokens), sched.slot_mapping()):
                self.gpu[slot // bs][slot % bs] = prints[pos]
            reads.append((sched, prints))
        for sched, prints in reads:  # attention reads the whole context through the block table
            end = sched.num_computed_tokens + sched.num_new_tokens
            table = sched.block_table
            read = [self.gpu[table[p // bs]][p % bs] for p in range(end)]
            if read != prints[:end]:
                bad = next(p for p in range(end) if read[p] != prints[p])
                raise AssertionError(f"step {out.step}: {sched.seq_id} reads wrong KV at position {bad} "
                                     f"(block {table[bad // bs]})")
        for gpu, slot in out.blocks_to_store[:split]:  # after the forward pass: the blocks are written
            self._store(out, gpu, slot)

    def _store(self, out: SchedulerOutput, gpu: int, slot: int) -> None:
        content = self.gpu[gpu]
        key = self.scheduler.offload.store.key_of[slot]
        assert content == key_block(key, self.bs), (
            f"step {out.step}: block {gpu} stored to slot {slot} does not hold its key's content")
        self.slots[slot] = list(content)
        self.num_stores += 1


def check_output(s: Scheduler, out: SchedulerOutput, refused_before: int, evicted_before: int,
                 loaded: set | None = None) -> None:
    """What a schedule() with offloading on promises the executor, before it runs (``*_before``:
    the store's refused blocks and evictions before it; ``loaded``: the GPU blocks loaded from the
    store so far, updated)."""
    store, pool = s.offload.store, s.pool
    bs = s.block_size
    loaded = set() if loaded is None else loaded
    # Every block whose last token this step computes is offered (prompt blocks only, by
    # default), so its key is in the store now, unless the store refused an offer or evicted, or
    # the block was loaded from the store (a load of every token computes the last one again).
    if store.num_refused_blocks == refused_before and store.num_evictions == evicted_before:
        for sched in out.scheduled:
            seq = s.requests[sched.request_id].seqs[sched.seq_index]
            start, end = sched.num_computed_tokens, sched.num_computed_tokens + sched.num_new_tokens
            limit = min(end, seq.request.prompt_len if s.offload.prompt_only else seq.num_tokens) // bs
            for j in range(start // bs, limit):
                block = sched.block_table[j]
                assert pool.keys[block] in store or block in loaded, f"{sched.seq_id}'s block {j} was never offered"
    assert out.num_free_offload_blocks == store.num_free_blocks
    for slot, gpu in out.blocks_to_load:
        loaded.add(gpu)
    loaded = [gpu for _, gpu in out.blocks_to_load]
    assert len(set(loaded)) == len(loaded), "a GPU block loaded twice in one step"
    assert not set(loaded) & ({gpu for _, gpu in out.blocks_to_swap_in} | {dst for _, dst in out.blocks_to_copy})
    # a parked request (its load asynchronous) is never scheduled; its loaded blocks join the GPU
    # cache when it is promoted, a synchronous load's at once
    parked = set(out.parked)
    assert not parked & set(out.num_scheduled_tokens), "a parked request is scheduled"
    for rid in parked:
        assert s.requests[rid].status is RequestStatus.LOADING
    table_of: dict[int, tuple] = {}  # a loaded block -> the sequence that loads it (admitted first: a later
    for rid in (*out.new, *out.resumed, *sorted(parked)):  # admission of this step may hit it in the GPU cache)
        request = s.requests[rid]
        for seq in request.live_seqs:
            for j, b in enumerate(seq.block_table):
                table_of.setdefault(b, (request, seq, j))
    for slot, gpu in out.blocks_to_load:
        key = store.key_of[slot]
        assert key is not None and store.state[key] >= READY + 1, f"load from slot {slot}, not pinned for loading"
        assert pool.ref_counts[gpu] > 0, f"block {gpu} is loaded into and free"
        request, seq, j = table_of[gpu]
        assert seq.block_keys[j] is key, f"block {gpu} is loaded for another key than slot {slot} holds"
        if request.request_id in parked:
            assert pool.keys[gpu] is None, f"block {gpu} joined the GPU cache before its load is done"
        else:
            assert pool.keys[gpu] is key, f"block {gpu} is registered under another key than slot {slot} holds"
    stored_slots = [slot for _, slot in out.blocks_to_store]
    assert len(set(stored_slots)) == len(stored_slots), "a slot stored twice in one step"
    split = len(out.blocks_to_store) - out.num_finished_stores
    for i, (gpu, slot) in enumerate(out.blocks_to_store):
        key = store.key_of[slot]
        assert key is not None and store.state[key] == STORING, f"store to slot {slot}, which is not being stored"
        if i < split:  # (a finished request's block is free, or reallocated: stored before the forward pass)
            assert pool.keys[gpu] is key, f"block {gpu} is stored under another key"
            assert pool.ref_counts[gpu] > 0, f"block {gpu} is stored from but free"
    # offload hits: the loads of this step's admissions (into the tables of the request that
    # loads; a beam re-prefilling may hold its leader back a step, and a request admitted after
    # it in the same step may hit the loaded blocks in the GPU cache)
    assert sum(out.offload_hits.values()) == len(loaded) * bs
    admitted_blocks = {}
    for rid in (*out.new, *out.resumed, *parked):
        admitted_blocks[rid] = {b for seq in s.requests[rid].live_seqs for b in seq.block_table}
    for gpu in loaded:
        assert any(gpu in blocks for blocks in admitted_blocks.values()), (
            f"block {gpu} is loaded but in no table of a request admitted this step")
    for rid, tokens in out.offload_hits.items():
        assert len(admitted_blocks[rid] & set(loaded)) * bs >= tokens
        if rid not in parked:
            assert (out.new if rid in out.new else out.resumed)[rid] >= tokens  # (hit tokens of both tiers)


@st.composite
def workloads(draw, *, offload: bool = True, offload_policy: str | None = None):
    preset = draw(st.sampled_from(["pagesim", "vllm-v1"]))
    mode = draw(st.sampled_from(["recompute", "swap"])) if preset == "pagesim" else "recompute"
    block_size = draw(st.sampled_from([1, 2, 4]))
    overrides = dict(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(4, 24)),
        num_cpu_blocks=draw(st.integers(4, 24)) if mode == "swap" else 0,
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(4, 64)),
        max_model_len=draw(st.sampled_from([32, 64])),
        enable_chunked_prefill=draw(st.booleans()),
        eviction_policy=draw(st.sampled_from(sorted(EVICTION_POLICIES))),
        preemption_mode=mode,
    )
    if not overrides["enable_chunked_prefill"]:  # vLLM's rule: the budget holds a whole sequence
        overrides["max_num_batched_tokens"] = max(overrides["max_num_batched_tokens"], overrides["max_model_len"])
    if offload:
        overrides.update(
            num_offload_blocks=draw(st.one_of(st.integers(1, 8), st.just(64))),
            offload_eviction_policy=offload_policy or draw(st.sampled_from(BUILT_IN_OFFLOAD_POLICIES)),
            offload_prompt_only=draw(st.booleans()),
            offload_connector=draw(st.sampled_from(["0.33", "0.15"])),
        )
    prefixes = [[7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [21, 22, 23, 24, 25, 26]]
    requests = []
    for i in range(draw(st.integers(1, 10))):
        head = prefixes[draw(st.integers(0, 1))][: draw(st.integers(0, 10))]
        tail = draw(st.lists(st.integers(100, 102), min_size=0 if head else 1, max_size=12))
        kind = draw(st.sampled_from(["single"] * 6 + ["n", "beam"]))
        requests.append(dict(
            arrival_step=draw(st.integers(0, 12)),
            request=dict(request_id=f"r{i}", prompt_len=0, prompt_token_ids=head + tail,
                         max_tokens=draw(st.integers(1, 10)), n=2 if kind == "n" else 1,
                         beam_width=2 if kind == "beam" else 1),
        ))
    requests.sort(key=lambda r: r["arrival_step"])
    return preset, overrides, requests


class Run:
    """One workload served to the end; what it did."""

    def __init__(self, preset: str, overrides: dict, requests: list[dict], *, check: bool = True,
                 shadow_class: type[TwoTierShadow] = TwoTierShadow):
        s = self.scheduler = Scheduler(make_config(preset, **overrides))
        shadow = self.shadow = shadow_class(s) if check else None
        self.added: list[Request] = []
        self.offload_hit_tokens = 0
        loaded: set[int] = set()  # GPU blocks loaded from the store (until released)
        pending = list(requests)
        step = 0
        while pending or s.has_unfinished_requests:
            while pending and pending[0]["arrival_step"] <= step:
                request = Request(**pending.pop(0)["request"])
                s.add_request(request)
                self.added.append(request)
            store = s.offload.store if s.offload is not None else None
            before = (store.num_refused_blocks, store.num_evictions) if store is not None else None
            out = s.schedule()
            if check and store is not None:
                s.check()
                store.check()
                check_output(s, out, *before, loaded)
            if check:
                shadow.execute(out)
            self.offload_hit_tokens += sum(out.offload_hits.values())
            s.update(out, sampled_token)
            loaded &= {b for r in s.requests.values() for seq in r.live_seqs for b in seq.block_table}
            if check:
                s.check()
                if store is not None:
                    store.check()
            step += 1
            assert step < 2000, "the workload did not finish: something waits forever"

    def jsonl(self) -> str:
        return "".join(dump_record(r) + "\n" for r in self.scheduler.decision_log)


def check_end(run: Run) -> None:
    s = run.scheduler
    cfg = s.config
    for request in run.added:
        if request.status is RequestStatus.REJECTED:
            assert request.reject_reason
            continue
        assert request.status is RequestStatus.FINISHED
        for seq in request.seqs:
            if seq.finish_reason != "pruned":
                assert seq.num_output_tokens == min(request.max_tokens, cfg.max_model_len - request.prompt_len)
    assert s.pool.num_used_blocks == 0 and s.swap_pool.num_used_blocks == 0
    s.pool.check()
    store = s.offload.store
    s.offload.begin_step()  # the last step's copies are done
    store.check()
    assert all(state == READY for state in store.state.values()), "a copy is still in flight"
    assert store.num_free_blocks + store.num_used_blocks == store.num_blocks
    assert s.num_offload_hit_tokens <= s.num_prefix_hit_tokens
    assert s.num_offload_hit_tokens <= run.offload_hit_tokens  # (resumes count only in the output)
    assert s.offload.num_loaded_blocks * cfg.block_size == run.offload_hit_tokens
    assert run.shadow.num_loads == s.offload.num_loaded_blocks
    assert run.shadow.num_stores == s.offload.num_stored_blocks


@settings(max_examples=scaled_examples(150), deadline=None)
@given(workloads())
def test_both_tiers_stay_whole_and_every_copy_moves_the_right_content(workload):
    preset, overrides, requests = workload
    note(f"preset={preset} overrides={overrides}")
    run = Run(preset, overrides, requests)
    check_end(run)
    s = run.scheduler
    if run.offload_hit_tokens:
        event("offload hit")
    if s.offload.store.num_evictions:
        event("offload eviction")
    if s.offload.store.num_refused_blocks:
        event("offload store refused")
    if s.num_preemptions:
        event(f"preempted ({overrides['preemption_mode']})")


def test_random_workloads_do_load_from_the_store():
    """The property above has teeth only if loads happen: for each policy, a generated workload
    that loads from the store and evicts from it exists among a few hundred (derandomized)."""
    quick = settings(phases=[Phase.generate], max_examples=500, database=None, deadline=None, derandomize=True)

    def hits_and_evicts(workload):
        run = Run(*workload, check=False)
        return run.offload_hit_tokens > 0 and run.scheduler.offload.store.num_evictions > 0

    for policy in BUILT_IN_OFFLOAD_POLICIES:
        find(workloads(offload_policy=policy), hits_and_evicts, settings=quick)


def evicted_prefix_workload() -> tuple[str, dict, list[dict]]:
    """a's prompt (three full blocks) is stored as it is computed; b and c evict it from the
    small GPU pool; d has a's prompt and gets its blocks from the store."""
    prompt = list(range(1, 14))  # 13 tokens: 3 full blocks of 4

    def arrival(step, rid, tokens):
        return dict(arrival_step=step,
                    request=dict(request_id=rid, prompt_len=0, prompt_token_ids=tokens, max_tokens=2))

    requests = [arrival(0, "a", prompt), arrival(3, "b", [53] * 13), arrival(6, "c", [56] * 13),
                arrival(9, "d", prompt + [99])]
    return "pagesim", dict(block_size=4, num_gpu_blocks=6, num_offload_blocks=16), requests


def test_a_prefix_evicted_from_hbm_is_loaded_back_from_the_store():
    run = Run(*evicted_prefix_workload())
    check_end(run)
    s = run.scheduler
    records = list(s.decision_log)
    d_load = next(r for r in records if "d" in r["offload_hits"])
    assert d_load["offload_hits"] == {"d": 12}  # all three blocks of a's prompt, none on the GPU
    assert [slot for slot, _ in d_load["blocks_to_load"]] == [0, 1, 2]  # a's blocks, stored first
    # the load is asynchronous (vLLM's default): d is parked in that step, not scheduled, and
    # admitted in the next with its loaded tokens computed
    assert d_load["parked"] == ["d"] and "d" not in d_load["scheduled"] and d_load["new"] == {}
    d_new = records[d_load["step"] + 1]
    assert d_new["new"] == {"d": 12} and d_new["scheduled"]["d"] == 2 and d_new["parked"] == []
    assert s.num_offload_hit_tokens == 12


class NoLoadShadow(TwoTierShadow):
    """An executor whose loads copy nothing."""

    def execute(self, out):
        super().execute(replace(out, blocks_to_load=()))


class NoStoreShadow(TwoTierShadow):
    """An executor whose stores copy nothing."""

    def execute(self, out):
        super().execute(replace(out, blocks_to_store=()))


@pytest.mark.parametrize("broken", [NoLoadShadow, NoStoreShadow])
def test_the_content_model_has_teeth(broken):
    """A load or a store replaced by a no-op is caught: d reads (or loads) content that is not a's."""
    with pytest.raises(AssertionError, match="reads wrong KV|other content"):
        Run(*evicted_prefix_workload(), shadow_class=broken)


@settings(max_examples=scaled_examples(40), deadline=None)
@given(workloads(offload=False), st.sampled_from(BUILT_IN_OFFLOAD_POLICIES), st.booleans())
def test_offloading_off_logs_exactly_what_a_config_without_it_logs(workload, policy, prompt_only):
    preset, overrides, requests = workload
    plain = Run(preset, overrides, requests, check=False)
    zero = Run(preset, {**overrides, "num_offload_blocks": 0, "offload_eviction_policy": policy,
                        "offload_prompt_only": prompt_only}, requests, check=False)
    assert zero.scheduler.offload is None
    assert zero.jsonl() == plain.jsonl()
    for record in zero.scheduler.decision_log:
        assert not OFFLOAD_FIELDS & set(record), f"an offload field in {sorted(record)}"


def test_offloading_on_logs_its_fields_every_step():
    run = Run("pagesim", dict(block_size=2, num_gpu_blocks=16, num_offload_blocks=4),
              [dict(arrival_step=0, request=dict(request_id="a", prompt_len=0, prompt_token_ids=[1, 2, 3, 4, 5],
                                                 max_tokens=2))])
    records = list(run.scheduler.decision_log)
    assert all(OFFLOAD_FIELDS <= set(r) for r in records)
    assert records[0]["blocks_to_store"] == [[0, 0], [1, 1]] and records[0]["num_free_offload_blocks"] == 2
    assert all(r["blocks_to_load"] == [] and r["offload_hits"] == {} for r in records)


def test_the_store_policy_is_told_when_a_request_finishes_or_is_aborted():
    s = Scheduler(make_config("pagesim", block_size=2, num_gpu_blocks=16, num_offload_blocks=8))
    finished = []
    policy = s.offload.store.policy
    original = policy.request_finished
    policy.request_finished = lambda rid, keys, reused: (finished.append(rid), original(rid, keys, reused))
    for rid in ("a", "b"):
        s.add_request(Request(rid, 0, 4, prompt_token_ids=[1, 2, 3, 4, 5]))
    s.update(s.schedule(), sampled_token)
    s.abort_request("b")
    while s.has_unfinished_requests or s.offload.has_work:  # (the policy hears in the step after)
        s.update(s.schedule(), sampled_token)
    assert finished == ["b", "a"]
    s.check()


def test_a_resumed_sample_keeps_its_gpu_hit_when_another_sample_loads():
    """r1 (n = 2, a prompt shorter than a block, so both samples look their blocks up after its
    recompute preemption): sample 0's blocks are gone from the GPU but stored, sample 1's are
    still cached. Loading sample 0's evicts the least recent cached block, sample 1's hit, which
    sample 1 then takes as its own: it reads sample 0's KV."""
    overrides = dict(block_size=4, num_gpu_blocks=6, max_num_seqs=2, max_num_batched_tokens=4, max_model_len=32,
                     enable_chunked_prefill=True, eviction_policy="lru", preemption_mode="recompute",
                     num_offload_blocks=64, offload_eviction_policy="lru", offload_prompt_only=False)
    requests = [
        dict(arrival_step=0, request=dict(request_id="r0", prompt_len=0, prompt_token_ids=[1], max_tokens=12)),
        dict(arrival_step=0, request=dict(request_id="r1", prompt_len=0, prompt_token_ids=[1, 1], max_tokens=8, n=2)),
    ]
    check_end(Run("pagesim", overrides, requests))
