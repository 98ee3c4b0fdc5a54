"""Timing each profile table at one grid point, on the engine's own code and kernels.

``Bench`` holds a one-layer model of the calibrated model's shapes (random weights; embedding,
final norm and vocabulary projection at full size) in the dtype, on the device and with the
attention backend the engine would use. Every ``time_<table>(point)`` returns ``repeats``
samples (seconds) after ``warmup`` untimed ones; on CUDA each timed span is bracketed by
synchronisation, so a sample is launch plus device time. ``summarize_samples`` gives a point's
median and interquartile range, as the profile and its probe keep them.

Where each table is timed:
- ``dense_layer``, ``model_outer``, ``cache_write``, ``decode_attention``, ``prefill_attention``,
  ``lm_head``: as segments of a real forward pass over a synthetic step of the point's shape
  (``build_batch`` on a ``SchedulerOutput``, the model's own modules, ``pagesim.kernels.ops`` called as
  ``PagedAttention`` calls them), because an operation timed alone in a tight loop runs with
  warm caches: on this CPU small operations ran up to 1.7x faster that way than inside a step;
- ``cow_copy``, ``swap_out``, ``swap_in``: ``PagedKVCache``'s own methods, each call after a
  small forward pass;
- ``policy``, ``sampling``, ``batch_prep``: a real ``Engine`` (the one-layer model) with the
  point's number of requests decoding: its recorded step phases (schedule + update, sample) and
  ``build_batch`` on each step's output.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from pagesim.engine.model.config import LlamaConfig
from pagesim.engine.policy.scheduling.output import ScheduledSequence, SchedulerOutput
from pagesim.engine.model.weights import random_model
from pagesim.kernels import paged_decode_attention, paged_prefill_attention, write_kv_cache


def summarize_samples(samples: list[float]) -> tuple[float, float]:
    """(median, interquartile range) of one grid point's samples."""
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return float(med), float(q3 - q1)


