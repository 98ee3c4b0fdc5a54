"""Carrying out one ``SchedulerOutput`` on tensors, exactly and in order.

0. in validation mode, **poison** the offload slots the step's stores evicted (never a slot this
   step loads from: those are pinned); then the **offload stores of finished requests** (the last
   ``num_finished_stores`` of ``blocks_to_store``: blocks of requests that finished before this
   step, freed since and not yet poisoned; this step's forward pass may write one that was
   reallocated, so they are copied first);
1. **swap out** ``blocks_to_swap_out`` (GPU -> CPU);
2. in validation mode, **poison** the GPU blocks the policy released since the last step's forward pass (they were
   read by step 1 if they were swapped out; whoever got them next writes them from step 3 on);
3. **swap in** ``blocks_to_swap_in`` (CPU -> GPU), then poison the CPU blocks released;
4. **offload loads** ``blocks_to_load`` (offload store -> GPU: a prefix hit on the CPU tier, read
   by this step's forward pass, or, for a request parked while it loads, by a later one);
5. **copy-on-write** ``blocks_to_copy``;
6. the **forward pass** over the step's tokens (K/V written into their slots, paged prefill and
   decode attention), returning the logits of the sequences that sample;
7. **offload stores** ``blocks_to_store`` (GPU -> offload store: blocks the forward pass just
   filled; an evicted slot the store reuses was poisoned in step 0 and is written here).

A CPU block that is both the destination of this step's swap-out and the source of its swap-in,
or an offload slot both loaded from and stored to, would make the order above wrong; the policy
never does either, and the runner refuses them rather than corrupt memory. CPU blocks and
offload slots released by ``Scheduler.update`` are poisoned before the next step, GPU blocks in
its step 2 (a finished request's last stores read them in step 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagesim.engine.model.llama import LlamaForCausalLM
from pagesim.engine.policy import SchedulerOutput
from pagesim.engine.runtime.attention import PagedAttention
from pagesim.engine.runtime.batch import StepBatch, TokensOf, build_batch
from pagesim.engine.runtime.kv_cache import PagedKVCache


class ExecutionError(RuntimeError):
    """A scheduler output the runner cannot carry out faithfully, or (validation mode) output that
    read memory the policy had released."""


class Releases:
    """Blocks the policy released and the cache has not yet poisoned (fed by the pools' hooks)."""

    def __init__(self) -> None:
        self.gpu: list[int] = []
        self.cpu: list[int] = []
        self.offload: list[int] = []  # offload-store slots (evicted keys)

    @staticmethod
    def drain(ids: list[int]) -> list[int]:
        """The ids so far, emptying the list in place (the pools hold its ``append``)."""
        out = list(ids)
        ids.clear()
        return out


@dataclass(slots=True)
class StepLogits:
    batch: StepBatch | None
    logits: torch.Tensor | None  # [S, vocab] for batch.sample_seqs


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, cache: PagedKVCache, *, backend: str, releases: Releases | None = None):
        self.model = model
        self.cache = cache
        self.backend = backend
        self.releases = releases  # set in validation mode

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput, tokens_of: TokensOf) -> StepLogits:
        cache = self.cache
        swap_out, swap_in = list(output.blocks_to_swap_out), list(output.blocks_to_swap_in)
        clash = {cpu for _, cpu in swap_out} & {cpu for cpu, _ in swap_in}
        if clash:
            raise ExecutionError(f"step {output.step}: CPU block(s) {sorted(clash)} are both swapped out to and "
                                 f"swapped in from in one step")
        loads, stores = list(output.blocks_to_load), list(output.blocks_to_store)
        clash = {slot for slot, _ in loads} & {slot for _, slot in stores}
        if clash:
            raise ExecutionError(f"step {output.step}: offload slot(s) {sorted(clash)} are both loaded from and "
                                 f"stored to in one step")
        split = len(stores) - output.num_finished_stores
        stores, finished_stores = stores[:split], stores[split:]
        self._poison_offload()  # (slots the stores evicted: a slot being loaded is pinned, never evicted)
        cache.offload_store(finished_stores)
        cache.swap_out(swap_out)
        self._poison_gpu()
        cache.swap_in(swap_in)
        self._poison_cpu()
        cache.offload_load(loads)
        cache.copy(list(output.blocks_to_copy))
        batch = build_batch(output, tokens_of, cache.device, len(cache.layout.groups))
        if batch is None:
            cache.offload_store(stores)
            return StepLogits(None, None)
        attention = PagedAttention(cache, batch, backend=self.backend)
        hidden = self.model.hidden_states(batch.input_ids, batch.positions, attention)
        logits = self.model.logits(hidden[batch.sample_rows]) if batch.sample_seqs else None
        if self.releases is not None and logits is not None and not bool(torch.isfinite(logits).all()):
            bad = [s.seq_id for s, ok in zip(batch.sample_seqs, torch.isfinite(logits).all(dim=1).tolist()) if not ok]
            raise ExecutionError(f"step {output.step}: logits of {', '.join(bad[:5])} are not finite: attention "
                                 f"read KV memory the policy had released (validation mode)")
        cache.offload_store(stores)
        return StepLogits(batch, logits)

    def poison_released(self, *, gpu: bool = False) -> None:
        """Poison what was released outside ``schedule()`` (by ``update`` or an abort), but GPU
        blocks: the next step may store a finished request's blocks first (``execute``, step 0).
        ``gpu``: GPU blocks too, for a caller that knows no store reads them (a P/D prefill
        instance freeing a send between steps: the connector excludes offloading)."""
        self._poison_cpu()
        self._poison_offload()
        if gpu:
            self._poison_gpu()

    def _poison_gpu(self) -> None:
        if self.releases is not None:
            self.cache.poison_gpu(Releases.drain(self.releases.gpu))

    def _poison_cpu(self) -> None:
        if self.releases is not None:
            self.cache.poison_cpu(Releases.drain(self.releases.cpu))

    def _poison_offload(self) -> None:
        if self.releases is not None:
            self.cache.poison_offload(Releases.drain(self.releases.offload))
