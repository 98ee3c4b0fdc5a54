"""Property tests: random workloads and configurations through the scheduler, executed on a
*shadow KV memory* that stores, per physical slot, which token it holds.

The shadow executor carries out each ``SchedulerOutput`` the way the engine will (swap out, swap
in, copy-on-write copies, then write the step's tokens into their slots) and then *reads* every
scheduled sequence's whole context back through its block table. Any wrong block table, missed
copy-on-write, lost swap or false prefix hit makes a read return the wrong token.

Also asserted: the policy's own invariants after every step, the token and batch budgets, exact
output lengths, that everything finishes or is rejected with a reason (nothing waits forever),
that the pool is whole again at the end, and that the same workload gives the same decision log.
"""

from __future__ import annotations

import zlib
from collections import Counter

from hypothesis import given, note, settings
from hypothesis import strategies as st

from pagesim.engine.policy import Request, RequestStatus, Scheduler, SchedulerOutput, make_config
from pagesim.engine.policy.memory.eviction import EVICTION_POLICIES
from pagesim.engine.policy.scheduling.steps.vllm_v0 import VLLM_V0_ABORTS
from tests.conftest import scaled_examples


def sampled_token(seq, sample_index: int) -> int:
    key = f"{seq.request.request_id}:{seq.index}:{sample_index}:{seq.num_tokens}"
    return 10_000 + zlib.crc32(key.encode()) % 40_000


