"""A victim policy of one's own: preempt the request with the most output still to generate.

When a running request needs a block and none is free, the scheduler preempts a victim. vLLM takes
the request admitted last (``running-tail``), whatever its progress: a request one token from its
end may lose its blocks and recompute its whole prompt, though it would have freed them itself a
step later. This policy instead preempts the request with the most output tokens left (over its
live samples), so those close to finishing run on and return their memory; ties go to the latest
arrival, as in vLLM. It reads ``max_tokens``, which pagesim's engine honours exactly (EOS ignored,
as benchmark tools do); a production server only knows it as an upper bound.

Use it with ``--plugin examples/most_remaining_victim.py:MostRemainingVictim --victim most-remaining``
(see examples/README.md).
"""

from collections.abc import Sequence

from pagesim.engine.policy.scheduling.preemption import VictimPolicy
from pagesim.engine.policy.scheduling.request import Request


def remaining_tokens(request: Request) -> int:
    """Output tokens its live samples still have to generate (the longest of them)."""
    return max(request.max_tokens_of(s) - s.num_output_tokens for s in request.live_seqs)


class MostRemainingVictim(VictimPolicy):
    name = "most-remaining"  # what --victim (or a study's victim axis) calls it

    def choose(self, candidates: Sequence[Request]) -> Request:
        # candidates: the running requests not yet scheduled this step; never empty.
        return max(candidates, key=lambda r: (remaining_tokens(r), r.arrival_time_s, r.admitted_seq_no))
