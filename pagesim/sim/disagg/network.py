"""The network a disaggregated deployment's KV moves over: placement, links and contention.

**Placement.** Replicas take GPUs in order, prefill pool first, then decode, ``tp`` GPUs each,
on nodes of ``gpus_per_node`` GPUs (8: an HGX/DGX board); a replica never straddles two nodes
(it starts on the next node if it would). Two replicas on one node move KV over **NVLink** (the
GPU preset's peer link, one direction); otherwise over **RDMA** (the scale-out NIC each GPU of
an HGX/DGX system has, ``NIC_BYTES_PER_S``). GPUs without a peer link (PCIe cards) use PCIe
within a node, as their preset's ``interconnect_bytes_per_s`` says.

**A transfer** (one request's read: vLLM 0.33's NIXL ``READ`` by the decode instance) moves
``num_blocks`` of the decode side's KV blocks. With tensor parallelism every rank reads its own
shard over its own link, so a transfer between replicas of ``tp_p`` and ``tp_d`` GPUs runs on
``min(tp_p, tp_d)`` links at once. It takes ``latency_s + bytes / bandwidth``.

**Contention.** Each replica has a send port and a receive port per link kind (SimPy resources of
capacity 1: a NIC, or a GPU's NVLink, is full duplex and moves one transfer at a time each way).
A transfer holds the sender's send port and the receiver's receive port for its whole duration;
it takes the send port first, then the receive port (one global order, so transfers never wait
on each other in a cycle). Transfers that share a port queue in the order they asked.

Figures are peak link rates (``--kv-link-bandwidth`` sets one for every link, GB/s per GPU and
direction); the latency (``--kv-link-latency-us``) is an assumption, not a measurement: NIXL's
per-read overhead on a given system is what a user should put there.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import simpy

from pagesim.sim.hardware import GB, GpuPreset

#: Scale-out NIC bandwidth per GPU, one direction, by GPU preset: the NIC each GPU of the reference
#: system has (DGX A100: ConnectX-6 HDR 200 Gb/s; DGX H100/H200 and HGX B200: ConnectX-7 400 Gb/s;
#: MI300X platforms: 400 Gb/s). PCIe cards (L4, L40S, H100 PCIe/NVL) have no reference system:
#: 100 Gb/s, common on cloud instances. ``--kv-link-bandwidth`` overrides.
NIC_BYTES_PER_S: dict[str, float] = {
    "a100-40gb": 25 * GB, "a100-80gb": 25 * GB, "h100-sxm": 50 * GB, "h200": 50 * GB, "h20": 50 * GB,
    "b200": 50 * GB, "mi300x": 50 * GB, "h100-pcie": 12.5 * GB, "h100-nvl": 12.5 * GB, "l4": 12.5 * GB,
    "l40s": 12.5 * GB,
}
DEFAULT_NIC_BYTES_PER_S = 12.5 * GB
#: Per-transfer latency, seconds: an assumption (see the module docstring).
LATENCY_S = {"nvlink": 10e-6, "rdma": 30e-6}
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Link:
    kind: str  # "nvlink" or "rdma"
    bytes_per_s: float  # all the links a transfer uses together
    latency_s: float

    def seconds(self, num_bytes: int) -> float:
        return self.latency_s + num_bytes / self.bytes_per_s


@dataclass(frozen=True)
class NetworkSpec:
    """How the network is described: ``bandwidth_bytes_per_s`` (per GPU and direction) and
    ``latency_s`` override every link's preset figures; ``None``: the presets'."""

    gpus_per_node: int = GPUS_PER_NODE
    bandwidth_bytes_per_s: float | None = None
    latency_s: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ValueError(f"--gpus-per-node must be an integer >= 1, got {self.gpus_per_node!r}")
        bw = self.bandwidth_bytes_per_s
        if bw is not None and not 0 < bw < float("inf"):
            raise ValueError(f"--kv-link-bandwidth must be a positive number of GB/s, got {bw / GB if bw == bw else bw!r} "
                             f"(a link that moves nothing cannot carry the KV of a disaggregated deployment)")
        if self.latency_s is not None and not 0 <= self.latency_s < float("inf"):
            raise ValueError(f"--kv-link-latency-us must be a finite number >= 0, got {self.latency_s * 1e6!r}")


def place(tps: list[int], gpus_per_node: int) -> list[int]:
    """The node of each replica (``tps``: GPUs per replica, in placement order)."""
    nodes = []
    gpu = 0
    for tp in tps:
        if tp > gpus_per_node:
            raise ValueError(f"a replica of {tp} GPUs does not fit a node of {gpus_per_node} (--gpus-per-node)")
        if gpu // gpus_per_node != (gpu + tp - 1) // gpus_per_node:
            gpu = (gpu // gpus_per_node + 1) * gpus_per_node  # (never across two nodes)
        nodes.append(gpu // gpus_per_node)
        gpu += tp
    return nodes


class KvNetwork:
    """The links between replicas (indices in placement order) and their ports."""

    def __init__(self, env: simpy.Environment, gpus: list[GpuPreset], tps: list[int], spec: NetworkSpec):
        if len(gpus) != len(tps):
            raise ValueError("one GPU preset per replica")
        self.env = env
        self.spec = spec
        self.gpus = gpus
        self.tps = tps
        self.nodes = place(tps, spec.gpus_per_node)
        self._ports: dict[tuple[int, str, str], simpy.Resource] = {}
        self.num_transfers = 0
        self.bytes_moved = 0
        self.busy_s = {"nvlink": 0.0, "rdma": 0.0}
        self.transfers_by_kind = {"nvlink": 0, "rdma": 0}
        self.wait_s = 0.0  # time transfers queued for a port

    def link(self, src: int, dst: int) -> Link:
        kind = "nvlink" if self.nodes[src] == self.nodes[dst] else "rdma"
        lanes = min(self.tps[src], self.tps[dst])
        spec = self.spec
        if spec.bandwidth_bytes_per_s is not None:
            per_gpu = spec.bandwidth_bytes_per_s
        elif kind == "nvlink":
            per_gpu = min(self.gpus[src].interconnect_bytes_per_s, self.gpus[dst].interconnect_bytes_per_s)
        else:
            per_gpu = min(NIC_BYTES_PER_S.get(self.gpus[src].name, DEFAULT_NIC_BYTES_PER_S),
                          NIC_BYTES_PER_S.get(self.gpus[dst].name, DEFAULT_NIC_BYTES_PER_S))
        latency = LATENCY_S[kind] if spec.latency_s is None else spec.latency_s
        return Link(kind, per_gpu * lanes, latency)

    def _port(self, replica: int, kind: str, direction: str) -> simpy.Resource:
        key = (replica, kind, direction)
        port = self._ports.get(key)
        if port is None:
            port = self._ports[key] = simpy.Resource(self.env, capacity=1)
        return port

    def transfer(self, src: int, dst: int, num_bytes: int, entry=None) -> Generator:
        """A SimPy process body: move ``num_bytes`` from replica ``src`` to ``dst`` (``entry``, if
        given, gets ``began_s``: when it got both ports)."""
        env = self.env
        link = self.link(src, dst)
        asked = env.now
        seconds = link.seconds(num_bytes)
        with self._port(src, link.kind, "send").request() as send:
            yield send
            with self._port(dst, link.kind, "recv").request() as recv:
                yield recv
                self.wait_s += env.now - asked
                if entry is not None:
                    entry.began_s = env.now
                yield env.timeout(seconds)
        self.num_transfers += 1
        self.bytes_moved += num_bytes
        self.busy_s[link.kind] += seconds
        self.transfers_by_kind[link.kind] += 1

    def summary(self, duration_s: float) -> dict:
        kinds = sorted({self.link(p, d).kind for p in range(len(self.tps)) for d in range(len(self.tps))
                        if p != d}) if len(self.tps) > 1 else []
        return {
            "transfers": self.num_transfers, "bytes": self.bytes_moved,
            "bytes_per_s": self.bytes_moved / duration_s if duration_s > 0 else None,
            "transfers_by_link": dict(self.transfers_by_kind),
            "link_busy_s": {k: round(v, 6) for k, v in self.busy_s.items()},
            "port_wait_s": round(self.wait_s, 6),
            "nodes": max(self.nodes) + 1 if self.nodes else 0, "gpus_per_node": self.spec.gpus_per_node,
            "link_kinds": kinds,
            "bandwidth_override_bytes_per_s": self.spec.bandwidth_bytes_per_s,
        }
