"""Replaying vLLM's own scheduling decisions (``shared/oracle``) through pagesim's presets.

A workload spec (``spec.py``) is run with the oracle's step loop and fake token stream
(``replay.py``), and each step's ``SchedulerOutput`` is written in the oracle's canonical record
format for that vLLM version, so it can be compared with the golden log line for line
(``pagesim oracle replay`` / ``pagesim oracle compare``, ``cli.py``). Pure Python, like the policy.
"""

from pagesim.engine.oracle.replay import ReplayResult, fake_token, oracle_record, replay
from pagesim.engine.oracle.spec import VERSION_PRESETS, OracleRequest, OracleSpec, load_spec

__all__ = [
    "VERSION_PRESETS",
    "OracleRequest",
    "OracleSpec",
    "ReplayResult",
    "fake_token",
    "load_spec",
    "oracle_record",
    "replay",
]
