"""Swapping blocks between GPU caches and the CPU swap space: batched index copies in torch.

Per cache tensor (one per layer and K/V), one step's blocks are gathered on the source device into
one staging tensor, moved in a single transfer and scattered on the destination: one copy per
tensor per direction rather than one per block. Host staging is pinned when a CUDA device is
involved, so transfers run at DMA speed and asynchronously: swap-in uploads are queued on the
current stream (later kernels see the data in stream order); swap-out queues every download and
waits once before scattering into the host cache. On CPU-only runs it is a plain copy. Like vLLM's
``swap_blocks``, the block mapping is ``[num_pairs, 2]`` of (source block, destination block).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagesim.kernels.validate import _Checker, check_block_mapping


def swap_blocks(src_caches: Sequence[torch.Tensor], dst_caches: Sequence[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Copy block ``src`` of every ``src_caches[i]`` into block ``dst`` of ``dst_caches[i]``."""
    c = _Checker("swap_blocks")
    if not isinstance(src_caches, (list, tuple)) or not isinstance(dst_caches, (list, tuple)):
        raise c.fail("src_caches and dst_caches must be lists of cache tensors")
    if len(src_caches) != len(dst_caches) or not src_caches:
        raise c.fail(f"need pairs of caches, got {len(src_caches)} sources and {len(dst_caches)} destinations")
    for i, (s, d) in enumerate(zip(src_caches, dst_caches)):
        c.tensor(f"src_caches[{i}]", s, ndim=4)
        c.tensor(f"dst_caches[{i}]", d, ndim=4)
        c.same_dtype(f"dst_caches[{i}]", d, f"src_caches[{i}]", s)
        if s.shape[1:] != d.shape[1:]:
            raise c.fail(f"src_caches[{i}] blocks are {tuple(s.shape[1:])} but dst_caches[{i}] blocks are {tuple(d.shape[1:])}")
        if s.device != src_caches[0].device or d.device != dst_caches[0].device:
            raise c.fail("all source caches must share one device, and all destination caches one device")
    mapping = check_block_mapping(
        c, block_mapping, num_src=src_caches[0].shape[0], num_dst=dst_caches[0].shape[0]
    )
    if mapping.shape[0] == 0:
        return
    src_device, dst_device = src_caches[0].device, dst_caches[0].device
    src_ids = mapping[:, 0].long().to(src_device)
    dst_ids = mapping[:, 1].long().to(dst_device)
    pairs = list(zip(src_caches, dst_caches))
    if src_device == dst_device or "cpu" not in (src_device.type, dst_device.type):
        for src, dst in pairs:
            dst.index_copy_(0, dst_ids, src.index_select(0, src_ids).to(dst_device))
    elif src_device.type == "cpu":
        _swap_in(pairs, src_ids, dst_ids, pin=dst_device.type == "cuda")
    else:
        _swap_out(pairs, src_ids, dst_ids, pin=src_device.type == "cuda")


def _swap_in(pairs, src_ids, dst_ids, *, pin: bool) -> None:
    """Host -> device: gather into pinned staging on the host, upload asynchronously, scatter there."""
    for src, dst in pairs:
        staged = torch.empty((len(src_ids), *src.shape[1:]), dtype=src.dtype, pin_memory=pin)
        torch.index_select(src, 0, src_ids, out=staged)
        dst.index_copy_(0, dst_ids, staged.to(dst.device, non_blocking=pin))


def _swap_out(pairs, src_ids, dst_ids, *, pin: bool) -> None:
    """Device -> host: gather on the device, download every tensor asynchronously, wait once, scatter."""
    staged = []
    for src, _ in pairs:
        gathered = src.index_select(0, src_ids)
        host = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=pin)
        host.copy_(gathered, non_blocking=pin)
        staged.append(host)
    if pin:
        torch.cuda.current_stream(pairs[0][0].device).synchronize()
    for host, (_, dst) in zip(staged, pairs):
        dst.index_copy_(0, dst_ids, host)
