"""Disaggregated prefill/decode on the real engine (``pagesim.engine.runtime.disagg``): a prefill
engine and a decode engine over one tiny model, the prompt's KV copied between their caches as the
P/D connector decides, in validation mode (both sides poison what they free).

The decode engine's tokens equal the no-paging reference with transfers, prefix hits on both
sides and recompute preemptions on the decode side, at equal and at different block sizes; a
replay from the run's ``PdSchedule`` writes the same two decision logs; a read of blocks the
prefill side had freed is refused, a read of the wrong blocks fails the reference check; a request
the decode side rejects frees its send unread; ``pagesim run --prefill-replicas 1
--decode-replicas 1`` reports the same and refuses what it cannot run in one line.

NOTE: the prefill side never preempts here, nor can it under the policy: an admission reserves the
request's whole prompt (vLLM's ``scheduler_reserve_full_isl``) and a remote-decode request ends
with its prompt (``max_tokens`` 1), so a running prefill never needs a block it was not promised.
Blocks it holds for the decode side make it wait instead (an empty step, then none until a send
is freed), which the first test makes happen.
"""

from __future__ import annotations

import copy
import csv
import json
from types import SimpleNamespace

import pytest

from pagesim.engine.cli import main
from pagesim.engine.policy import make_config
from pagesim.engine.runtime import Engine, ExecutionError, SamplingParams
from pagesim.engine.runtime import disagg
from pagesim.engine.runtime.disagg import DisaggEngine, PdSchedule
from pagesim.engine.runtime.reference import check_outputs
from tests.engine_support import TINY, prompt_of, request, tiny_model

PREFIXES = [prompt_of(900 + i, 16) for i in range(2)]
# Ten requests after two prefixes of four blocks (block size 4), prompts not block-aligned: twelve
# blocks a side hold a few requests, so the decode side preempts and the prefill side waits for reads.
REQUESTS = [request(f"r{i}", PREFIXES[i % 2] + prompt_of(i, 3 + i % 5), 8 + 3 * (i % 4)) for i in range(10)]


pytestmark = pytest.mark.usefixtures("one_thread")


def engine(num_gpu_blocks: int, block_size: int = 4, *, validate: bool = True, **settings) -> Engine:
    config = make_config("vllm-v1", block_size=block_size, num_gpu_blocks=num_gpu_blocks, kv_connector="nixl",
                         max_model_len=TINY.max_position_embeddings, **settings)
    return Engine(tiny_model(), config, backend="torch", validate=validate)


def serve(pd: DisaggEngine, requests=REQUESTS, schedule: PdSchedule | None = None):
    pd.run_lockstep([copy.deepcopy(r) for r in requests], schedule)
    outputs = {rid: r.outputs for rid, r in pd.records.items() if r.status == "completed"}
    return check_outputs(pd.decode.model, requests, outputs, lambda r: SamplingParams())


def test_decode_outputs_match_the_reference_with_transfers_hits_and_preemptions():
    pd = DisaggEngine(engine(12), engine(12))
    report = serve(pd)
    assert report.match and report.checked_requests == len(REQUESTS), report.to_dict()
    prefill, decode = pd.prefill, pd.decode
    transfers = list(pd.transfers.values())
    assert len(transfers) == len(REQUESTS) and all(t.receive_step is not None and t.freed_step is not None
                                                   for t in transfers)
    assert sum(t.read_tokens for t in transfers) == decode.scheduler.pd.num_received_tokens > 0
    assert sum(t.read_bytes for t in transfers) > 0
    assert prefill.scheduler.num_prefix_hit_tokens > 0 and decode.scheduler.num_prefix_hit_tokens > 0
    # the decode side's own hits shorten reads: some read only what follows the shared prefix
    assert any(0 < t.read_tokens < REQUESTS[int(t.request_id[1:])].prompt_len for t in transfers)
    assert decode.stats.preemptions["recompute"] > 0
    assert sum(r.preemptions for r in pd.records.values()) == decode.stats.preemptions["recompute"]
    # the prefill side filled up with blocks held for reads: an empty step, then it waited
    assert any(s.num_tokens == 0 for s in prefill.steps)
    # every send freed, nothing left parked or held
    assert not prefill.scheduler.pd.held_sends() and not decode.scheduler.pd.has_work
    assert prefill.scheduler.pool.num_free_blocks == prefill.config.num_gpu_blocks - 1  # (the null block)
    for e in (prefill, decode):
        e.scheduler.check()
    log = list(prefill.scheduler.decision_log)
    assert {r for rec in log for r in rec.get("kv_send", {})} == {r.request_id for r in REQUESTS}
    assert {r for rec in decode.scheduler.decision_log for r in rec.get("kv_recv", {})} == {r.request_id for r in REQUESTS}


