"""The real engine: the policy's scheduler driving a model on paged KV tensors, step by step.

Each ``step()``: ``Scheduler.schedule()`` -> ``ModelRunner.execute`` (swaps, offload loads,
copy-on-write, forward, offload stores) -> sampling -> ``Scheduler.update()`` with the tokens (and
beam choices), so every fork, copy-on-write, offload and free goes through the same policy objects
the simulator drives. The scheduler writes the decision log (one record per step, the
simulator's format); the engine records when each request arrived, was first scheduled, produced
its first token and finished, and what each step did and took on the wall clock.

Two ways to feed requests:
- ``run(requests)``: against the wall clock, each request released at its ``arrival_time_s``
  after the run starts (a request arriving during a step is seen by the next ``schedule()``,
  as in the simulator);
- ``run_lockstep(requests, release_steps)``: request ``r`` is released just before the
  ``schedule()`` of step ``release_steps[r]`` (or as soon as the engine is idle, since an idle
  engine takes no steps), which reproduces a simulator's decisions exactly.

``keep_outputs=True`` keeps every step's ``SchedulerOutput`` (``engine.outputs``): calibration
and ``pagesim validate`` cost the steps the engine actually ran. ``scheduler_cls`` runs a user's
``Scheduler`` subclass (``--plugin``) in place of the policy's own.

Requests stop exactly at their output length (EOS ignored, as benchmark tools do). A request the
model cannot hold (prompt + output beyond its context) is refused with ``RequestTooLong``; one
the policy can never serve (too many blocks) is rejected with the policy's reason.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from engine.model.llama import LlamaForCausalLM
from engine.policy import Request, Scheduler, SchedulerConfig, SchedulerOutput
from engine.policy.progress import ProgressWatch
from engine.runtime.kv_cache import PagedKVCache, scheduler_kv_settings
from engine.runtime.runner import ExecutionError, ModelRunner, Releases, StepLogits
from engine.runtime.sampler import SamplingParams, assign_beam_indices, beam_candidates, sample_token
from traces.trace import Trace

SPIN_S = 1e-3  # an idle engine waits for the next arrival asleep, then spinning for this long


class RequestTooLong(ValueError):
    """A request longer than the model's context (or than ``max_model_len``)."""


class EngineStalled(RuntimeError):
    """The scheduler stopped making progress with requests unfinished."""


@dataclass(slots=True)
class RequestRecord:
    """One request's timeline on the engine's clock (seconds since the run started)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    n: int
    beam_width: int
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    release_step: int = 0  # the first step whose schedule() could see it (run_lockstep replays a run with these)
    status: str = "waiting"  # waiting | completed | rejected | aborted
    reject_reason: str = ""
    preemptions: int = 0
    output_tokens: int = 0  # over all returned samples / beams
    token_times_s: list[float] = field(default_factory=list)  # end of each step that gave it a token (ITL)
    outputs: dict[int, list[int]] = field(default_factory=dict)  # sequence index -> tokens (pruned beams left out)


@dataclass(slots=True)
class StepRecord:
    """One step on the engine's clock: ``duration_s`` runs from before ``schedule()`` to after
    ``update()``; ``phases`` splits it into (schedule, execute, sample, update) seconds."""

    step: int
    start_s: float
    duration_s: float
    num_requests: int
    num_tokens: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_sampled: int
    swap_out_blocks: int
    swap_in_blocks: int
    cow_copies: int
    preempted: int
    phases: tuple[float, float, float, float]


@dataclass
class EngineStats:
    preemptions: dict[str, int] = field(default_factory=lambda: {"swap": 0, "recompute": 0})
    cow_copies: int = 0
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    offload_loaded_blocks: int = 0  # offload store -> GPU (CPU-tier prefix hits)
    offload_stored_blocks: int = 0  # GPU -> offload store
    tokens_generated: int = 0


class _SeqTokens:
    """A sequence's tokens (prompt, then outputs) sliced without concatenating the two."""

    __slots__ = ("prompt", "outputs")

    def __init__(self, prompt, outputs):
        self.prompt, self.outputs = prompt, outputs

    def __len__(self) -> int:
        return len(self.prompt) + len(self.outputs)

    def __getitem__(self, sl: slice):
        p = len(self.prompt)
        if sl.stop <= p:
            return self.prompt[sl]
        if sl.start >= p:
            return self.outputs[sl.start - p : sl.stop - p]
        return list(self.prompt[sl.start :]) + self.outputs[: sl.stop - p]


