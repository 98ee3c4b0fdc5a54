"""The calibrated cost model: a step's time from the tables ``pagesim calibrate`` measured on the
real engine's kernels and code, instead of from peak FLOP/s and bandwidth.

Per step, with ``L`` layers, ``T`` tokens computed, ``S`` sampled rows, ``B`` scheduled sequences
(each table predicted by ``pagesim.sim.cost.interpolate``: multilinear inside the measured grid, the
fitted roofline form outside it):

- ``linear``        = L x dense_layer(T) + model_outer(T) + lm_head(S)
- ``cache_write``   = L x cache_write(T)
- ``decode_attention`` = L x decode_attention(block size, decode seqs, mean decode context)
- ``prefill_attention`` = L x (prefill seqs x prefill_attention(mean chunk tokens, mean cached
  context) + the fitted cost per (query, key) pair x the pairs the mean sequence misses): the
  step's sequences cost about as many mean ones, and unequal chunks hold more attention pairs
  than equal ones (the roofline form's pair term prices the difference)
- ``cow_copy``      = L x cow_copy(block size, blocks)
- ``swap``          = L x (swap_out(block size, out blocks) + swap_in(block size, in blocks)): the
  engine moves them one direction after the other, before the forward pass
- ``sampling``      = sampling(S)
- ``cpu_overhead``  = policy(B) + batch_prep(B): the scheduler's own time and the runner's
  input preparation (a step that computes nothing still pays the policy)

A model with sliding-window layers (``check_model`` learns which) costs those layers' attention at
their windowed context and pairs (``StepWork``'s windowed counts), the others at the full ones.
A contiguous (block-less) cache is costed at the largest block size measured. The model counts,
per table, how many predictions fell outside the measured grid (``extrapolated``), and the
simulator's output says so.
"""

from __future__ import annotations

from collections import Counter

from pagesim.sim.cost.base import TERMS, CostModel, StepCost, StepWork
from pagesim.sim.cost.interpolate import TableModel
from pagesim.sim.cost.profile import TABLES, Profile, ProfileError


class CalibratedCostModel(CostModel):
    name = "calibrated"

    def __init__(self, profile: Profile):
        missing = [t for t in TABLES if t not in profile.tables]
        if missing:
            raise ProfileError(f"{profile.path or 'profile'}: lacks table(s) {', '.join(missing)}")
        self.profile = profile
        self.layers = profile.num_layers
        self.models = {name: TableModel(table) for name, table in profile.tables.items()}
        self.extrapolated: Counter[str] = Counter()
        self._largest_block = max(profile.tables["decode_attention"].grid[0])
        self._pair_s = self.models["prefill_attention"].coef[2]  # fitted seconds per causal (query, key) pair
        self.window_layers = 0  # layers attending through a sliding window (check_model sets it)

    def _t(self, table: str, *point: float) -> float:
        seconds, inside = self.models[table].predict(point)
        if not inside:
            self.extrapolated[table] += 1
        return seconds

    def step_cost(self, work: StepWork) -> StepCost:
        t = self._t
        layers = self.layers
        bs = work.block_size or self._largest_block
        terms = dict.fromkeys(TERMS, 0.0)
        tokens = work.num_tokens
        if tokens:
            terms["linear"] = layers * t("dense_layer", tokens) + t("model_outer", tokens)
            if work.num_sampled:
                terms["linear"] += t("lm_head", work.num_sampled)
            terms["cache_write"] = layers * t("cache_write", tokens)
            terms["cpu_overhead"] = t("batch_prep", work.num_seqs)
        windowed = self.window_layers
        full = layers - windowed
        if work.num_decode_seqs:
            n = work.num_decode_seqs
            terms["decode_attention"] = full * t("decode_attention", bs, n, work.decode_context_tokens / n)
            if windowed:
                terms["decode_attention"] += windowed * t("decode_attention", bs, n,
                                                          work.decode_window_context_tokens / n)
        if work.num_prefill_seqs:
            n = work.num_prefill_seqs
            terms["prefill_attention"] = full * self._prefill_s(
                n, work.num_prefill_tokens, work.prefill_context_tokens, work.prefill_attention_pairs)
            if windowed:
                terms["prefill_attention"] += windowed * self._prefill_s(
                    n, work.num_prefill_tokens, work.prefill_window_context_tokens, work.prefill_window_pairs)
        if work.num_cow_blocks:
            terms["cow_copy"] = layers * t("cow_copy", bs, work.num_cow_blocks)
        if work.num_swap_out_blocks:
            terms["swap"] += layers * t("swap_out", bs, work.num_swap_out_blocks)
        if work.num_swap_in_blocks:
            terms["swap"] += layers * t("swap_in", bs, work.num_swap_in_blocks)
        if work.num_sampled:
            terms["sampling"] = t("sampling", work.num_sampled)
        terms["cpu_overhead"] += t("policy", max(1, work.num_seqs))
        return StepCost(terms)

    def _prefill_s(self, n: int, tokens: int, context: int, pairs: int) -> float:
        """One layer's prefill attention of ``n`` sequences: the mean sequence's time for each, and
        the pairs it misses (unequal chunks have more than n mean ones) at the fitted cost per pair."""
        q, c = tokens / n, context / n
        mean_pairs = q * (c + (q + 1) / 2)
        jensen = self._pair_s * max(0.0, pairs - n * mean_pairs)
        return n * self._t("prefill_attention", q, c) + jensen

    def usage_snapshot(self) -> Counter:
        return Counter(self.extrapolated)

    def restore_usage(self, snapshot: Counter) -> None:
        self.extrapolated.clear()
        self.extrapolated.update(snapshot)

    def describe(self) -> dict:
        p = self.profile
        return {"name": self.name, "profile": p.path, "measured": p.describe(), "model": p.model["name"],
                "dtype": p.model["dtype"], "device": p.device, "interpolation": "multilinear in the measured grid; "
                "fitted roofline form outside it", "extrapolated": dict(self.extrapolated)}

    def check_model(self, preset) -> None:
        """Refuse to cost a model of other shapes than the profile's (``preset``: a ``ModelPreset``)."""
        m = self.profile.model
        differ = self.profile.shape_differences({
            "num_layers": preset.num_layers, "hidden_size": preset.hidden_size,
            "num_heads": preset.num_attention_heads, "num_kv_heads": preset.num_kv_heads, "head_dim": preset.head_dim,
            "intermediate_size": preset.intermediate_size, "vocab_size": preset.vocab_size})
        if differ:
            raise ProfileError(f"the profile {self.profile.path or '(given)'} was measured for {m['name']}; {preset.name} has "
                               f"{', '.join(differ)}: calibrate --model {preset.name}")
        self.window_layers = preset.resolved_layer_types.count("sliding")
        self.attention_window = preset.sliding_window if self.window_layers else None