def test_a_replay_of_the_schedule_writes_the_same_decision_logs():
    first = DisaggEngine(engine(12), engine(12))
    serve(first)
    schedule = PdSchedule.of(first)
    assert set(schedule.freed) == set(schedule.decode) == {r.request_id for r in REQUESTS}
    again = DisaggEngine(engine(12), engine(12))
    assert serve(again, schedule=schedule).match
    for a, b in ((first.prefill, again.prefill), (first.decode, again.decode)):
        assert list(a.scheduler.decision_log) == list(b.scheduler.decision_log)
    assert again.events == first.events


def test_slow_reads_park_the_decode_side_and_hold_the_sends_longer():
    """Reads reported done three decode steps late (a slower link): the decode side takes steps
    with only parked requests, the prefill side holds its blocks longer; the tokens still match,
    and a replay of the run's schedule writes the same decision logs."""
    pd = DisaggEngine(engine(12), engine(12), read_delay_steps=3)
    assert serve(pd).match
    for t in pd.transfers.values():
        assert t.read_done_step == t.receive_step + 4
    assert any(rec.get("parked") and not rec["scheduled"] for rec in pd.decode.scheduler.decision_log)
    again = DisaggEngine(engine(12), engine(12))
    assert serve(again, schedule=PdSchedule.of(pd)).match
    for a, b in ((pd.prefill, again.prefill), (pd.decode, again.decode)):
        assert list(a.scheduler.decision_log) == list(b.scheduler.decision_log)


@pytest.mark.parametrize("prefill_block_size,decode_block_size", [(4, 8), (8, 2)])
def test_different_block_sizes_copy_by_token(prefill_block_size, decode_block_size):
    blocks = {2: 30, 4: 12, 8: 7}
    pd = DisaggEngine(engine(blocks[prefill_block_size], prefill_block_size),
                      engine(blocks[decode_block_size], decode_block_size))
    report = serve(pd)
    assert report.match and report.checked_requests == len(REQUESTS), report.to_dict()
    assert pd.decode.scheduler.num_prefix_hit_tokens > 0 and pd.decode.stats.preemptions["recompute"] > 0


def test_a_read_of_blocks_the_prefill_side_freed_is_refused(monkeypatch):
    """The send freed (and, in validation mode, poisoned) before its blocks are read: the copy
    finds NaN where the prompt's KV was."""
    real = disagg.copy_prompt_kv

    def free_first(src, dst, read, *, check=False):
        pd.prefill.scheduler.pd.release(read.request_id)
        pd.prefill.runner.poison_released(gpu=True)
        return real(src, dst, read, check=check)

    monkeypatch.setattr(disagg, "copy_prompt_kv", free_first)
    pd = DisaggEngine(engine(12, enable_prefix_caching=False), engine(12))
    with pytest.raises(ExecutionError, match="r0: prefill blocks .* hold NaN, KV the prefill engine had released"):
        serve(pd)


def test_a_read_into_the_wrong_layers_fails_the_reference_check(monkeypatch):
    """Each layer's KV copied into the next layer's cache: finite, plausible, wrong. (A read of the
    right blocks in the wrong order would not do: attention does not see the order of its keys.)"""
    real = disagg.copy_prompt_kv

    def next_layer(src, dst, read, *, check=False):
        def rotated(caches):
            return caches[1:] + caches[:1]

        shifted = SimpleNamespace(block_size=dst.block_size, device=dst.device,
                                  slot_key_caches=rotated(dst.slot_key_caches),
                                  slot_value_caches=rotated(dst.slot_value_caches))
        return real(src, shifted, read, check=check)

    monkeypatch.setattr(disagg, "copy_prompt_kv", next_layer)
    report = serve(DisaggEngine(engine(24), engine(24)))
    assert report.checked_requests == len(REQUESTS) and not report.match