class Engine:
    def __init__(self, model: LlamaForCausalLM, config: SchedulerConfig, *, backend: str = "auto",
                 validate: bool = False, sampling: SamplingParams | None = None, keep_outputs: bool = False,
                 scheduler_cls: type[Scheduler] = Scheduler):
        if config.max_model_len > model.config.max_position_embeddings:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's context "
                             f"({model.config.max_position_embeddings} tokens)")
        expected = scheduler_kv_settings(model.config).get("kv_group_windows", (None,))
        if tuple(config.kv_group_windows) != tuple(expected):
            raise ValueError(f"{model.config.name}'s KV cache has layer groups with windows {expected}, but the "
                             f"scheduler was configured for {config.kv_group_windows} (pass "
                             f"engine.runtime.kv_cache.scheduler_kv_settings(model.config) to make_config)")
        self.model = model
        self.config = config
        self.backend = resolve_engine_backend(backend, model)
        self.validate = validate
        self.sampling = sampling or SamplingParams()
        self.scheduler = scheduler_cls(config)  # a user's Scheduler subclass (--plugin) runs here too
        self.cache = PagedKVCache(model.config, num_gpu_blocks=config.num_gpu_blocks, num_cpu_blocks=config.num_cpu_blocks,
                                  block_size=config.block_size, dtype=model.dtype, device=model.device,
                                  poison=validate, backend=self.backend, num_offload_blocks=config.num_offload_blocks)
        releases = None
        if validate:
            releases = Releases()
            self.scheduler.pool.on_release = releases.gpu.append
            self.scheduler.swap_pool.on_release = releases.cpu.append
            if self.scheduler.offload is not None:
                self.scheduler.offload.store.on_release = releases.offload.append
        self.runner = ModelRunner(model, self.cache, backend=self.backend, releases=releases)
        self.records: dict[str, RequestRecord] = {}
        self.steps: list[StepRecord] = []
        self.stats = EngineStats()
        # Every step's SchedulerOutput, kept when asked (calibration and validation cost them).
        self.outputs: list[SchedulerOutput] | None = [] if keep_outputs else None
        self._requests: dict[str, Request] = {}
        self._params: dict[str, SamplingParams] = {}
        self._beam_scores: dict[str, dict[int, float]] = {}
        self._clock = time.perf_counter
        self._t0 = self._clock()
        self._progress = ProgressWatch()

    # ------------------------------------------------------------ requests
    def now(self) -> float:
        """Seconds since the engine (or the current run) started."""
        return self._clock() - self._t0

    def add_request(self, request: Request, sampling: SamplingParams | None = None, *, arrival_s: float | None = None) -> bool:
        """Queue a request (its ``prompt_token_ids`` are required). ``False`` if the policy rejected
        it (``records[id].reject_reason`` says why); raises for input no engine could run."""
        params = sampling or self.sampling
        rid = request.request_id
        if rid in self.records:
            raise ValueError(f"request id {rid!r} was already added")
        check_request(request, params, self.model.config.vocab_size, self.config.max_model_len)
        self.records[rid] = RequestRecord(rid, self.now() if arrival_s is None else arrival_s, request.prompt_len,
                                          request.n, request.beam_width, release_step=self.scheduler.next_step)
        if not self.scheduler.add_request(request):
            record = self.records[rid]
            record.status, record.reject_reason = "rejected", request.reject_reason or ""
            return False
        self._requests[rid] = request
        self._params[rid] = params
        if request.beam_width > 1:
            self._beam_scores[rid] = {0: 0.0}
        return True

    @property
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests

    def _tokens_of(self, request_id: str, index: int) -> _SeqTokens:
        request = self._requests[request_id]
        return _SeqTokens(request.prompt_token_ids, request.seqs[index].output_token_ids)

    # ---------------------------------------------------------------- step
    def abort_request(self, request_id: str) -> None:
        """Drop an unfinished request (its blocks go back to the policy; its record says so)."""
        if request_id not in self._requests:
            raise ValueError(f"request {request_id!r} is not unfinished in this engine")
        self.scheduler.abort_request(request_id)
        self.records[request_id].status = "aborted"
        self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._params.pop(request_id, None)
        self._beam_scores.pop(request_id, None)

    def step(self) -> list[Request]:
        """Schedule, execute and update once; returns the requests that finished."""
        sched = self.scheduler
        cuda = self.model.device.type == "cuda"
        # Blocks released between steps (an abort) are poisoned now, before this step can reuse them.
        self.runner.poison_released()
        start = self.now()
        out = sched.schedule()
        scheduled = self.now()
        if self.outputs is not None:
            self.outputs.append(out)
        for rid in out.new:
            self.records[rid].first_scheduled_s = start
        for rid, reason in out.rejected.items():  # unservable after all (found at the head of a queue)
            record = self.records[rid]
            if record.status != "rejected":
                record.status, record.reject_reason = "rejected", reason
                self._forget(rid)
        result = self.runner.execute(out, self._tokens_of)
        if cuda:  # so the phases below are device time, not launch time
            torch.cuda.synchronize(self.model.device)
        executed = self.now()
        sampled, choices, beam_scores = self._sample(out, result)
        sampled_at = self.now()
        finished = sched.update(out, sampled, choices)
        for rid, scores in beam_scores.items():
            self._check_beams(rid, scores, choices[rid])
        self.runner.poison_released()
        if cuda:
            torch.cuda.synchronize(self.model.device)
        end = self.now()
        num_sampled = sum(len(v) if isinstance(v, list) else 1 for v in sampled.values())
        phases = (scheduled - start, executed - scheduled, sampled_at - executed, end - sampled_at)
        self._account(out, result, finished, start, end, num_sampled + sum(map(len, choices.values())), phases)
        return finished

    def _sample(self, out: SchedulerOutput, result: StepLogits):
        """Tokens for every sampling sequence: ``({seq_id: token or [tokens]}, beam choices, new beam scores)``."""
        sampled: dict[str, int | list[int]] = {}
        choices: dict[str, list[tuple[int, int]]] = {}
        beam_scores: dict[str, dict[int, float]] = {}
        if result.batch is None or result.logits is None:
            return sampled, choices, beam_scores
        logits = result.logits
        seqs = result.batch.sample_seqs
        greedy_tokens = torch.argmax(logits, dim=-1).tolist()
        beam_rows: dict[str, list[int]] = {}
        for row, s in enumerate(seqs):
            request = self._requests[s.request_id]
            params = self._params[s.request_id]
            if request.beam_width > 1:
                beam_rows.setdefault(s.request_id, []).append(row)
                continue
            seq = request.seqs[s.seq_index]
            position = seq.num_tokens
            if not request.forked and request.n > 1:  # the first sample of each of n
                if params.greedy:
                    sampled[s.seq_id] = [greedy_tokens[row]] * request.n
                else:
                    sampled[s.seq_id] = [sample_token(logits[row], params, s.request_id, k, position) for k in range(request.n)]
            elif params.greedy:
                sampled[s.seq_id] = greedy_tokens[row]
            else:
                sampled[s.seq_id] = sample_token(logits[row], params, s.request_id, s.seq_index, position)
        for rid, rows in beam_rows.items():
            request = self._requests[rid]
            indices = [seqs[r].seq_index for r in rows]
            scores = self._beam_scores[rid]
            logprobs = torch.log_softmax(logits[rows].double(), dim=-1)
            picks = beam_candidates(logprobs, [scores[i] for i in indices], request.beam_width)
            choices[rid] = [(indices[row], token) for row, token, _ in picks]
            new_index = assign_beam_indices([p for p, _ in choices[rid]], len(request.seqs))
            beam_scores[rid] = {idx: score for idx, (_, _, score) in zip(new_index, picks)}
        return sampled, choices, beam_scores

    def _check_beams(self, rid: str, scores: dict[int, float], choices: list[tuple[int, int]]) -> None:
        request = self._requests[rid]
        self._beam_scores[rid] = scores
        for (_, token), idx in zip(choices, scores):
            seq = request.seqs[idx]
            if seq.finish_reason == "pruned" or not seq.output_token_ids or seq.output_token_ids[-1] != token:
                raise ExecutionError(f"request {rid}: beam {idx} does not hold the token the engine chose for it")

    def _account(self, out: SchedulerOutput, result: StepLogits, finished: list[Request], start: float, end: float,
                 num_sampled: int, phases: tuple[float, float, float, float]) -> None:
        stats = self.stats
        for rid, mode in out.preempted:
            stats.preemptions[mode] += 1
            self.records[rid].preemptions += 1
        stats.cow_copies += len(out.blocks_to_copy)
        stats.swap_out_blocks += len(out.blocks_to_swap_out)
        stats.swap_in_blocks += len(out.blocks_to_swap_in)
        stats.offload_loaded_blocks += len(out.blocks_to_load)
        stats.offload_stored_blocks += len(out.blocks_to_store)
        batch = result.batch
        if batch is not None:
            for s in batch.sample_seqs:
                record = self.records[s.request_id]
                if record.first_token_s is None:
                    record.first_token_s = end
                if not record.token_times_s or record.token_times_s[-1] != end:  # once per step per request
                    record.token_times_s.append(end)
        for request in finished:
            record = self.records[request.request_id]
            record.finish_s = end
            record.status = "completed"
            record.outputs = {s.index: [int(t) for t in s.output_token_ids] for s in request.seqs if s.finish_reason != "pruned"}
            record.output_tokens = sum(len(t) for t in record.outputs.values())
            stats.tokens_generated += record.output_tokens
            self._forget(request.request_id)
        self.steps.append(StepRecord(
            step=out.step, start_s=start, duration_s=end - start, num_requests=len(out.num_scheduled_tokens),
            num_tokens=out.total_num_scheduled_tokens,
            num_prefill_tokens=batch.num_prefill_tokens if batch is not None else 0,
            num_decode_seqs=len(batch.decode.seq_lens) if batch is not None and batch.decode is not None else 0,
            num_sampled=num_sampled, swap_out_blocks=len(out.blocks_to_swap_out),
            swap_in_blocks=len(out.blocks_to_swap_in), cow_copies=len(out.blocks_to_copy), preempted=len(out.preempted),
            phases=phases,
        ))
        if self._progress.stalled(out) and self.has_unfinished_requests:
            sched = self.scheduler
            raise EngineStalled(f"step {out.step} scheduled nothing with {len(sched.waiting)} waiting, "
                                f"{len(sched.running)} running and {len(sched.swapped)} swapped requests")

    # ----------------------------------------------------------------- runs
    def run(self, requests: Iterable[Request] | Trace, sampling: SamplingParams | None = None, *, on_finish=None,
            max_concurrency: int | None = None) -> None:
        """Serve ``requests`` (or every row of a ``Trace``, with pseudo-token prompts) against the wall
        clock, each released at its ``arrival_time_s``.

        ``max_concurrency`` makes it a closed loop, as ``vllm bench serve --max-concurrency`` (and the
        simulator's ``sim.client``): a request due while that many are unfinished waits, in arrival
        order, and is released when the step that finishes (or rejects) one ends; its arrival, from
        which TTFT counts, is then that moment."""
        if isinstance(requests, Trace):
            requests = requests.requests(vocab_size=self.model.config.vocab_size)
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        pending = sorted(requests, key=lambda r: r.arrival_time_s)
        self._t0 = self._clock()
        due: deque[Request] = deque()
        # When the latest slot freed while all were taken: a request that waited is sent then. The
        # requests in flight are the unfinished ones the engine holds (``_requests``).
        slot_freed_s = 0.0
        i = 0
        while i < len(pending) or due or self.has_unfinished_requests:
            now = self.now()
            while i < len(pending) and pending[i].arrival_time_s <= now:
                due.append(pending[i])
                i += 1
            while due and (max_concurrency is None or len(self._requests) < max_concurrency):
                request = due.popleft()
                request.arrival_time_s = max(request.arrival_time_s, slot_freed_s)
                self.add_request(request, sampling, arrival_s=request.arrival_time_s)
            if not self.has_unfinished_requests:
                if i < len(pending):  # in short naps (a far-off arrival must not overflow sleep()),
                    # spinning the last millisecond: a sleep overshoots by ~0.1 ms, a TTFT's few percent
                    wait = pending[i].arrival_time_s - self.now()
                    if wait > SPIN_S:
                        time.sleep(min(1.0, wait - SPIN_S))
                continue
            full = max_concurrency is not None and len(self._requests) >= max_concurrency
            finished = self.step()
            if full and len(self._requests) < max_concurrency:
                slot_freed_s = self.steps[-1].start_s + self.steps[-1].duration_s
            if on_finish is not None and finished:
                on_finish(len(finished))

    def run_lockstep(self, requests: Iterable[Request], release_steps: Mapping[str, int] | None = None,
                     sampling: SamplingParams | None = None, *, on_finish=None) -> None:
        """Serve ``requests`` releasing each before the ``schedule()`` of its step (default 0)."""
        release_steps = release_steps or {}
        heap = [(release_steps.get(r.request_id, 0), order, r) for order, r in enumerate(requests)]
        heapq.heapify(heap)
        self._t0 = self._clock()
        while heap or self.has_unfinished_requests:
            step = self.scheduler.next_step
            if not self.has_unfinished_requests and heap:
                step = max(step, heap[0][0])  # idle: the next release comes now
            while heap and heap[0][0] <= step:
                _, _, request = heapq.heappop(heap)
                self.add_request(request, sampling)
            if self.has_unfinished_requests:
                finished = self.step()
                if on_finish is not None and finished:
                    on_finish(len(finished))


