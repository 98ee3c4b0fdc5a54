"""Output processing: one executed step's sampled tokens applied to the sequences.

After the executor runs a ``SchedulerOutput``, every sequence whose step ended at its last known
token has sampled one token. This module appends those tokens and, for multi-sequence requests,
grows and prunes the sequence group through the KV manager, so forks and frees always go through
the policy's block accounting:

- **parallel sampling** (``n > 1``): at the first sample, ``n - 1`` children are made as copies of
  the prompt's sequence; each appends its own sample, then the parent appends sample 0; the
  children share all of the parent's blocks (reference count + 1), so the next write into the
  shared, partially filled last block is a copy-on-write (vLLM v0's order: the parent copies
  first, the last holder writes in place);
- **beam search**: the executor names ``beam_width`` (parent sequence, token) choices; a parent
  chosen ``k`` times keeps one and forks ``k - 1`` children before it appends, a parent not chosen
  is freed (``finish_reason = "pruned"``). Without choices (a simulator), every beam continues
  itself, which allocates like parallel sampling;
- a sequence finishes at exactly ``max_tokens`` outputs (EOS is ignored, as benchmark tools do) or
  when it reaches ``max_model_len`` (vLLM v1's rule), and its blocks are released at once.

Invariant: a request is finished when all of its sequences are; children carry consecutive
indices after the parent's, in fork order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence as SequenceT
from typing import cast

from pagesim.engine.policy.memory.kv_manager import KVCacheManager
from pagesim.engine.policy.scheduling.output import ScheduledSequence, SchedulerOutput
from pagesim.engine.policy.scheduling.request import Request, RequestStatus, Sequence

Token = int | None
#: Sampled tokens: ``{seq_id: token}`` (``{seq_id: [token per sample]}`` at a first sample with
#: n > 1), or a function ``(sequence, sample_index) -> token``, or ``None`` for unnamed tokens.
SampledTokens = Mapping[str, Token | SequenceT[Token]] | Callable[[Sequence, int], Token] | None
#: Beam search: ``{request_id: [(parent sequence index, token), ...]}``, one pair per beam.
BeamChoices = Mapping[str, SequenceT[tuple[int, Token]]]


class OutputProcessor:
    def __init__(self, kv: KVCacheManager, *, max_model_len: int):
        self.kv = kv
        self.max_model_len = max_model_len
        self.num_seqs_finished = 0  # sequences retired so far (finished or pruned)
        # Told each finished sequence and why; True: its blocks are held, not freed (a P/D prefill
        # instance's, pagesim/engine/policy/disagg/connector.py). None: every one is freed.
        self.hold_finished: Callable[[Sequence, str], bool] | None = None

    def process(
        self,
        output: SchedulerOutput,
        requests: Mapping[str, Request],
        sampled: SampledTokens = None,
        beam_choices: BeamChoices | None = None,
    ) -> list[Request]:
        """Apply the step's samples; returns the requests that finished, marked ``FINISHED``."""
        finished: list[Request] = []
        by_request: dict[str, list[ScheduledSequence]] = {}
        for s in output.scheduled:
            if s.samples:
                by_request.setdefault(s.request_id, []).append(s)
        for request_id, sampling in by_request.items():
            request = requests.get(request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted since
            all_seqs = request.seqs
            if request.beam_width > 1:
                seqs = [all_seqs[s.seq_index] for s in sampling]
                self._apply_beam(request, seqs, sampled, (beam_choices or {}).get(request_id))
            elif not request.forked and request.n > 1:
                self._fork_samples(request, all_seqs[sampling[0].seq_index], sampled)
            else:
                for s in sampling:
                    seq = all_seqs[s.seq_index]
                    self._append(seq, None if sampled is None else sampled_token(sampled, seq, 0))
            if not request.live_seqs:
                request.status = RequestStatus.FINISHED
                finished.append(request)
        return finished

    def _append(self, seq: Sequence, token: Token) -> None:
        seq.output_token_ids.append(token)
        reason = finish_reason(seq, self.max_model_len)
        if reason is not None:
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.num_seqs_finished += 1
        hold = self.hold_finished
        if hold is None or not hold(seq, reason):
            self.kv.free(seq, final=True)
        seq.request.retire_seq(seq, reason)

    def _fork_samples(self, request: Request, parent: Sequence, sampled: SampledTokens) -> None:
        """The first sample of an n > 1 request: children are copies of the prompt's sequence that
        share its blocks; each appends its own sample, then the parent appends sample 0 (vLLM v0)."""
        request.forked = True
        children = []
        for k in range(1, request.n):
            child = parent.fork(index=len(request.seqs))
            request.add_seq(child)
            self._append(child, sampled_token(sampled, parent, k))
            children.append(child)
        # NOTE: the children share the parent's blocks before the parent appends: with samples of
        # their own lengths (``sample_max_tokens``) the parent may stop here while they go on.
        for child in children:
            if not child.finished:
                self.kv.fork(parent, child)
        self._append(parent, sampled_token(sampled, parent, 0))

    def _apply_beam(
        self,
        request: Request,
        seqs: list[Sequence],
        sampled: SampledTokens,
        choices: SequenceT[tuple[int, Token]] | None,
    ) -> None:
        """Beam search: keep ``beam_width`` (parent, token) choices. A parent chosen k times keeps
        one and forks k-1 children (sharing its blocks); parents not chosen are freed."""
        width = request.beam_width
        if choices is None:  # no model choices: every beam continues itself (like parallel samples)
            if not request.forked:
                choices = [(seqs[0].index, sampled_token(sampled, seqs[0], k)) for k in range(width)]
            else:
                choices = [(s.index, sampled_token(sampled, s, 0)) for s in seqs]
        if len(choices) != width:
            raise ValueError(
                f"request {request.request_id!r}: {len(choices)} beam choices for beam width {width}"
            )
        alive = {s.index: s for s in seqs}
        for parent_index, _ in choices:
            if parent_index not in alive:
                raise ValueError(
                    f"request {request.request_id!r}: beam choice names sequence {parent_index}, "
                    f"which did not sample this step"
                )
        request.forked = True
        first_choice: dict[int, Token] = {}
        children: list[tuple[Sequence, Sequence, Token]] = []
        for parent_index, token in choices:
            if parent_index not in first_choice:
                first_choice[parent_index] = token
            else:
                parent = alive[parent_index]
                child = parent.fork(index=len(request.seqs))
                request.add_seq(child)
                self.kv.fork(parent, child)
                children.append((parent, child, token))
        for index, seq in alive.items():
            if index not in first_choice:
                self._finish(seq, "pruned")
        for _, child, token in children:
            self._append(child, token)
        for index, token in first_choice.items():
            self._append(alive[index], token)


def finish_reason(seq: Sequence, max_model_len: int) -> str | None:
    """Why ``seq`` stops after its latest token: ``"length"`` at its output length (EOS ignored),
    ``"max_model_len"`` at the model's limit (vLLM v1's rule), else ``None``."""
    # NOTE: Request.max_tokens_of and Sequence.num_tokens inlined: this runs for every sample.
    request = seq.request
    num_outputs = len(seq.output_token_ids)
    lens = request.sample_max_tokens
    if num_outputs >= (request.max_tokens if lens is None else lens[seq.index]):
        return "length"
    if request.prompt_len + num_outputs >= max_model_len:
        return "max_model_len"
    return None


def sampled_token(sampled: SampledTokens, seq: Sequence, sample_index: int) -> Token:
    """The executor's token for sample ``sample_index`` of ``seq`` (``None`` if it names none)."""
    if sampled is None:
        return None
    if callable(sampled):
        return sampled(seq, sample_index)
    value = sampled.get(seq.seq_id)
    if isinstance(value, (list, tuple)):
        return value[sample_index]
    return cast(Token, value)
