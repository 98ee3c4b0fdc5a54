"""Both roles of vLLM 0.33's P/D connector, scheduler side (``NixlConnector``'s
``NixlConnectorScheduler`` in ``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``,
"NC" below), as one object per instance: a request's transfer parameters choose its role.

**Prefill role** (``RemoteDecode``: ``do_remote_decode``):

- Its prompt is computed as any request's, with the local prefix cache (NC
  ``get_num_new_matched_tokens`` finds no external tokens for it). Its blocks join the prefix
  cache as they are computed, as every request's do.
- When it finishes by length (vLLM's ``FINISHED_LENGTH_CAPPED``, at ``max_tokens`` or the
  model's length; the proxy sends it with ``max_tokens`` 1), its blocks are **held**, not freed (NC ``request_finished`` returns
  ``delay_free_blocks``; the scheduler's ``_free_request`` keeps them): ``hold`` records a
  ``KvSend`` (the first ``cdiv(computed, block_size)`` blocks of its table, a partial last one
  included, and the tokens they hold). A request that ends otherwise (aborted, rejected) frees
  its blocks at once and sends nothing.
- The blocks are freed (``release``) when the decode instance reports its read done (the
  worker's ``finished_sending``, after the read's notification), when the decode instance drops
  the request before reading (its notify-only receive), or when the KV lease
  (``KV_LEASE_S``) runs out with no decode instance holding the request; the executor decides
  which and calls ``release`` at a step boundary (vLLM's ``update_from_output`` frees
  ``finished_sending`` last, for the next ``schedule()``).

**Decode role** (``RemotePrefill``: ``do_remote_prefill``):

- At the head of the waiting queue, after its local prefix hit (``num_computed``), every other
  prompt token is external (NC ``get_num_new_matched_tokens``: ``len(prompt) - num_computed``,
  loaded asynchronously). The scheduler allocates blocks for the whole prompt and parks the
  request (``WAITING_FOR_REMOTE_KVS``, ``Request.loading`` here); ``receive`` records the read:
  the remote blocks from the local hit on into the new local blocks (NC
  ``update_state_after_alloc``; the worker trims ``remote_block_ids`` to the blocks it fills).
  The parameters are then spent (NC sets ``do_remote_prefill`` False): a request preempted
  later recomputes its prompt locally.
- The executor reads the blocks and reports the read done (``complete``; the worker's
  ``finished_recving``); at the next ``schedule()`` the request is promoted as an offload load
  is: its blocks join the prefix cache and, all its tokens being there, the last one is computed
  again, which samples its first output token (the scheduler's ``_update_waiting_for_remote_kv``).

**Aborts.** A decode request aborted while its read is in flight keeps its blocks until the read
is reported done, then frees them (vLLM's ``finish_requests`` delays the free of a
``WAITING_FOR_REMOTE_KVS`` request; ``_update_from_kv_xfer_finished`` frees it on
``finished_recving``): the read is still writing into them. An abort of a request whose send is
held changes nothing (it has finished).

Invariants: every held send is freed exactly once (``release`` of a send already freed is a
no-op that says so); a parked request is never scheduled (the waiting pass skips it until
``load_done``); a receive reported done for a request no longer here is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.engine.policy.disagg.params import KvReceive, KvSend, RemoteDecode, RemotePrefill
from pagesim.engine.policy.scheduling.request import Request, Sequence


@dataclass(slots=True)
class _Held:
    send: KvSend
    seq: Sequence



class PdConnector:
    def __init__(self, kv, block_size: int):
        self.kv = kv
        self.block_size = block_size
        self._remote_decode: set[str] = set()  # prefill role, not finished yet
        self._remote_prefill: dict[str, RemotePrefill] = {}  # decode role, not yet allocated
        self._held: dict[str, _Held] = {}  # prefill role: finished, blocks held for a reader
        self._receiving: dict[str, KvReceive] = {}  # decode role: reads not reported done
        self._new_sends: list[KvSend] = []  # held since the executor last took them
        self._freed: list[str] = []  # sends freed since the last schedule()
        self._done: list[str] = []  # reads reported done since the last schedule()
        self._step_receives: list[KvReceive] = []  # reads the step being scheduled issued
        self._local_hit: dict[str, int] = {}  # read requests not admitted yet -> their local hit, tokens
        self._aborted_reads: dict[str, Sequence] = {}  # aborted while their read runs: freed when it ends
        self.num_sent_blocks = 0  # blocks held for readers, over the run
        self.num_received_blocks = 0  # blocks read into this instance, over the run
        self.num_received_tokens = 0
        self.num_expired = 0  # sends freed by the timeout, not by a read

    # ------------------------------------------------------------ requests
    def accept(self, request: Request, params: RemoteDecode | RemotePrefill) -> None:
        """Take ``request``'s transfer parameters (before it is queued)."""
        rid = request.request_id
        if request.n > 1 or request.beam_width > 1:
            raise ValueError(f"request {rid!r}: disaggregated serving runs one sequence per request "
                             f"(vLLM's proxy sends each sample as its own request); got n={request.n}, "
                             f"beam_width={request.beam_width}")
        if isinstance(params, RemoteDecode):
            self._remote_decode.add(rid)
        elif isinstance(params, RemotePrefill):
            if params.num_tokens != request.prompt_len:
                raise ValueError(f"request {rid!r}: the remote blocks hold {params.num_tokens} tokens, "
                                 f"its prompt has {request.prompt_len}")
            self._remote_prefill[rid] = params
        else:
            raise TypeError(f"kv_transfer must be RemoteDecode or RemotePrefill, got {type(params).__name__}")

    def forget(self, request: Request) -> None:
        """``request`` left without finishing normally (aborted, rejected): nothing is held for it.
        If its read is in flight, its blocks (the caller did not free them: ``defers_free``) are
        freed when the read is reported done."""
        rid = request.request_id
        self._remote_decode.discard(rid)
        self._remote_prefill.pop(rid, None)
        if self._receiving.pop(rid, None) is not None:
            self._aborted_reads[rid] = request.live_seqs[0] if request.live_seqs else request.seqs[0]
        self._local_hit.pop(rid, None)

    def defers_free(self, request: Request) -> bool:
        """Whether ``request``'s blocks must outlive its abort (a read is writing into them)."""
        return request.request_id in self._receiving

    # --------------------------------------------------------- prefill role
    def hold(self, seq: Sequence, reason: str) -> bool:
        """``seq`` just finished with ``reason``: whether its blocks are held for a reader (then
        the caller must not free them). Only a remote-decode request finished by length is."""
        request = seq.request
        rid = request.request_id
        if rid not in self._remote_decode:
            return False
        self._remote_decode.discard(rid)
        if reason not in ("length", "max_model_len"):  # (vLLM: FINISHED_LENGTH_CAPPED; pagesim samples no stop token)
            return False
        num_tokens = seq.num_computed_tokens
        blocks = tuple(seq.block_table[:-(-num_tokens // self.block_size)])
        send = KvSend(rid, blocks, num_tokens)
        self._held[rid] = _Held(send, seq)
        self._new_sends.append(send)
        self.num_sent_blocks += len(blocks)
        return True

    def take_sends(self) -> list[KvSend]:
        """The sends held since the last call, in the order their requests finished."""
        sends, self._new_sends = self._new_sends, []
        return sends

    def held_keys(self, request_id: str) -> list:
        """The block keys the held request computed (content keys: any cache of its block size
        would compute the same; an executor may hand them on rather than have them made again)."""
        return self._held[request_id].seq.block_keys

    def held_blocks(self, request_id: str) -> tuple[int, ...]:
        return self._held[request_id].send.block_ids

    def is_held(self, request_id: str) -> bool:
        return request_id in self._held

    def release(self, request_id: str, *, expired: bool = False) -> bool:
        """The reader is done with ``request_id``'s blocks (``expired``: the timeout passed
        instead): free them. ``False`` if they were freed already (a read reported after the
        timeout freed them, or the reverse)."""
        held = self._held.pop(request_id, None)
        if held is None:
            return False
        self.kv.free(held.seq, final=True)
        self._freed.append(request_id)
        self.num_expired += expired
        return True

    # ---------------------------------------------------------- decode role
    def remote_prefill_of(self, request: Request) -> RemotePrefill | None:
        """The blocks ``request`` is still to read (``None``: none, or read already)."""
        return self._remote_prefill.get(request.request_id) if self._remote_prefill else None

    def receive(self, seq: Sequence, first_block: int, step: int) -> KvReceive:
        """``seq``'s table holds its local hit (``first_block`` blocks) and fresh blocks for the
        rest of its prompt: record the read that fills them and spend its parameters."""
        request = seq.request
        params = self._remote_prefill.pop(request.request_id)
        bs, rbs = self.block_size, params.block_size
        first = first_block * bs
        end = params.num_tokens
        remote = params.block_ids[first // rbs:-(-end // rbs)]
        local = tuple(seq.block_table[first_block:-(-end // bs)])
        read = KvReceive(request.request_id, params, tuple(remote), local, first, end, step)
        self._receiving[request.request_id] = read
        self._local_hit[request.request_id] = first
        self._step_receives.append(read)
        self.num_received_blocks += len(local)
        self.num_received_tokens += end - first
        return read

    def complete(self, request_id: str) -> bool:
        """The executor reports ``request_id``'s read done; ``False`` if it is no longer expected."""
        if self._receiving.pop(request_id, None) is None:
            seq = self._aborted_reads.pop(request_id, None)
            if seq is not None:  # (aborted while it ran: its blocks go now)
                self.kv.free(seq, final=True)
            return False
        self._done.append(request_id)
        return True

    def local_hit_tokens(self, request: Request, computed: int) -> int:
        """The prefix hit ``request``'s admission counts: its local hit if it read its prompt
        (the tokens it read are not a hit), else ``computed``."""
        return self._local_hit.pop(request.request_id, computed) if self._local_hit else computed

    def load_done(self, request: Request) -> bool:
        """Whether ``request`` has no read in flight."""
        return request.request_id not in self._receiving

    @property
    def has_work(self) -> bool:
        """Reads in flight (the executor will report them)."""
        return bool(self._receiving or self._aborted_reads)

    def receiving(self) -> list[KvReceive]:
        return list(self._receiving.values())

    # ------------------------------------------------------------- records
    def begin_step(self) -> None:
        self._step_receives = []

    def output_fields(self) -> dict:
        """This step's ``SchedulerOutput`` fields: its reads, and the sends freed and reads
        reported done since the last step."""
        fields = dict(kv_receives=tuple(self._step_receives), kv_freed=tuple(self._freed),
                      kv_received=tuple(self._done))
        self._freed = []
        self._done = []
        return fields

    def held_sends(self) -> list[KvSend]:
        return [h.send for h in self._held.values()]

    def held_seqs(self) -> list[Sequence]:
        """The sequences holding blocks outside the scheduler's requests (held sends, aborted reads)."""
        return [h.seq for h in self._held.values()] + list(self._aborted_reads.values())