class ShadowExecutor:
    """KV memory as token ids per slot; ``None`` = never written."""

    def __init__(self, scheduler: Scheduler):
        cfg = scheduler.config
        self.scheduler = scheduler
        self.bs = cfg.block_size
        self.gpu = [[None] * self.bs for _ in range(cfg.num_gpu_blocks)]
        self.cpu = [[None] * self.bs for _ in range(cfg.num_cpu_blocks)]

    def execute(self, out: SchedulerOutput) -> None:
        for gpu, cpu in out.blocks_to_swap_out:
            self.cpu[cpu] = list(self.gpu[gpu])
        for cpu, gpu in out.blocks_to_swap_in:
            self.gpu[gpu] = list(self.cpu[cpu])
        for src, dst in out.blocks_to_copy:
            self.gpu[dst] = list(self.gpu[src])
        requests = self.scheduler.requests
        for s in out.scheduled:
            seq = requests[s.request_id].seqs[s.seq_index]
            tokens = token_ids(seq)
            for pos, slot in zip(range(s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens), s.slot_mapping()):
                self.gpu[slot // self.bs][slot % self.bs] = tokens[pos]
        for s in out.scheduled:  # attention reads the whole context through the block table
            seq = requests[s.request_id].seqs[s.seq_index]
            tokens = token_ids(seq)
            end = s.num_computed_tokens + s.num_new_tokens
            read = [self.gpu[s.block_table[p // self.bs]][p % self.bs] for p in range(end)]
            assert read == tokens[:end], f"{s.seq_id} at step {out.step} reads wrong KV"


def token_ids(seq) -> list:
    return list(seq.request.prompt_token_ids) + list(seq.output_token_ids)


@st.composite
def workloads(draw):
    preset = draw(st.sampled_from(["pagesim", "vllm-v1", "vllm-v0"]))
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    overrides = dict(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(4, 40)),
        num_cpu_blocks=draw(st.integers(0, 24)),
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(4, 64)),
        max_model_len=draw(st.sampled_from([32, 64, 128])),
        enable_chunked_prefill=draw(st.booleans()),
        enable_prefix_caching=draw(st.booleans()),
        watermark=draw(st.sampled_from([0.0, 0.05, 0.1])),
        eviction_policy=draw(st.sampled_from(sorted(EVICTION_POLICIES))),
        victim_policy=draw(st.sampled_from(["running-tail", "latest-arrival", "fewest-blocks", "most-blocks", "priority"])),
    )
    if not overrides["enable_chunked_prefill"]:  # vLLM's rule: the budget holds a whole sequence
        overrides["max_num_batched_tokens"] = max(overrides["max_num_batched_tokens"], overrides["max_model_len"])
    if preset != "vllm-v1":
        overrides["preemption_mode"] = draw(st.sampled_from(["recompute", "swap", "vllm-v0"]))
    if preset == "vllm-v0":
        overrides["enable_prefix_caching"] = False  # vLLM 0.6.3's order is modelled without it
    prefixes = [[7, 8, 9, 10, 11, 12, 13, 14], [21, 22, 23, 24, 25]]
    requests = []
    for i in range(draw(st.integers(1, 9))):
        head = prefixes[draw(st.integers(0, 1))][: draw(st.integers(0, 8))]
        tail = draw(st.lists(st.integers(100, 103), min_size=0 if head else 1, max_size=24))
        kind = draw(st.sampled_from(["single", "single", "n", "beam"]))
        requests.append(
            dict(
                arrival_step=draw(st.integers(0, 8)),
                request=dict(
                    request_id=f"r{i}",
                    prompt_len=0,
                    prompt_token_ids=head + tail,
                    max_tokens=draw(st.integers(1, 12)),
                    n=draw(st.integers(2, 3)) if kind == "n" else 1,
                    beam_width=2 if kind == "beam" else 1,
                    priority=draw(st.integers(0, 2)),
                ),
            )
        )
    requests.sort(key=lambda r: r["arrival_step"])
    return preset, overrides, requests


def replay(preset, overrides, requests, *, check: bool = True):
    scheduler = Scheduler(make_config(preset, **overrides))
    shadow = ShadowExecutor(scheduler)
    cfg = scheduler.config
    added = []
    pending = list(requests)
    step = 0
    while pending or scheduler.has_unfinished_requests:
        while pending and pending[0]["arrival_step"] <= step:
            request = Request(**pending.pop(0)["request"])
            scheduler.add_request(request)
            added.append(request)
        try:
            out = scheduler.schedule()
        except VLLM_V0_ABORTS:  # where vLLM 0.6.3 itself stops; only its step order raises
            assert cfg.step_order == "vllm-v0"
            scheduler.check()
            return scheduler, added, True
        budgeted = out.num_scheduled_tokens
        if cfg.step_order == "vllm-v0":  # vLLM 0.6.3 never cuts a multi-sequence decode to the budget
            seqs_per_request = Counter(s.request_id for s in out.scheduled)
            budgeted = {rid: n for rid, n in budgeted.items() if seqs_per_request[rid] == 1}
        assert sum(budgeted.values()) <= cfg.max_num_batched_tokens
        if cfg.seq_limit_counts == "requests":
            assert len(scheduler.running) <= cfg.max_num_seqs
        if check:
            shadow.execute(out)
        scheduler.update(out, sampled_token)
        if check:
            scheduler.check()
        step += 1
        assert step < 3000, "the workload did not finish: something waits forever"
    return scheduler, added, False


@settings(max_examples=scaled_examples(150))
@given(workloads())
def test_random_workloads_run_correctly_on_shadow_kv_memory(workload):
    preset, overrides, requests = workload
    note(f"preset={preset} overrides={overrides}")
    scheduler, added, aborted = replay(preset, overrides, requests)
    if aborted:
        note("vLLM 0.6.3 would abort here (swap space exhausted, or a multi-sequence recompute)")
        return
    for request in added:
        if request.status is RequestStatus.REJECTED:
            assert request.reject_reason
            continue
        assert request.status is RequestStatus.FINISHED
        for seq in request.seqs:
            if seq.finish_reason == "pruned":
                continue
            expected = min(request.max_tokens, scheduler.config.max_model_len - request.prompt_len)
            assert seq.num_output_tokens == expected, seq.seq_id
    assert scheduler.pool.num_used_blocks == 0
    assert scheduler.swap_pool.num_used_blocks == 0
    # the same workload, again, from scratch: the same decisions
    again, _, _ = replay(preset, overrides, requests, check=False)
    assert again.decision_log == scheduler.decision_log