def check_request(request: Request, params: SamplingParams, vocab_size: int, max_model_len: int) -> None:
    """Refuse what no engine run could do, with the reason."""
    rid = request.request_id
    ids = request.prompt_token_ids
    if ids is None:
        raise ValueError(f"request {rid}: the engine needs prompt token ids (a trace gives them with vocab_size)")
    bad = next((t for t in ids if not (isinstance(t, int) and 0 <= t < vocab_size)), None)
    if bad is not None:
        raise ValueError(f"request {rid}: token id {bad!r} is outside the model's vocabulary (0..{vocab_size - 1})")
    total = request.prompt_len + request.max_tokens
    if total > max_model_len:
        raise RequestTooLong(f"request {rid}: {request.prompt_len} prompt + {request.max_tokens} output tokens = "
                             f"{total}, more than the context of {max_model_len} tokens")
    if request.beam_width > 1 and not params.greedy:
        raise ValueError(f"request {rid}: beam search is deterministic; temperature applies to sampling only")


def resolve_engine_backend(backend: str, model: LlamaForCausalLM) -> str:
    """``auto``: Triton on CUDA, torch on CPU. float64 needs torch; Triton on CPU needs the interpreter."""
    from kernels.ops import resolve_backend
    from kernels.validate import TRITON_DTYPES

    resolved = resolve_backend("engine", backend, model.device)
    if resolved == "triton" and model.dtype not in TRITON_DTYPES:
        raise ValueError(f"the triton backend takes float32, float16 or bfloat16, not {str(model.dtype).removeprefix('torch.')}")
    return resolved
