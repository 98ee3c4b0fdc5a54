"""Routers: which replica of a cluster serves an arriving request.

A router sees the replicas' schedulers (the policy's own state, as a real router would learn it
from each engine's load report) and the arriving ``Request``, and returns a replica index. It
changes nothing: probing a scheduler takes no reference, moves no block and leaves the request as
it was, so a replica's decisions depend only on which requests it was given and when.

Rules (N replicas, indices 0..N-1; every tie goes to the lowest index):

- ``round-robin``: the k-th routed request goes to replica ``k mod N``.
- ``least-outstanding-tokens``: fewest ``outstanding_tokens`` (below): the work a replica still
  owes its unfinished requests, in tokens.
- ``least-kv``: fewest KV-cache slots allocated now (``kv_used_slots``). Queued requests hold
  none, so requests arriving together, before a step, all see the same counts and go to the
  same replica: the rule balances memory, not queues.
- ``prefix-affinity``: the replica whose prefix cache holds the longest cached prefix of the
  request's prompt (ties: fewer outstanding tokens, then lower index), unless no replica holds
  any of it or that replica is *overloaded*; then ``least-outstanding-tokens``. A replica is
  overloaded when its outstanding tokens exceed the least-loaded replica's both by more than
  ``affinity_slack_tokens`` (default 4096) and by more than a factor ``affinity_slack`` (default
  1.5): the form of SGLang's cache-aware router (``balance_abs_threshold`` /
  ``balance_rel_threshold``), in tokens rather than requests. With prefix caching off every
  cached prefix is empty and the rule is exactly ``least-outstanding-tokens``. The cache is the
  replica's real one (blocks registered as they are scheduled), so requests arriving before
  the first of their group is scheduled find nothing cached yet.

Adding a router is one small class with a ``name`` and a ``route`` method, put in ``ROUTERS``
(and ``reads_state = False`` if it never looks at the schedulers).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence as SequenceT

from pagesim.engine.policy.scheduling.request import Request, Sequence


def request_outstanding_tokens(request: Request) -> int:
    """Tokens ``request`` still needs, as its scheduler knows it: prompt tokens not yet computed
    (``prompt_len`` minus the furthest any live sequence has computed, at least 0; a sequence
    preempted by recompute starts again at 0) plus output tokens still to generate (each live
    sequence's own limit minus its outputs, and, before the fork, the other ``n - 1`` samples' or
    beams' whole limits). Outputs to be recomputed after a preemption are not counted."""
    live = request.live_seqs
    lens = request.sample_max_tokens
    if len(live) == 1:  # NOTE: the common case, spelled out: this runs per request per arrival
        seq = live[0]
        limit = request.max_tokens if lens is None else lens[seq.index]
        tokens = max(0, request.prompt_len - seq.num_computed_tokens) + limit - len(seq.output_token_ids)
    elif live:
        tokens = max(0, request.prompt_len - max(seq.num_computed_tokens for seq in live))
        tokens += sum(request.max_tokens_of(seq) - len(seq.output_token_ids) for seq in live)
    else:
        return 0
    extra = max(request.n, request.beam_width) - 1
    if extra and not request.forked:
        tokens += sum(lens[1:]) if lens is not None else extra * request.max_tokens
    return tokens


def outstanding_tokens(scheduler) -> int:
    """``request_outstanding_tokens`` summed over the scheduler's unfinished requests (waiting,
    running or swapped). O(unfinished requests). The running sequences are read directly, so a
    scheduler that lets them lag (``Scheduler.settle``) settles them first."""
    settle = getattr(scheduler, "settle", None)
    if settle is not None:
        settle()
    return sum(request_outstanding_tokens(r) for r in scheduler.requests.values())


def kv_used_slots(scheduler) -> int:
    """KV-cache slots in blocks held by some sequence now (cached, unreferenced blocks are free):
    O(1) for the paged pool; the contiguous baselines' reserved slabs otherwise."""
    pool = getattr(scheduler, "pool", None)
    if getattr(scheduler, "paged", True) and pool is not None:
        return pool.num_used_blocks * scheduler.block_size
    return scheduler.kv_usage().allocated_slots


def cached_prefix_tokens(scheduler, request: Request) -> int:
    """Prompt tokens of ``request`` that ``scheduler``'s prefix cache would serve if it were
    admitted now (0 without a prefix cache). Probes with a fresh copy of the request's first
    sequence, so the request's own key chain is never rewritten to another replica's keys."""
    kv = getattr(scheduler, "kv", None)
    if kv is None or not getattr(scheduler, "paged", True) or not kv.enable_prefix_caching:
        return 0
    return len(kv.find_cached_prefix(Sequence(request, index=0))) * kv.block_size


def _least(values: SequenceT[int]) -> int:
    return min(range(len(values)), key=lambda k: (values[k], k))


class Router:
    """Picks a replica for each request; ``route`` is called once per request, in arrival order.
    ``reads_state``: whether ``route`` looks at the schedulers (then each replica must be, at every
    arrival, exactly where step-by-step simulation would have it: ``Replica.observed``)."""

    name = "router"
    reads_state = True

    def route(self, request: Request, schedulers: SequenceT) -> int:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name}


