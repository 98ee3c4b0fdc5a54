"""The ``vllm-v1`` preset against decisions vLLM 0.32's own scheduler made (``shared/oracle``).

Each case's workload is replayed with the oracle README's step loop and fake token stream, and
pagesim's decision records, projected to the oracle's v1 fields, must equal vLLM's line for line.
Skips cleanly when ``shared/oracle`` is absent. (The ``vllm-v0`` preset does not match its cases
step for step yet; see presets.py.)
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from engine.policy import Request, Scheduler, make_config
from tests.conftest import SHARED

V1_DIR = SHARED / "oracle" / "vllm-0.32-v1"
CASES = sorted(V1_DIR.glob("case_*.spec.json")) if V1_DIR.is_dir() else []
V1_FIELDS = ("step", "scheduled", "order", "new", "resumed", "resumed_cached", "preempted", "finished", "num_free_blocks")


def fake_token(seq, sample_index: int) -> int:
    """The oracle's model: one deterministic token per request and position."""
    return 10_000 + zlib.crc32(f"{seq.request.request_id}:{seq.num_tokens}".encode()) % 40_000


def replay_v1(spec_path: Path) -> list[dict]:
    spec = json.loads(spec_path.read_text())
    c = spec["config"]
    scheduler = Scheduler(
        make_config(
            "vllm-v1",
            block_size=c["block_size"],
            num_gpu_blocks=c["num_blocks"],
            max_num_seqs=c["max_num_seqs"],
            max_num_batched_tokens=c["max_num_batched_tokens"],
            max_model_len=c["max_model_len"],
            enable_prefix_caching=c["enable_prefix_caching"],
            enable_chunked_prefill=c["enable_chunked_prefill"],
            watermark=c["watermark"],
        )
    )
    pending = list(spec["requests"])
    last_arrival = max(r["arrival_step"] for r in pending)
    records = []
    step = 0
    while step <= last_arrival or scheduler.has_unfinished_requests:
        while pending and pending[0]["arrival_step"] == step:
            r = pending.pop(0)
            assert scheduler.add_request(
                Request(r["id"], prompt_len=0, prompt_token_ids=r["prompt_token_ids"], max_tokens=r["max_tokens"])
            )
        out = scheduler.schedule()
        scheduler.update(out, fake_token)
        record = scheduler.decision_log[-1]
        projected = {k: record[k] for k in V1_FIELDS}
        projected["block_ids"] = {rid: tables["0"] for rid, tables in record["block_ids"].items()}
        records.append(projected)
        step += 1
    return records


@pytest.mark.skipif(not CASES, reason="shared/oracle/vllm-0.32-v1 is absent")
@pytest.mark.parametrize("spec_path", CASES, ids=lambda p: p.name.split(".")[0])
def test_vllm_v1_preset_makes_vllms_decisions(spec_path):
    golden = [json.loads(line) for line in spec_path.with_name(spec_path.name.replace(".spec.json", ".log.jsonl")).read_text().splitlines()]
    ours = replay_v1(spec_path)
    for mine, theirs in zip(ours, golden):
        assert mine == theirs, f"first difference at step {theirs['step']}"
    assert len(ours) == len(golden)
