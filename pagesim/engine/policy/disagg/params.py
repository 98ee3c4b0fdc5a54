"""What travels with a disaggregated request: vLLM's ``kv_transfer_params``, and the transfers.

vLLM 0.33's proxy (``examples/online_serving/disaggregated_serving/``) sends a request to a
prefill instance with ``kv_transfer_params = {"do_remote_decode": True}`` and ``max_tokens`` 1
(``RemoteDecode``); the prefill instance answers with the parameters the decode instance needs
to read its blocks (``do_remote_prefill``, ``remote_block_ids``, ``remote_engine_id``, ...:
``RemotePrefill``), and the proxy sends the original request on to a decode instance with them.

``KvSend`` is a prefill instance's record of blocks it holds for a reader; ``KvReceive`` a decode
instance's record of one read: which remote blocks go into which of its own blocks, for which
token range.
"""

from __future__ import annotations

from dataclasses import dataclass

#: vLLM 0.33's NIXL KV lease (``kv_connector_extra_config["kv_lease_duration"]``, default 30 s;
#: ``nixl/base_scheduler.py``): a prefill instance frees held blocks no decode instance has read
#: within it. The decode instance renews it (a heartbeat every 5 s, +20 s each) from the moment it
#: gets the request until its read is done, so it runs out only for a request no decode
#: instance took.
KV_LEASE_S = 30.0


@dataclass(frozen=True, slots=True)
class RemoteDecode:
    """``do_remote_decode``: this instance prefills; another decodes (the proxy sets ``max_tokens`` 1)."""


@dataclass(frozen=True, slots=True)
class RemotePrefill:
    """``do_remote_prefill``: the prompt's KV is read from ``engine``'s blocks ``block_ids``
    (those its request ``request_id`` held, in table order, ``block_size`` tokens each), which
    hold the first ``num_tokens`` tokens of the prompt."""

    engine: int
    request_id: str
    block_ids: tuple[int, ...]
    block_size: int
    num_tokens: int

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.num_tokens < 1:
            raise ValueError(f"remote prefill of {self.request_id!r}: block_size and num_tokens must be >= 1")
        if len(self.block_ids) != -(-self.num_tokens // self.block_size):
            raise ValueError(f"remote prefill of {self.request_id!r}: {len(self.block_ids)} blocks cannot hold exactly "
                             f"{self.num_tokens} tokens of {self.block_size}")


@dataclass(frozen=True, slots=True)
class KvSend:
    """Blocks a prefill instance holds for a reader: its request's table when it finished."""

    request_id: str
    block_ids: tuple[int, ...]
    num_tokens: int

    def params(self, engine: int, block_size: int) -> RemotePrefill:
        """The ``kv_transfer_params`` the decode instance gets (``engine``: this instance)."""
        return RemotePrefill(engine, self.request_id, self.block_ids, block_size, self.num_tokens)


@dataclass(frozen=True, slots=True)
class KvReceive:
    """One read a decode instance makes: tokens ``[first_token, num_tokens)`` of ``request_id``'s
    prompt, from ``source``'s blocks ``remote_blocks`` (those covering the range, in order) into
    this instance's ``local_blocks`` (likewise). ``first_token`` is where its own prefix-cache hit
    ends, so the read skips the blocks it already holds (vLLM's worker trims ``remote_block_ids``
    to the local blocks it fills)."""

    request_id: str
    source: RemotePrefill
    remote_blocks: tuple[int, ...]
    local_blocks: tuple[int, ...]
    first_token: int
    num_tokens: int
    step: int  # the step that parked the request

    @property
    def num_read_tokens(self) -> int:
        return self.num_tokens - self.first_token

    def to_record(self) -> dict:
        return {"from": self.source.engine, "remote_request": self.source.request_id,
                "remote_blocks": list(self.remote_blocks), "local_blocks": list(self.local_blocks),
                "tokens": [self.first_token, self.num_tokens]}
