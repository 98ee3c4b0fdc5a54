"""Disaggregated prefill/decode (``pagesim/engine/policy/disagg/``) on two schedulers and a content model.

A prefill ``Scheduler`` and a decode ``Scheduler`` (``kv_connector="nixl"``, prefix caching on, a
small pool so that the decode side preempts) serve random workloads in lockstep, driven by an
executor written here that plays vLLM's proxy and NIXL:

- each request goes to the prefill side first (``RemoteDecode()``, ``max_tokens`` 1); when it
  finishes, its ``KvSend`` (``pd.take_sends()``) is handed, some steps later, to the decode side
  as the request's ``RemotePrefill`` (``send.params``), with its real ``max_tokens``;
- each read a decode step issues (``out.kv_receives``) is carried out some steps later: the
  prefill blocks it names are copied into the decode blocks it names, then the decode side is told
  (``pd.complete``) and, at once or a little later, the prefill side frees them (``pd.release``);
- some sends are never handed on and run out their lease (``pd.release(rid, expired=True)``: in
  vLLM the lease runs out only for a request no decode instance took); some requests are aborted
  on the prefill side before they finish, some on the decode side before their read is issued
  (then the prefill side is told at once, vLLM's notify-only read) or after it is done.

Both sides run a *content model*: every slot of a block holds a fingerprint of the token prefix
whose KV it would hold, written when a scheduled sequence computes the position, copied by the
reads. Every scheduled sequence reads its whole context back through its block table, so a read
of a block that was freed and reused, a read that copied the wrong blocks, or a local prefix hit
that does not hold what the read skips, all read wrong KV. And:

1. prefill side: every held send is released exactly once (``release`` says True once, False
   after); while held its blocks are in use (reference count > 0), never free or cached; the
   decision record of the step that finished a request names its send (``kv_send``), and the next
   record names its release (``kv_freed``); at the end the pool holds nothing;
2. no read after free: when a read is issued and when it is carried out, every remote block it
   names is held by the prefill side for that request (and holds the prompt's KV);
3. the decode side never schedules a parked request, issues one read per request at most, and
   after the read is done schedules the request first with exactly its last prompt token
   (``num_computed == prompt_len - 1``), its admission's prefix hit being its local hit only;
4. every decode request finishes with exactly its ``max_tokens`` outputs (or reaches the model's
   length), the policy's invariants hold after every step on both sides, and every decision record
   carries the P/D fields (``kv_recv``, ``kv_received``, ``kv_freed``, ``parked``; ``kv_send``);
5. a read starts where the decode side's local prefix hit ends (``first_token`` is the hit's
   blocks times the block size) and its remote and local blocks cover exactly
   ``[first_token, num_tokens)``.

Two behaviours this suite found diverging from vLLM, now fixed, are pinned by the tests at the
end: ``Scheduler.check()`` counts the tables of held sends (a prefill instance), and aborting a
decode request while its read is in flight keeps the blocks the read writes into until it is
reported done (vLLM's ``Scheduler.finish_requests`` delays freeing a ``WAITING_FOR_REMOTE_KVS``
request's blocks until its ``finished_recving``); the property test aborts requests mid-read.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import pytest
from hypothesis import Phase, event, find, given, note, settings
from hypothesis import strategies as st

from pagesim.engine.policy import Request, RequestStatus, Scheduler, make_config
from pagesim.engine.policy.disagg import KvReceive, KvSend, RemoteDecode, RemotePrefill
from tests.conftest import scaled_examples

PD_FIELDS = {"kv_recv", "kv_received", "kv_freed", "parked"}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sampled_token(seq, sample_index: int) -> int:
    key = f"{seq.request.request_id}:{seq.index}:{sample_index}:{seq.num_tokens}"
    return 10_000 + zlib.crc32(key.encode()) % 40_000


def fingerprints(tokens) -> list[int]:
    """``f[p]`` stands for the prefix ``tokens[:p + 1]`` (what position ``p``'s KV depends on)."""
    out, h = [], 0
    for token in tokens:
        h = hash((h, token))
        out.append(h)
    return out


class Shadow:
    """One instance's GPU blocks as lists of per-slot prefix fingerprints (``None``: never written)."""

    def __init__(self, name: str, scheduler: Scheduler):
        self.name = name
        self.scheduler = scheduler
        self.bs = scheduler.config.block_size
        self.gpu = [[None] * self.bs for _ in range(scheduler.config.num_gpu_blocks)]

    def execute(self, out) -> None:
        s, bs = self.scheduler, self.bs
        assert not out.blocks_to_copy and not out.blocks_to_swap_in and not out.blocks_to_swap_out
        reads = []
        for sched in out.scheduled:
            seq = s.requests[sched.request_id].seqs[sched.seq_index]
            prints = fingerprints(list(seq.request.prompt_token_ids) + list(seq.output_token_ids))
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
                raise AssertionError(f"{self.name} step {out.step}: {sched.seq_id} reads wrong KV at position "
                                     f"{bad} (block {table[bad // bs]})")


# ---------------------------------------------------------------------------------- workloads
FATES = ["decode"] * 6 + ["expire", "abort_prefill", "abort_decode"]


@st.composite
def pd_workloads(draw):
    p_bs = draw(st.sampled_from([4, 16]))
    # (mostly the same block size on both sides; now and then a decode instance with another)
    d_bs = draw(st.sampled_from([p_bs] * 4 + [{4: 16, 16: 4}[p_bs]]))
    max_model_len = 8 * max(p_bs, d_bs)

    def side(bs: int) -> dict:
        return dict(block_size=bs, num_gpu_blocks=draw(st.integers(3, 14)) * max(p_bs, d_bs) // bs + 1,
                    max_num_seqs=draw(st.integers(1, 6)), max_num_batched_tokens=draw(st.integers(1, 4)) * bs,
                    max_model_len=max_model_len)

    prefill, decode = side(p_bs), side(d_bs)
    unit = max(p_bs, d_bs)
    prefixes = [[draw(st.integers(0, 2)) + 1000 * k for _ in range(3 * unit)] for k in range(2)]
    requests = []
    for i in range(draw(st.integers(1, 12))):
        head = prefixes[draw(st.integers(0, 1))][: draw(st.integers(0, 3 * unit))]
        tail = draw(st.lists(st.integers(100, 102), min_size=0 if head else 1, max_size=2 * unit))
        requests.append(dict(
            rid=f"r{i}", prompt=head + tail, arrival=draw(st.integers(0, 12)), max_tokens=draw(st.integers(1, 16)),
            fate=draw(st.sampled_from(FATES)), handoff=draw(st.integers(0, 3)), transfer=draw(st.integers(0, 4)),
            release_lag=draw(st.integers(0, 2)), expire=draw(st.integers(0, 6)), abort_at=draw(st.integers(0, 8)),
        ))
    requests.sort(key=lambda r: r["arrival"])
    # generated tokens named (an engine's) or not (a simulator's: contents unique to their sequence)
    return prefill, decode, requests, draw(st.booleans())


# ---------------------------------------------------------------------------------- the executor
@dataclass
class Flow:
    """One request's way through both instances, as the executor saw it."""

    spec: dict
    p_request: Request | None = None
    d_request: Request | None = None
    send: KvSend | None = None
    read: KvReceive | None = None
    read_done: bool = False
    first_decode_step_seen: bool = False
    releases: list[bool] = field(default_factory=list)  # what each P-side release answered
    decode_done: bool = False  # the decode side is done with it (finished, aborted, rejected)


class PdRun:
    """A workload served to the end by a prefill and a decode scheduler in lockstep."""

    MAX_TICKS = 3000
    copy_blocks = True  # (False: a broken executor whose reads copy nothing)
    release_at_handoff = False  # (True: a broken proxy that frees the prefill blocks before they are read)

    def __init__(self, prefill: dict, decode: dict, requests: list[dict], named_tokens: bool = True):
        self.sampled = sampled_token if named_tokens else None
        self.P = P = Scheduler(make_config("vllm-v1", kv_connector="nixl", enable_prefix_caching=True,
                                           record_decisions=True, **prefill))
        self.D = D = Scheduler(make_config("vllm-v1", kv_connector="nixl", enable_prefix_caching=True,
                                           record_decisions=True, **decode))
        self.p_shadow, self.d_shadow = Shadow("prefill", P), Shadow("decode", D)
        self.flows: dict[str, Flow] = {r["rid"]: Flow(r) for r in requests}
        self.events: dict[int, list] = {}  # tick -> [(kind, rid)], at that tick's step boundary
        self.p_freed: list[str] = []  # released since the prefill side's last schedule()
        self.d_received: list[str] = []  # reads reported done since the decode side's last schedule()
        self.num_expired = 0
        self.stats = dict(local_hit_reads=0, d_preemptions=0, p_preemptions=0, aborted_decode=0, aborted_mid_read=0, aborted_prefill=0,
                          notify_only=0, rejected=0)
        pending = list(requests)
        self.tick = 0
        while pending or self.events or P.has_unfinished_requests or D.has_unfinished_requests or P.pd.held_sends():
            for kind, rid in self.events.pop(self.tick, []):
                getattr(self, f"_on_{kind}")(rid)
            while pending and pending[0]["arrival"] <= self.tick:
                self._arrive(pending.pop(0))
            self._prefill_step()
            self._decode_step()
            self._check_held()
            self.tick += 1
            assert self.tick < self.MAX_TICKS, "the workload did not finish: something waits forever"
        self._check_end()

    def at(self, delay: int, kind: str, rid: str) -> None:
        self.events.setdefault(self.tick + 1 + delay, []).append((kind, rid))

    # ------------------------------------------------------------------ the proxy
    def _arrive(self, spec: dict) -> None:
        flow = self.flows[spec["rid"]]
        prompt = spec["prompt"]
        flow.p_request = Request(spec["rid"], len(prompt), 1, prompt_token_ids=list(prompt))
        if not self.P.add_request(flow.p_request, RemoteDecode()):
            flow.decode_done = True  # (refused up front: nothing is held, nothing goes on)
            self.stats["rejected"] += 1
            return
        if spec["fate"] == "abort_prefill":
            self.at(spec["abort_at"], "abort_prefill", spec["rid"])

    def _on_abort_prefill(self, rid: str) -> None:
        if rid in self.P.requests:  # (finished already: it goes on as any other)
            self.P.abort_request(rid)
            self.flows[rid].decode_done = True
            self.stats["aborted_prefill"] += 1

    def _on_handoff(self, rid: str) -> None:
        flow = self.flows[rid]
        prompt = flow.spec["prompt"]
        flow.d_request = Request(rid, len(prompt), flow.spec["max_tokens"], prompt_token_ids=list(prompt))
        params = flow.send.params(0, self.P.block_size)
        assert params == RemotePrefill(0, rid, flow.send.block_ids, self.P.block_size, len(prompt))
        if not self.D.add_request(flow.d_request, params):  # refused: the prefill side is told (notify-only)
            self._decode_gone(flow)
            return
        if self.release_at_handoff:
            self._release(flow, expired=False)
        if flow.spec["fate"] == "abort_decode":
            self.at(flow.spec["abort_at"], "abort_decode", rid)

    def _on_abort_decode(self, rid: str) -> None:
        flow = self.flows[rid]
        if rid not in self.D.requests:
            return
        if flow.read is not None and not flow.read_done:  # (its blocks outlive the abort until the read ends)
            self.stats["aborted_mid_read"] += 1
        self.D.abort_request(rid)
        self.stats["aborted_decode"] += 1
        self._decode_gone(flow)

    def _decode_gone(self, flow: Flow) -> None:
        """The decode side dropped the request: if it never issued the read, the prefill side
        frees the blocks now (vLLM's notify-only read); else the read's release frees them."""
        flow.decode_done = True
        if flow.read is None:
            self._release(flow, expired=False)
            self.stats["notify_only"] += 1

    def _on_expire(self, rid: str) -> None:
        self._release(self.flows[rid], expired=True)
        self.num_expired += 1

    def _release(self, flow: Flow, *, expired: bool) -> None:
        rid = flow.send.request_id
        assert self.P.pd.is_held(rid) and not flow.releases, f"{rid}'s send is released twice"
        blocks = self.P.pd.held_blocks(rid)
        assert all(self.P.pool.ref_counts[b] > 0 for b in blocks)
        flow.releases.append(self.P.pd.release(rid, expired=expired))
        flow.releases.append(self.P.pd.release(rid))  # (a second release is a no-op that says so)
        flow.releases.append(self.P.pd.release(rid, expired=True))
        assert flow.releases == [True, False, False], f"{rid}: releases answered {flow.releases}"
        assert not self.P.pd.is_held(rid)
        self.p_freed.append(rid)

    # ------------------------------------------------------------------ NIXL
    def _on_transfer(self, rid: str) -> None:
        """The read is carried out: the prefill blocks are copied into the decode blocks."""
        flow = self.flows[rid]
        read = flow.read
        P, D = self.P, self.D
        # 2. no read after free: the prefill side still holds every block the read names
        assert P.pd.is_held(rid), f"{rid}'s remote blocks are read after they were freed"
        held = P.pd.held_blocks(rid)
        assert set(read.remote_blocks) <= set(held)
        rbs, dbs = read.source.block_size, D.block_size
        prints = fingerprints(flow.spec["prompt"])
        seq = flow.d_request.seqs[0]
        for p in range(read.first_token, read.num_tokens if self.copy_blocks else 0):
            remote = read.source.block_ids[p // rbs]
            assert remote in read.remote_blocks
            assert P.pool.ref_counts[remote] > 0, f"{rid}: remote block {remote} is free while it is read"
            content = self.p_shadow.gpu[remote][p % rbs]
            assert content == prints[p], f"{rid}: remote block {remote} no longer holds position {p}'s KV"
            local = read.local_blocks[p // dbs - read.first_token // dbs]
            assert D.pool.ref_counts[local] > 0 and local == seq.block_table[p // dbs], (
                f"{rid}: the read writes into block {local}, which it no longer holds")
            self.d_shadow.gpu[local][p % dbs] = content
        aborted = flow.decode_done  # (aborted while its read ran: the report frees its blocks)
        assert D.pd.complete(rid) is (not aborted)
        assert D.pd.complete(rid) is False  # (reported once)
        if aborted:
            assert all(D.pool.ref_counts[b] == 0 for b in read.local_blocks), f"{rid}: an aborted read's blocks stay held"
        flow.read_done = True
        if not aborted:
            self.d_received.append(rid)
        if flow.spec["release_lag"]:  # (the prefill side hears of it later)
            self.at(flow.spec["release_lag"] - 1, "release", rid)
        else:
            self._release(flow, expired=False)

    def _on_release(self, rid: str) -> None:
        self._release(self.flows[rid], expired=False)

    # ------------------------------------------------------------------ the two instances
    def _prefill_step(self) -> None:
        P = self.P
        out = P.schedule()
        assert out.kv_receives == ()  # (nothing is read into a prefill instance)
        assert out.kv_freed == tuple(self.p_freed), f"kv_freed {out.kv_freed}, released {self.p_freed}"
        self.p_freed = []
        assert out.parked == ()
        check_prefill(P, self.flows)
        self.p_shadow.execute(out)
        self.stats["p_preemptions"] += len(out.preempted)
        for rid in out.rejected:
            flow = self.flows[rid]
            assert flow.send is None
            if not flow.decode_done:  # (refused by add_request: listed here, counted there)
                flow.decode_done = True
                self.stats["rejected"] += 1
        finished = P.update(out, self.sampled)
        check_prefill(P, self.flows)
        sends = P.pd.take_sends()
        assert P.pd.take_sends() == []
        record = P.decision_log.records[-1]
        assert record["step"] == out.step
        # (the sends this step's finished requests hold; a record where nothing is held may leave the key out)
        assert record.get("kv_send", {}) == {s.request_id: list(s.block_ids) for s in sends}
        assert bool(sends) <= ("kv_send" in record)
        assert [s.request_id for s in sends] == [r.request_id for r in finished]  # (max_tokens 1: all by length)
        for send in sends:
            flow = self.flows[send.request_id]
            assert flow.send is None, f"{send.request_id} sent twice"
            flow.send = send
            prompt_len = len(flow.spec["prompt"])
            seq = flow.p_request.seqs[0]
            assert send.num_tokens == prompt_len and seq.num_computed_tokens == prompt_len
            assert send.block_ids == tuple(seq.block_table[:cdiv(prompt_len, P.block_size)])
            assert seq.finish_reason in ("length", "max_model_len")
            if flow.spec["fate"] == "expire":
                self.at(flow.spec["expire"], "expire", send.request_id)
            else:
                self.at(flow.spec["handoff"], "handoff", send.request_id)

    def _decode_step(self) -> None:
        D = self.D
        out = D.schedule()
        check_decode_scheduled(D, out, self)
        assert out.kv_received == tuple(self.d_received), f"kv_received {out.kv_received}, done {self.d_received}"
        self.d_received = []
        assert out.kv_freed == ()
        self.stats["d_preemptions"] += len(out.preempted)
        D.check()
        self.d_shadow.execute(out)
        for rid in out.rejected:  # (refused at its admission: the prefill side is told)
            flow = self.flows[rid]
            assert flow.read is None
            if not flow.decode_done:  # (refused by add_request: listed here, handled there)
                self.stats["rejected"] += 1
                self._decode_gone(flow)
        finished = D.update(out, self.sampled)
        assert D.decision_log.records[-1].get("kv_send", {}) == {}
        for request in finished:
            flow = self.flows[request.request_id]
            flow.decode_done = True
            assert flow.read_done
        D.check()

    def _check_held(self) -> None:
        """1. While held, a send's blocks are in use, never free or cached."""
        P = self.P
        for send in P.pd.held_sends():
            flow = self.flows[send.request_id]
            assert not flow.releases
            for b in send.block_ids:
                assert P.pool.ref_counts[b] > 0, f"block {b} of {send.request_id}'s held send is free"

    def _check_end(self) -> None:
        P, D = self.P, self.D
        assert not P.pd.held_sends() and not D.pd.has_work
        for flow in self.flows.values():
            if flow.send is not None:
                assert flow.releases == [True, False, False], f"{flow.spec['rid']}: {flow.releases}"
            if flow.d_request is not None:
                assert flow.d_request.status in (RequestStatus.FINISHED, RequestStatus.REJECTED)
            if flow.d_request is not None and flow.d_request.status is RequestStatus.FINISHED:
                seq = flow.d_request.seqs[0]
                if seq.finish_reason != "aborted":
                    expected = min(flow.spec["max_tokens"], D.config.max_model_len - len(flow.spec["prompt"]))
                    assert seq.num_output_tokens == expected
            if flow.spec["fate"] == "decode" and flow.read is not None:
                assert flow.read_done
        assert P.pool.num_used_blocks == 0, f"the prefill side leaks {P.pool.num_used_blocks} blocks"
        assert D.pool.num_used_blocks == 0, f"the decode side leaks {D.pool.num_used_blocks} blocks"
        P.check()
        D.check()
        assert P.pd.num_expired == self.num_expired
        assert D.pd.num_received_blocks == sum(len(f.read.local_blocks) for f in self.flows.values() if f.read)
        for s in (P, D):
            for record in s.decision_log.records:
                assert PD_FIELDS <= set(record), f"a record without the P/D fields: {sorted(record)}"


def check_prefill(P: Scheduler, flows: dict[str, Flow]) -> None:
    """``Scheduler.check()``, which fails while a send is held (it counts only unfinished
    requests' tables, see test_check_passes_on_a_prefill_instance_holding_a_send): with sends held,
    the same block accounting with the held requests' tables counted too."""
    held = [flows[s.request_id].p_request for s in P.pd.held_sends()]
    if not held:
        P.check()
        return
    P.kv.check([*P.requests.values(), *held])
    for request in held:
        assert request.request_id not in P.requests and request.status is RequestStatus.FINISHED


def check_decode_scheduled(D: Scheduler, out, run: PdRun) -> None:
    """3 and 5: what a decode schedule() decided, before it runs."""
    P = run.P
    scheduled = set(out.num_scheduled_tokens)
    parked = set(out.parked)
    assert not parked & scheduled, f"step {out.step}: parked {sorted(parked & scheduled)} scheduled"
    for rid in parked:
        assert D.requests[rid].status is RequestStatus.LOADING
    in_flight = {rid for rid, f in run.flows.items() if f.read is not None and not f.read_done and not f.decode_done}
    assert in_flight <= parked, f"step {out.step}: {sorted(in_flight - parked)} reading but not parked"
    record = D.decision_log.records[-1]
    assert record["step"] == out.step and PD_FIELDS <= set(record)
    assert set(record["kv_recv"]) == {r.request_id for r in out.kv_receives}
    assert record["parked"] == sorted(parked)
    dbs = D.block_size
    for read in out.kv_receives:
        rid = read.request_id
        flow = run.flows[rid]
        assert flow.read is None, f"{rid} is read twice"
        flow.read = read
        assert rid in parked and rid not in scheduled and read.step == out.step
        # 2. the prefill side holds every block the read names
        assert P.pd.is_held(rid), f"{rid}: a read is issued for blocks the prefill side freed"
        assert read.source == flow.send.params(0, P.block_size)
        rbs = read.source.block_size
        prompt_len = len(flow.spec["prompt"])
        # 5. the read starts where the local hit ends and covers the rest of the prompt
        seq = flow.d_request.seqs[0]
        first, end = read.first_token, read.num_tokens
        assert end == prompt_len and 0 <= first < end and first % dbs == 0
        assert len(seq.block_table) == cdiv(prompt_len, dbs) and seq.num_computed_tokens == prompt_len
        hit = seq.block_table[:first // dbs]
        assert all(D.pool.keys[b] is not None and D.pool.ref_counts[b] > 0 for b in hit), "the local hit is not cached"
        assert read.local_blocks == tuple(seq.block_table[first // dbs:])
        assert all(D.pool.keys[b] is None for b in read.local_blocks), "a block being read joined the cache"
        assert read.remote_blocks == read.source.block_ids[first // rbs:cdiv(end, rbs)]
        assert set(read.remote_blocks) <= set(P.pd.held_blocks(rid))
        assert all(P.pool.ref_counts[b] > 0 for b in read.remote_blocks)
        assert record["kv_recv"][rid] == read.to_record() and record["kv_recv"][rid]["tokens"] == [first, end]
        if first:
            run.stats["local_hit_reads"] += 1
        run.at(flow.spec["transfer"], "transfer", rid)
    for sched in out.scheduled:
        rid = sched.request_id
        flow = run.flows[rid]
        assert flow.read_done, f"step {out.step}: {rid} is scheduled before its read is done"
        if not flow.first_decode_step_seen:  # its first step after the read: the last prompt token again
            flow.first_decode_step_seen = True
            prompt_len = len(flow.spec["prompt"])
            assert (sched.num_computed_tokens, sched.num_new_tokens) == (prompt_len - 1, 1), (
                f"{rid}'s first step after its read computes [{sched.num_computed_tokens}, "
                f"{sched.num_computed_tokens + sched.num_new_tokens})")
            assert sched.samples
            assert out.new.get(rid) == flow.read.first_token  # (its prefix hit is its local hit only)


@settings(max_examples=scaled_examples(120), deadline=None)
@given(pd_workloads())
def test_pd_blocks_are_freed_once_never_read_after_free_and_parked_requests_never_run(workload):
    prefill, decode, requests, named_tokens = workload
    note(f"prefill={prefill} decode={decode} named_tokens={named_tokens}")
    run = PdRun(prefill, decode, requests, named_tokens)
    for name, count in run.stats.items():
        if count:
            event(name)
    if run.num_expired:
        event("expired")
    if prefill["block_size"] != decode["block_size"]:
        event("block sizes differ")


@pytest.mark.parametrize("what", ["local_hit_reads", "d_preemptions", "expired", "aborted_decode", "aborted_mid_read", "aborted_prefill",
                                  "notify_only"])
def test_random_workloads_do_hit_locally_expire_abort_and_preempt(what):
    """The property above has teeth only if these happen: a generated workload does each."""
    quick = settings(phases=[Phase.generate], max_examples=300, database=None, deadline=None, derandomize=True)

    def does_it(workload):
        run = PdRun(*workload)
        return bool(run.num_expired if what == "expired" else run.stats[what])

    find(pd_workloads(), does_it, settings=quick)


def shared_prefix_workload() -> tuple[dict, dict, list[dict]]:
    """Three requests on one 10-token prefix, handed on and read one after another."""
    side = dict(block_size=4, num_gpu_blocks=24, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    prefix = list(range(1, 11))
    requests = [dict(rid=f"r{i}", prompt=prefix + [100 + i] * (i + 1), arrival=3 * i, max_tokens=4, fate="decode",
                     handoff=1, transfer=2, release_lag=1, expire=0, abort_at=0) for i in range(3)]
    return side, dict(side), requests


class NoCopyRun(PdRun):
    copy_blocks = False


class EarlyReleaseRun(PdRun):
    release_at_handoff = True


def test_the_checks_have_teeth():
    """A read that copies nothing is caught (the decode side reads wrong KV), and so is a send
    freed before it is read; the workload passes with the right executor."""
    run = PdRun(*shared_prefix_workload())
    assert run.stats["local_hit_reads"] == 2
    with pytest.raises(AssertionError, match="reads wrong KV"):
        NoCopyRun(*shared_prefix_workload())
    with pytest.raises(AssertionError, match="a read is issued for blocks the prefill side freed"):
        EarlyReleaseRun(*shared_prefix_workload())


# ---------------------------------------------------------------------------------- directed cases
def two_instances(num_gpu_blocks: int = 16, block_size: int = 4) -> tuple[Scheduler, Scheduler]:
    cfg = make_config("vllm-v1", num_gpu_blocks=num_gpu_blocks, block_size=block_size, max_num_seqs=8,
                      max_num_batched_tokens=64, max_model_len=64, kv_connector="nixl", enable_prefix_caching=True,
                      record_decisions=True)
    return Scheduler(cfg), Scheduler(cfg)


def prefill_one(P: Scheduler, rid: str, prompt: list[int]) -> KvSend:
    P.add_request(Request(rid, len(prompt), 1, prompt_token_ids=prompt), RemoteDecode())
    while not (sends := P.pd.take_sends()):
        P.update(P.schedule(), sampled_token)
    return sends[0]


def test_a_second_decode_request_reads_only_what_its_local_hit_lacks():
    P, D = two_instances()
    prompt_a = list(range(1, 11))  # 10 tokens: blocks of 4, 4, 2
    prompt_b = prompt_a[:8] + [77, 78, 79]
    for rid, prompt in (("a", prompt_a), ("b", prompt_b)):
        send = prefill_one(P, rid, prompt)
        assert P.decision_log.records[-1]["kv_send"] == {rid: list(send.block_ids)}
        D.add_request(Request(rid, len(prompt), 2, prompt_token_ids=prompt), send.params(0, 4))
        out = D.schedule()
        (read,) = out.kv_receives
        assert out.parked == (rid,) and not out.num_scheduled_tokens
        D.update(out, sampled_token)
        assert D.pd.complete(rid) and P.pd.release(rid) and not P.pd.release(rid)
        out = D.schedule()
        assert out.kv_received == (rid,) and dict(out.num_scheduled_tokens) == {rid: 1}
        assert out.scheduled[0].num_computed_tokens == len(prompt) - 1
        assert out.new == {rid: read.first_token}
        while rid in D.requests:
            D.update(out, sampled_token)
            out = D.schedule()
        assert P.schedule().kv_freed == (rid,)
        if rid == "a":
            assert (read.first_token, read.remote_blocks) == (0, send.block_ids)
        else:  # a's first two blocks are cached on the decode side: b reads its third only
            assert read.first_token == 8 and read.remote_blocks == send.block_ids[2:]
            assert len(read.local_blocks) == 1
    assert P.pool.num_used_blocks == 0


def test_an_expired_send_is_freed_once_and_a_late_release_says_so():
    P, _ = two_instances()
    send = prefill_one(P, "a", list(range(9)))
    assert P.pool.num_used_blocks == len(send.block_ids) == 3
    assert P.pd.release("a", expired=True) is True
    assert P.pd.release("a") is False and P.pd.num_expired == 1
    assert P.pool.num_used_blocks == 0
    assert P.schedule().kv_freed == ("a",)


def test_check_passes_on_a_prefill_instance_holding_a_send():
    P, _ = two_instances()
    prefill_one(P, "a", list(range(10)))
    assert P.pd.is_held("a")
    P.check()


def test_aborting_a_decode_request_while_its_read_is_in_flight_keeps_its_blocks():
    P, D = two_instances()
    send = prefill_one(P, "a", list(range(8)))
    D.add_request(Request("a", 8, 4, prompt_token_ids=list(range(8))), send.params(0, 4))
    out = D.schedule()
    (read,) = out.kv_receives
    D.update(out, sampled_token)
    D.abort_request("a")  # the client goes away while the read is in flight
    D.add_request(Request("b", 8, 4, prompt_token_ids=[50 + i for i in range(8)]))
    out = D.schedule()
    taken = set(out.scheduled[0].block_table) & set(read.local_blocks)
    assert not taken, f"b is given blocks {sorted(taken)} that a's read is still writing into"
    assert all(D.pool.ref_counts[b] > 0 for b in read.local_blocks)
    # once the read is reported done, they are freed, and so are the prefill side's
    D.pd.complete("a")
    assert P.pd.release("a")
    D.update(out, sampled_token)
    while D.has_unfinished_requests:
        D.update(D.schedule(), sampled_token)
    D.schedule()
    assert D.pool.num_used_blocks == 0 and P.pool.num_used_blocks == 0
