"""An independent reading of ``shared/oracle/README.md`` (``tests/oracle_reference.py``, written
from the README alone) checked twice:

* against the golden vLLM decision logs, which validates the reading itself;
* differentially against pagesim's ``vllm-v1`` / ``vllm-v0`` presets (``pagesim.engine.oracle.replay``) on
  random workloads inside the README's scope, which looks for decisions the 30 golden cases do not
  pin down.
"""

from __future__ import annotations

import json
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, example, given, note, settings
from hypothesis import strategies as st

from pagesim.engine.oracle import load_spec, replay
from pagesim.engine.policy import DecisionLog
from tests.conftest import ORACLE_README_CASES as CASES, golden_log, scaled_examples
from tests.oracle_reference import (
    StepLimitExceeded,
    SwapSpaceExhausted,
    cdiv,
    replay_reference,
    sampled_token,
)

def describe(label_a: str, a: list[dict], label_b: str, b: list[dict]) -> str:
    diff = DecisionLog(a).first_difference(DecisionLog(b))
    if diff is None:
        return "identical"
    i, ra, rb = diff
    keys = sorted(set(ra or {}) | set(rb or {}))
    fields = [k for k in keys if (ra or {}).get(k) != (rb or {}).get(k)]
    return (f"first difference at step {i} (lengths {len(a)} vs {len(b)}), fields {fields}\n"
            f"  {label_a}: {json.dumps(ra, sort_keys=True)}\n"
            f"  {label_b}: {json.dumps(rb, sort_keys=True)}")


# ------------------------------------------------------------------ (a) the golden vLLM logs
def case_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name.split('.')[0]}"


@pytest.mark.skipif(not CASES, reason="shared/oracle is absent")
@pytest.mark.parametrize("spec_path", CASES, ids=case_id)
def test_reference_reproduces_vllm_golden_logs(spec_path):
    spec = json.loads(spec_path.read_text())
    ours = replay_reference(spec)
    gold = DecisionLog.read_jsonl(golden_log(spec_path)).records
    assert ours == gold, describe("reference", ours, "vLLM", gold)


# ------------------------------------------------------------------ (b) reference vs pagesim
TOKENS = st.integers(100, 9999)
ARRIVALS = st.one_of(st.integers(0, 2), st.integers(0, 10))  # bunched arrivals contend more


