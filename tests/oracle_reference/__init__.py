"""Independent reference reading of ``shared/oracle/README.md`` sections 1-5.

Written from the README text alone (no pagesim ``engine`` code, no vLLM code): given a spec dict in
the README §1 format it returns the decision log of README §3 as a list of dicts.  It exists to be
compared with the golden vLLM logs and, differentially, with pagesim's ``vllm-v1`` / ``vllm-v0``
presets.

Layout:

* :func:`replay_reference` (here) -- the §2 step loop, shared by both versions.
* ``v1.py``: :class:`V1Scheduler` (with :class:`V1BlockPool`) -- README §4, vLLM 0.32 v1.
* ``v0.py``: :class:`V0Scheduler` (with :class:`V0BlockStack`, :class:`V0Budget`) -- README §5, vLLM 0.6.3 v0.
* ``common.py``: the §2 token stream, ``cdiv`` and the early-stop exceptions.

Where the README leaves something open, the chosen (most literal) reading is marked ``AMBIGUITY``.
"""

from __future__ import annotations

from tests.oracle_reference.common import StepLimitExceeded, SwapSpaceExhausted, cdiv, sampled_token
from tests.oracle_reference.v0 import V0Scheduler
from tests.oracle_reference.v1 import V1Scheduler

__all__ = ["StepLimitExceeded", "SwapSpaceExhausted", "cdiv", "replay_reference", "sampled_token"]


def replay_reference(spec: dict, max_steps: int | None = None) -> list[dict]:
    """README §2: the step loop. Returns one §3 record per step.

    For each step: add that step's arrivals (list order); if nothing is waiting/running/swapped the
    record is idle and ``schedule()`` is not called; otherwise schedule, read the decision fields,
    run the fake model and process outputs. The loop ends after the last arrival step once nothing
    is left unfinished. With ``max_steps`` set, :class:`StepLimitExceeded` is raised beyond it.
    """
    version = spec["vllm_version"]
    if version == "0.32.0":
        sched: V1Scheduler | V0Scheduler = V1Scheduler(spec["config"])
    elif version == "0.6.3":
        sched = V0Scheduler(spec["config"])
    else:
        raise ValueError(f"unsupported vllm_version {version!r}")

    arrivals: dict[int, list[dict]] = {}
    for req in spec["requests"]:
        arrivals.setdefault(req["arrival_step"], []).append(req)
    last_arrival = max(arrivals, default=-1)

    records: list[dict] = []
    step = 0
    while step <= last_arrival or sched.has_unfinished():
        if max_steps is not None and step >= max_steps:
            raise StepLimitExceeded(f"still unfinished after {max_steps} steps")
        for req in arrivals.get(step, []):
            sched.add_request(req)
        if sched.has_unfinished():
            records.append(sched.step(step))
        else:
            records.append(sched.idle_record(step))
        step += 1
    return records
