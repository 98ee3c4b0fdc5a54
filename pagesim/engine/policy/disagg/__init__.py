"""Disaggregated prefill and decode: the scheduler's side of vLLM's P/D KV connector.

A prefill instance computes a request's prompt and keeps its KV blocks until a decode instance
has read them; the decode instance allocates its own blocks, parks the request while the KV
moves, then decodes. ``PdConnector`` (``connector.py``) is both roles of vLLM 0.33's
``NixlConnector`` scheduler side, chosen per request by its transfer parameters
(``params.py``), as vLLM chooses them by ``kv_transfer_params``. The executor (the simulator's
network, the engine's tensor copy) moves the blocks and reports each transfer done.
"""

from pagesim.engine.policy.disagg.connector import PdConnector
from pagesim.engine.policy.disagg.params import KV_LEASE_S, KvReceive, KvSend, RemoteDecode, RemotePrefill

__all__ = ["KV_LEASE_S", "KvReceive", "KvSend", "PdConnector", "RemoteDecode", "RemotePrefill"]