@st.composite
def oracle_specs(draw, pool_share: float = 0.5) -> dict:
    """A workload inside README §1/§6 scope that neither implementation rejects: every request
    fits ``max_model_len`` and, with all its sequences at full length, ``pool_share`` of the usable
    pool (after the watermark); v0 swap space covers every sequence of every request unshared."""
    v1 = draw(st.booleans())
    block_size = draw(st.sampled_from([2, 4, 8]))
    num_blocks = draw(st.one_of(st.integers(6, 16), st.integers(6, 40)))  # small pools contend
    watermark = draw(st.sampled_from([0.0, 0.01, 0.05, 0.1]))
    usable = num_blocks - 1 if v1 else num_blocks
    cap = max(1, int((usable - int(watermark * num_blocks)) * pool_share))
    max_num_seqs = draw(st.one_of(st.integers(1, 6), st.integers(3, 6)))  # 1-2 rarely preempt
    chunked = draw(st.booleans())
    caching = v1 and draw(st.booleans())
    mode = None if v1 else draw(st.sampled_from([None, "swap", "recompute"]))
    max_n = 1 if (v1 or mode == "recompute") else min(3, max_num_seqs)
    max_model_len = draw(st.integers(4, 48))
    # vLLM's own config check: max_num_batched_tokens >= max_num_seqs (so n samples can decode).
    low = max_num_seqs if chunked else max(max_num_seqs, max_model_len)
    max_batched = draw(st.integers(low, low + max_model_len))

    # Sources of shared prefixes: a couple of base sequences and, as follow-ups, earlier requests'
    # prompts continued by their generated tokens (README §2, multi-turn prompts).
    sources: list[list[int]] = draw(st.lists(st.lists(TOKENS, min_size=4, max_size=24),
                                             min_size=1, max_size=2))
    requests = []
    for i in range(draw(st.one_of(st.integers(1, 8), st.integers(4, 8)))):
        rid = f"r{i}"
        n = draw(st.integers(1, max_n))
        if cap // n == 0:
            n = 1
        longest = min(max_model_len, (cap // n) * block_size)
        # max_tokens is biased towards its largest value (decodes that grow into each other).
        top = min(12, longest - 1)
        max_tokens = top - draw(st.integers(0, top - 1))
        prompt_len = draw(st.integers(1, longest - max_tokens))
        source = draw(st.sampled_from(sources))
        shared = draw(st.integers(0, min(len(source), prompt_len)))
        tail = draw(st.lists(TOKENS, min_size=prompt_len - shared, max_size=prompt_len - shared))
        prompt = source[:shared] + tail
        generated = [sampled_token(rid, len(prompt) + j) for j in range(max_tokens)]
        sources.append(prompt + generated)
        req = {"id": rid, "arrival_step": draw(ARRIVALS), "ignore_eos": True,
               "max_tokens": max_tokens, "prompt_token_ids": prompt}
        if not v1:
            req["n"] = n
        requests.append(req)
    requests.sort(key=lambda r: r["arrival_step"])  # stable: by arrival, then creation

    config = {"block_size": block_size, "num_blocks": num_blocks, "max_num_seqs": max_num_seqs,
              "max_num_batched_tokens": max_batched, "max_model_len": max_model_len,
              "enable_prefix_caching": caching, "enable_chunked_prefill": chunked,
              "watermark": watermark}
    if not v1:
        config["preemption_mode"] = mode
        config["num_cpu_blocks"] = 4 + sum(
            r["n"] * (cdiv(len(r["prompt_token_ids"]) + r["max_tokens"], block_size) + 1)
            for r in requests)
    return {"vllm_version": "0.32.0" if v1 else "0.6.3", "config": config, "requests": requests}


class _Timeout(Exception):
    pass


def pagesim_records(spec: dict, seconds: float = 10.0) -> list[dict]:
    """pagesim's replay of ``spec`` through a spec file, under a wall-clock guard (pagesim's loop
    has no step limit, so a livelock would otherwise hang the suite)."""
    def on_alarm(signum, frame):
        raise _Timeout(f"pagesim did not finish within {seconds}s")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.spec.json"
        path.write_text(json.dumps(spec))
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return replay(load_spec(path)).records
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


# A swapped-in prefill (r4) and a swapped-in decode (r3) in one step (8): ``swapped_in`` lists
# them in the logged order (prefills first), as README §3's "scheduled order" reads.
SWAPPED_IN_ORDER = {
    "vllm_version": "0.6.3",
    "config": {"block_size": 2, "num_blocks": 6, "max_num_seqs": 3, "max_num_batched_tokens": 3,
               "max_model_len": 7, "enable_prefix_caching": False, "enable_chunked_prefill": True,
               "watermark": 0.0, "preemption_mode": "swap", "num_cpu_blocks": 32},
    "requests": [
        {"id": rid, "arrival_step": 0, "ignore_eos": True, "max_tokens": m, "prompt_token_ids": p, "n": n}
        for rid, m, p, n in [("r0", 5, [100], 2), ("r1", 6, [100], 1), ("r2", 6, [100], 1),
                             ("r3", 6, [100], 1), ("r4", 5, [100, 100], 1)]
    ],
}


# A lone 15-token prefill that fills the pool (4 blocks of 4, budget 8) under swap mode: vLLM swaps
# it out and back and finishes; only a recompute would repeat forever.
LONE_PREFILL_SWAPS = {
    "vllm_version": "0.6.3",
    "config": {"block_size": 4, "num_blocks": 4, "max_num_seqs": 2, "max_num_batched_tokens": 8,
               "max_model_len": 32, "enable_prefix_caching": False, "enable_chunked_prefill": True,
               "watermark": 0.0, "num_cpu_blocks": 8, "preemption_mode": "swap"},
    "requests": [{"id": "r", "arrival_step": 0, "prompt_token_ids": list(range(100, 115)), "max_tokens": 1,
                  "n": 1, "ignore_eos": True}],
}


@settings(max_examples=scaled_examples(60), deadline=None)
@given(spec=oracle_specs())
@example(spec=SWAPPED_IN_ORDER)
@example(spec=LONE_PREFILL_SWAPS)
def test_pagesim_presets_agree_with_the_reference(spec):
    note(f"spec: {json.dumps(spec, sort_keys=True)}")
    try:
        ours = replay_reference(spec, max_steps=1000)
    except (StepLimitExceeded, SwapSpaceExhausted):
        assume(False)  # outside README §6 scope (livelock / swap space exhausted)
    theirs = pagesim_records(spec)
    report = describe("reference", ours, "pagesim", theirs)
    note(report)
    assert ours == theirs, report
