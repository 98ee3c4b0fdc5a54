"""From trace rows to the policy's ``Request`` objects, with the seeded choices a trace leaves open.

A trace fixes each request's arrival, prompt, output length and ``n`` / beam width. Two things
real sampling would decide are drawn here, from one ``numpy`` generator seeded by the run's seed
(so the same seed gives the same run):

- **parallel-sample lengths** (``sample_lengths="drawn"``, the default): sample 0 keeps the
  trace's output length and samples 1..n-1 draw theirs from the trace's own output-length column
  (the workload's empirical distribution), so samples end at different steps and free their
  blocks early, as they do when EOS is honoured; ``"same"`` keeps the trace's length for every
  sample (what benchmark tools that ignore EOS do);
- **beam survival** (``BeamModel``): each step every beam slot keeps its own beam with
  probability ``stay_prob`` and otherwise continues from a beam drawn uniformly among the live
  ones, so forks (shared blocks, then copy-on-write) and pruned beams (freed blocks) happen as in
  real beam search. Choices are made only in steps where all of a request's live beams sample.

Requests are built lazily, one at arrival, so a trace of millions of rows costs arrays.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pagesim.engine.policy import Request, SchedulerOutput
from pagesim.engine.policy.scheduling.sampling import BeamChoices
from pagesim.traces.trace import Trace

SAMPLE_LENGTHS = ("drawn", "same")


class RequestFactory:
    def __init__(self, trace: Trace, *, seed: int, sample_lengths: str = "drawn"):
        if sample_lengths not in SAMPLE_LENGTHS:
            raise ValueError(f"sample lengths must be one of {SAMPLE_LENGTHS}, got {sample_lengths!r}")
        self.trace = trace
        self.sample_lengths = sample_lengths
        self._rng = np.random.default_rng([seed, 1])
        self._n = trace.n
        self._output_len = trace.output_len

    def make(self, i: int) -> Request:
        n = int(self._n[i])
        if n > 1 and self.sample_lengths == "drawn":
            drawn = self._output_len[self._rng.integers(0, len(self._output_len), size=n - 1)]
            return self.trace.request(i, sample_max_tokens=(int(self._output_len[i]), *(int(x) for x in drawn)))
        return self.trace.request(i)


class BeamModel:
    """Seeded choice of which beams survive a step (see the module docstring). Each replica of a
    cluster draws from its own stream (``replica``; replica 0's is the single-replica one), so a
    replica's draws do not depend on how the others' steps interleave with its own."""

    def __init__(self, seed: int, stay_prob: float = 0.8, *, replica: int = 0):
        if not 0.0 <= stay_prob <= 1.0:
            raise ValueError(f"beam stay probability must be in [0, 1], got {stay_prob!r}")
        self.stay_prob = stay_prob
        self._rng = np.random.default_rng([seed, 2] if replica == 0 else [seed, 2, replica])

    def choices(self, output: SchedulerOutput, requests: Mapping[str, Request]) -> BeamChoices | None:
        sampling: dict[str, list[int]] = {}
        for s in output.scheduled:
            if s.samples:
                request = requests.get(s.request_id)
                if request is not None and request.beam_width > 1 and request.forked:
                    sampling.setdefault(s.request_id, []).append(s.seq_index)
        if not sampling:
            return None
        rng = self._rng
        result = {}
        for request_id, indices in sampling.items():
            request = requests[request_id]
            if len(indices) != len(request.live_seqs) or len(indices) != request.beam_width:
                continue  # some beams are not sampling this step: each continues itself
            stays = rng.random(len(indices)) < self.stay_prob
            picks = rng.integers(0, len(indices), size=len(indices))
            result[request_id] = [
                (index if stay else indices[pick], None) for index, stay, pick in zip(indices, stays, picks)
            ]
        return result or None