class RoundRobin(Router):
    name = "round-robin"
    reads_state = False

    def __init__(self):
        self._next = 0

    def route(self, request: Request, schedulers: SequenceT) -> int:
        k = self._next % len(schedulers)
        self._next = k + 1
        return k


class LeastOutstandingTokens(Router):
    name = "least-outstanding-tokens"

    def route(self, request: Request, schedulers: SequenceT) -> int:
        return _least([outstanding_tokens(s) for s in schedulers])


class LeastKv(Router):
    name = "least-kv"

    def route(self, request: Request, schedulers: SequenceT) -> int:
        return _least([kv_used_slots(s) for s in schedulers])


class PrefixAffinity(Router):
    name = "prefix-affinity"

    def __init__(self, affinity_slack: float = 1.5, affinity_slack_tokens: int = 4096):
        if not 1.0 <= affinity_slack < float("inf"):
            raise ValueError(f"--affinity-slack must be a finite factor >= 1, got {affinity_slack}")
        if affinity_slack_tokens < 0:
            raise ValueError(f"--affinity-slack-tokens must be >= 0, got {affinity_slack_tokens}")
        self.affinity_slack = affinity_slack
        self.affinity_slack_tokens = affinity_slack_tokens

    def overloaded(self, load: int, least_load: int) -> bool:
        return load - least_load > self.affinity_slack_tokens and load > self.affinity_slack * least_load

    def route(self, request: Request, schedulers: SequenceT) -> int:
        loads = [outstanding_tokens(s) for s in schedulers]
        hits = [cached_prefix_tokens(s, request) for s in schedulers]
        least = _least(loads)
        best = min(range(len(schedulers)), key=lambda k: (-hits[k], loads[k], k))
        if hits[best] == 0 or self.overloaded(loads[best], loads[least]):
            return least
        return best

    def describe(self) -> dict:
        return {"name": self.name, "affinity_slack": self.affinity_slack,
                "affinity_slack_tokens": self.affinity_slack_tokens}


ROUTERS: dict[str, type[Router]] = {r.name: r for r in (RoundRobin, LeastOutstandingTokens, LeastKv, PrefixAffinity)}


def make_router(name: str, **params) -> Router:
    """A fresh router by name; ``params`` go to its constructor (``prefix-affinity``'s slack)."""
    cls = ROUTERS.get(name)
    if cls is None:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    unknown = sorted(set(params) - set(inspect.signature(cls).parameters))
    if unknown:
        raise ValueError(f"router {name!r} takes no {', '.join(unknown)}")
    return cls(**params)