def test_a_request_the_decode_side_rejects_frees_its_send_unread():
    long = request("long", prompt_of(7, 30), 4)  # 34 tokens: 9 blocks of 4, more than the decode side's 8
    pd = DisaggEngine(engine(12), engine(9))
    report = serve(pd, [long, REQUESTS[0]])
    assert pd.records["long"].status == "rejected" and pd.records["r0"].status == "completed"
    assert report.match and report.checked_requests == 1
    t = pd.transfers["long"]
    assert t.receive_step is None and t.freed_step is not None and not pd.prefill.scheduler.pd.held_sends()


def test_the_engines_must_be_a_pd_pair():
    with pytest.raises(ValueError, match="no KV connector"):
        DisaggEngine(Engine(tiny_model(), make_config("vllm-v1", block_size=4, num_gpu_blocks=8,
                                                      max_model_len=TINY.max_position_embeddings), backend="torch"),
                     engine(8))
    with pytest.raises(ValueError, match="validation mode"):
        DisaggEngine(engine(8), engine(8, validate=False))


RUN = ["run", "--model", "tiny", "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "32",
       "--prefix-repetition-suffix-len", "8", "--prefix-repetition-num-prefixes", "2",
       "--prefix-repetition-output-len", "16", "--num-prompts", "12", "--block-size", "8", "--no-progress",
       "--prefill-replicas", "1", "--decode-replicas", "1", "--threads", "1"]


def test_pagesim_run_disaggregated_matches_the_reference(capsys, tmp_path):
    out = tmp_path / "out"
    assert main([*RUN, "--prefill-num-gpu-blocks", "16", "--decode-num-gpu-blocks", "12", "--check-reference",
                 "--json", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["outputs_match_reference"] is True and summary["requests_completed"] == 12
    pd = summary["disaggregated"]
    assert pd["prefill"]["num_gpu_blocks"] == 16 and pd["decode"]["num_gpu_blocks"] == 12
    assert pd["transfers"]["count"] == 12 and pd["transfers"]["blocks"] > 0 and pd["transfers"]["bytes"] > 0
    assert pd["prefill"]["prefix_hit_tokens"] > 0 and pd["decode"]["prefix_hit_tokens"] > 0
    assert pd["decode"]["preemptions"]["recompute"] > 0
    assert summary["preemptions"]["recompute"] == pd["decode"]["preemptions"]["recompute"]
    files = {p.name for p in out.iterdir()}
    assert {"decisions-prefill-0.jsonl", "decisions-decode-0.jsonl", "transfers.csv", "requests.csv"} <= files
    prefill_log = [json.loads(line) for line in (out / "decisions-prefill-0.jsonl").read_text().splitlines()]
    decode_log = [json.loads(line) for line in (out / "decisions-decode-0.jsonl").read_text().splitlines()]
    assert sum(len(r.get("kv_send", {})) for r in prefill_log) == 12
    assert sum(len(r.get("kv_recv", {})) for r in decode_log) == 12
    # (a send freed after the prefill side's last step is in no record of its: transfers.csv has them all)
    assert 0 < sum(len(r.get("kv_freed", ())) for r in prefill_log) <= 12
    with open(out / "transfers.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and all(row["freed_step"] and row["read_done_step"] for row in rows)
    # the text summary names each side and the transfers
    assert main([*RUN, "--num-gpu-blocks", "16", "--num-prompts", "4"]) == 0
    text = capsys.readouterr().out
    assert "  prefill    16 GPU blocks of 8 tokens" in text and "transfers    4 reads prefill -> decode" in text


@pytest.mark.parametrize("extra,message", [
    (["--prefill-replicas", "2"], "--prefill-replicas 2 --decode-replicas 1: the engine runs one prefill and one "
                                  "decode instance"),
    (["--n", "2"], "one sequence per request"),
    (["--beam-width", "2"], "one sequence per request"),
    (["--max-concurrency", "2"], "--max-concurrency is not run with --prefill-replicas"),
    (["--policy", "vllm-v0"], "needs the vllm-v1 step order"),
    (["--decode-num-gpu-blocks", "0"], "--decode-num-gpu-blocks must be >= 1"),
])
def test_what_a_disaggregated_run_cannot_take_is_one_error_line(capsys, extra, message):
    with pytest.raises(SystemExit) as info:
        main([*RUN, "--num-gpu-blocks", "16", *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim run: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err, err


def test_one_replica_flag_alone_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--model", "tiny", "--workload", "kwon2023-alpaca", "--num-requests", "2", "--decode-replicas", "1"])
    assert info.value.code == 2
    assert "needs both --prefill-replicas and --decode-replicas" in capsys.readouterr().err