class Bench:
    def __init__(self, config: LlamaConfig, *, dtype: torch.dtype, device: torch.device, backend: str,
                 warmup: int, repeats: int, seed: int = 0):
        self.config = config
        self.layer_config = replace(config, num_layers=1)
        self.dtype, self.device, self.backend = dtype, device, backend
        self.warmup, self.repeats = warmup, repeats
        self.model = random_model(self.layer_config, seed=seed, dtype=dtype, device=device)
        self.scale = config.head_dim ** -0.5
        self._gen = torch.Generator(device="cpu").manual_seed(seed)
        self._steady: dict[int, dict[str, list[float]]] = {}
        self._token_ids: list[int] = []
        self._caches: dict = {}  # block size -> the largest one-layer PagedKVCache made so far
        self._between: Callable[[], object] | None = None

    # ------------------------------------------------------------ helpers
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _time(self, fn: Callable[[], object]) -> list[float]:
        """Samples of ``fn``, each after a small forward pass (untimed), as a step runs it amid others."""
        between = self._between
        if between is None:
            between = self._between = self._forward([(15, 1)] * 4)
        for _ in range(self.warmup):
            between()
            fn()
        self._sync()
        samples = []
        clock = time.perf_counter
        for _ in range(self.repeats):
            between()
            self._sync()
            start = clock()
            fn()
            self._sync()
            samples.append(clock() - start)
        return samples

    # ------------------------------------------- a forward pass, segment by segment
    def _output(self, seqs: list[tuple[int, int]], block_size: int) -> tuple[SchedulerOutput, int]:
        """A scheduler output computing ``(cached, new)`` tokens for each sequence, block tables
        scattered over a cache just large enough; returns it and the cache's block count."""
        need = [-(-(cached + new) // block_size) for cached, new in seqs]
        num_blocks = sum(need) + 1
        ids = torch.randperm(num_blocks, generator=self._gen).tolist()
        scheduled, at = [], 0
        for i, ((cached, new), n) in enumerate(zip(seqs, need)):
            scheduled.append(ScheduledSequence(f"c{i}", 0, cached, new, tuple(ids[at:at + n]), block_size, True))
            at += n
        counts = {s.request_id: s.num_new_tokens for s in scheduled}
        empty: dict = {}
        out = SchedulerOutput(0, tuple(scheduled), counts, empty, empty, (), (), empty, (), (), (), 0, 0, 0)
        return out, num_blocks

    def _tokens_of(self, request_id: str, index: int) -> list[int]:
        return self._token_ids

    def _forward(self, seqs: list[tuple[int, int]], block_size: int = 16) -> Callable[[], dict[str, float]]:
        """A function running the one-layer model's forward pass over a step computing ``seqs``
        (``(cached, new)`` each), the way ``ModelRunner.execute`` runs it (``build_batch``, the
        model's modules, ``PagedAttention``'s kernel calls), returning each segment's seconds:
        ``outer`` (embedding, rotary angles, final norm), ``dense`` (the layer without attention),
        ``cache_write``, ``prefill``, ``decode`` and ``lm_head``. Timed inside a real pass, each
        operation runs amid the others as it does in a step (timed alone in a loop, small CPU
        operations ran up to 1.7x faster here, their caches warm)."""
        from pagesim.engine.runtime.batch import build_batch
        from pagesim.engine.runtime.kv_cache import PagedKVCache

        output, num_blocks = self._output(seqs, block_size)
        longest = max(cached + new for cached, new in seqs)
        if len(self._token_ids) < longest:
            self._token_ids = torch.randint(0, self.config.vocab_size, (longest,), generator=self._gen).tolist()
        cache = self._caches.get(block_size)
        if cache is None or cache.num_gpu_blocks < num_blocks:  # grown as needed, reused otherwise
            self._caches.pop(block_size, None)
            cache = self._caches[block_size] = PagedKVCache(
                self.layer_config, num_gpu_blocks=num_blocks, num_cpu_blocks=0, block_size=block_size,
                dtype=self.dtype, device=self.device, backend=self.backend)
        batch = build_batch(output, self._tokens_of, self.device)
        m, sync, clock, backend = self.model, self._sync, time.perf_counter, self.backend
        key_cache, value_cache = cache.key_caches[0], cache.value_caches[0]
        scale = self.scale

        @torch.inference_mode()
        def run() -> dict[str, float]:
            t = {"cache_write": 0.0, "prefill": 0.0, "decode": 0.0}

            def attention(layer, q, k, v):  # engine.runtime.attention.PagedAttention, with a clock per kernel
                sync()
                t0 = clock()
                write_kv_cache(k, v, key_cache, value_cache, batch.slot_mapping, backend=backend)
                sync()
                t1 = clock()
                t["cache_write"] += t1 - t0
                split, parts = batch.num_prefill_tokens, []
                if batch.prefill is not None:
                    g = batch.prefill
                    parts.append(paged_prefill_attention(q[:split], key_cache, value_cache, g.block_tables,
                                                         g.query_start_loc, g.seq_lens, scale, backend=backend,
                                                         max_query_len=g.max_query_len))
                    sync()
                    t2 = clock()
                    t["prefill"] += t2 - t1
                    t1 = t2
                if batch.decode is not None:
                    g = batch.decode
                    parts.append(paged_decode_attention(q[split:], key_cache, value_cache, g.block_tables, g.seq_lens,
                                                        scale, backend=backend, max_context_len=g.max_seq_len))
                    sync()
                    t["decode"] += clock() - t1
                return parts[0] if len(parts) == 1 else torch.cat(parts)

            sync()
            t0 = clock()  # LlamaForCausalLM.hidden_states, then logits, with clocks between
            x = m.model.embed_tokens(batch.input_ids)
            cos_sin = m.rotary.cos_sin(batch.positions, x.dtype)
            sync()
            t1 = clock()
            for i, layer in enumerate(m.model.layers):
                x = x + layer.self_attn(i, layer.input_layernorm(x), cos_sin, attention)
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            sync()
            t2 = clock()
            h = m.model.norm(x)
            sync()
            t3 = clock()
            m.logits(h[batch.sample_rows])
            sync()
            t4 = clock()
            kernels = t["cache_write"] + t["prefill"] + t["decode"]
            return {**t, "outer": (t1 - t0) + (t3 - t2), "dense": (t2 - t1) - kernels, "lm_head": t4 - t3}

        return run

    def _segment(self, seqs: list[tuple[int, int]], segment: str, block_size: int = 16) -> list[float]:
        run = self._forward(seqs, block_size)
        for _ in range(self.warmup):
            run()
        return [run()[segment] for _ in range(self.repeats)]

    # ------------------------------------------------------------- tables
    def time_dense_layer(self, point) -> list[float]:
        return self._segment([(0, int(point[0]))], "dense")

    def time_model_outer(self, point) -> list[float]:
        return self._segment([(0, int(point[0]))], "outer")

    def time_cache_write(self, point) -> list[float]:
        return self._segment([(0, int(point[0]))], "cache_write")

    def time_lm_head(self, point) -> list[float]:
        return self._segment([(15, 1)] * int(point[0]), "lm_head")

    def time_decode_attention(self, point) -> list[float]:
        block_size, seqs, context = map(int, point)
        return self._segment([(context - 1, 1)] * seqs, "decode", block_size)

    def time_prefill_attention(self, point) -> list[float]:
        tokens, context = map(int, point)
        # one new token goes to the decode kernel in the engine's batch, whatever StepWork calls it
        return self._segment([(context, tokens)], "prefill" if tokens > 1 else "decode")

    def _paged_cache(self, block_size: int, blocks: int):
        from pagesim.engine.runtime.kv_cache import PagedKVCache

        return PagedKVCache(self.layer_config, num_gpu_blocks=2 * blocks, num_cpu_blocks=blocks, block_size=block_size,
                            dtype=self.dtype, device=self.device, backend=self.backend)

    @torch.inference_mode()
    def time_cow_copy(self, point) -> list[float]:
        block_size, blocks = map(int, point)
        cache = self._paged_cache(block_size, blocks)
        pairs = [(i, blocks + i) for i in range(blocks)]
        return self._time(lambda: cache.copy(pairs))

    @torch.inference_mode()
    def time_swap_out(self, point) -> list[float]:
        block_size, blocks = map(int, point)
        cache = self._paged_cache(block_size, blocks)
        pairs = [(2 * i, i) for i in range(blocks)]  # every other GPU block: not one contiguous range
        return self._time(lambda: cache.swap_out(pairs))

    @torch.inference_mode()
    def time_swap_in(self, point) -> list[float]:
        block_size, blocks = map(int, point)
        cache = self._paged_cache(block_size, blocks)
        pairs = [(i, 2 * i) for i in range(blocks)]
        return self._time(lambda: cache.swap_in(pairs))

    # --------------------------------------- steady decoding on an engine
    def _steady_state(self, seqs: int) -> dict[str, list[float]]:
        """Run a real engine (the one-layer model) with ``seqs`` requests decoding and return, per
        timed step, its policy time (schedule + update), sampling time, and ``build_batch`` time."""
        if seqs in self._steady:
            return self._steady[seqs]
        from pagesim.engine.policy import Request, make_config
        from pagesim.engine.runtime.batch import build_batch
        from pagesim.engine.runtime.engine import Engine

        steps = self.warmup + self.repeats
        prompt, block_size = 8, 16
        max_len = prompt + steps + 3
        config = make_config("pagesim", block_size=block_size, max_model_len=max_len, max_num_seqs=max(seqs, 1),
                             num_gpu_blocks=seqs * (-(-max_len // block_size)) + 2, num_cpu_blocks=0,
                             max_num_batched_tokens=max(2048, seqs * prompt))
        engine = Engine(self.model, config, backend=self.backend, keep_outputs=True)
        vocab = self.config.vocab_size
        for r in range(seqs):
            ids = torch.randint(0, vocab, (prompt,), generator=self._gen).tolist()
            engine.add_request(Request(request_id=f"c{r}", prompt_len=prompt, max_tokens=steps + 2,
                                       prompt_token_ids=ids))
        engine.step()  # every prompt in one step; the rest are decode steps of all seqs
        policy, sampling, prep = [], [], []
        for i in range(steps):
            engine.step()
            out = engine.outputs[-1]
            start = time.perf_counter()
            build_batch(out, engine._tokens_of, self.device)
            self._sync()
            elapsed = time.perf_counter() - start
            if i >= self.warmup:
                schedule, _, sample, update = engine.steps[-1].phases
                policy.append(schedule + update)
                sampling.append(sample)
                prep.append(elapsed)
        result = {"policy": policy, "sampling": sampling, "batch_prep": prep}
        self._steady[seqs] = result  # policy, sampling and batch_prep share each run
        return result

    def time_policy(self, point) -> list[float]:
        return self._steady_state(int(point[0]))["policy"]

    def time_sampling(self, point) -> list[float]:
        return self._steady_state(int(point[0]))["sampling"]

    def time_batch_prep(self, point) -> list[float]:
        return self._steady_state(int(point[0]))["batch_prep"]
