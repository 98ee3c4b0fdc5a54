"""Disaggregated prefill/decode in the simulator (pagesim/sim/disagg/): the run, its figures, its refusals.

- The fast path stays on for decode replicas and changes nothing: decision logs of every replica
  and the request table are byte for byte the same with skip-ahead on and off, under load-aware
  and round-robin routers, over NVLink and over a slow contended RDMA link, with decode-side
  preemptions.
- The TTFT split adds up to each request's TTFT; every prefill send is freed exactly once; a
  request the decode side rejects frees its prefill blocks at once.
- The network: transfers sharing a port queue behind each other; placement puts replicas on nodes.
- Settings that cannot work are refused before the run with the numbers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import simpy

from pagesim.engine.cli import main
from pagesim.engine.policy.disagg import RemoteDecode
from pagesim.sim.disagg.cluster import DisaggCluster
from pagesim.sim.disagg.network import GB, KvNetwork, NetworkSpec, place
from pagesim.sim.disagg.setup import build_pool, pool_spec
from pagesim.sim.hardware import get_gpu_preset
from pagesim.sim.metrics import COMPLETED, REJECTED
from pagesim.sim.router import make_router
from pagesim.sim.setup import RunSpec
from pagesim.sim.simulator import SimOptions
from pagesim.traces.generate import generate, workload_spec
from tests.test_sim_cli import simulate, simulate_json

BASE = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--workload", "shared-system-prompt", "--seed", "3")


def run_cluster(trace, *, prefill=1, decode=2, p_settings=None, d_settings=None, skip_ahead=True,
                prefill_router="round-robin", decode_router="round-robin", network=None, max_concurrency=None):
    spec = RunSpec(model="llama3-8b", gpu="h100-sxm", record_decisions=True)
    p_pool, _ = build_pool(pool_spec(spec, p_settings or {}), prefill, "prefill")
    d_pool, _ = build_pool(pool_spec(spec, d_settings or {}), decode, "decode")
    logs = ([[] for _ in range(prefill)], [[] for _ in range(decode)])
    cluster = DisaggCluster(trace, p_pool, d_pool, prefill_router=make_router(prefill_router),
                            decode_router=make_router(decode_router),
                            options=SimOptions(seed=1, skip_ahead=skip_ahead, max_concurrency=max_concurrency),
                            network=network, decision_sinks=([log.append for log in logs[0]],
                                                             [log.append for log in logs[1]]))
    return cluster, cluster.run(), logs


def trace_of(num, rate, name="shared-system-prompt"):
    return generate(workload_spec(name, rate_rps=rate, num_requests=num, seed=2))


CASES = {
    "round-robin-nvlink": dict(),
    "load-aware": dict(prefill=2, decode=3, prefill_router="prefix-affinity", decode_router="least-outstanding-tokens"),
    "rdma-slow-preempting": dict(prefill=2, decode=2, d_settings={"num_gpu_blocks": 260},
                                 network=NetworkSpec(gpus_per_node=1, bandwidth_bytes_per_s=2 * GB)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_skip_ahead_on_and_off_make_the_same_decisions(case):
    trace = trace_of(160, 14)
    _, on, logs_on = run_cluster(trace, **CASES[case])
    _, off, logs_off = run_cluster(trace, skip_ahead=False, **CASES[case])
    assert logs_on == logs_off
    for name in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "output_tokens", "preemptions"):
        assert np.array_equal(getattr(on.requests, name), getattr(off.requests, name), equal_nan=True), name
    assert np.array_equal(on.read_end_s, off.read_end_s, equal_nan=True)
    assert sum(r.steps_skipped for r in on.decode) > 0, "the decode replicas skipped nothing"
    if case == "rdma-slow-preempting":
        assert sum(on.summary["disaggregated"]["pools"]["decode"]["preemptions"].values()) > 0
        assert on.summary["disaggregated"]["transfers"]["port_wait_s"] > 0
        assert on.summary["disaggregated"]["transfers"]["transfers_by_link"]["rdma"] == len(trace)


def test_ttft_split_adds_up_and_every_send_is_freed_once():
    trace = trace_of(120, 10)
    cluster, result, logs = run_cluster(trace, prefill=2, decode=2)
    m = result.requests
    assert (m.status == COMPLETED).all()
    split = result.summary["disaggregated"]["ttft_split_s"]
    assert sum(v["mean"] for v in split.values()) == pytest.approx(result.summary["ttft_s"]["mean"], rel=1e-5)
    assert (result.read_start_s >= result.handover_s).all() and (result.read_end_s > result.read_start_s).all()
    assert (m.first_token_s > result.read_end_s).all()
    sent = [json.loads(line) for log in logs[0] for line in log]
    freed = [rid for r in sent for rid in r["kv_freed"]]
    sends = [rid for r in sent for rid in r.get("kv_send", {})]
    assert sorted(sends) == sorted(set(sends)) and len(sends) == len(trace)
    # (a send freed after the last prefill step is in no record; the pools end empty all the same)
    assert len(freed) == len(set(freed)) and set(freed) <= set(sends)
    for replica in result.prefill:
        assert replica.scheduler.pd.held_sends() == [] and replica.scheduler.pool.num_used_blocks == 0
    received = [json.loads(line) for log in logs[1] for line in log]
    assert sum(len(r["kv_recv"]) for r in received) == len(trace)
    d = result.summary["disaggregated"]
    assert d["gpus"] == 4 and d["goodput_rps_per_gpu"] == pytest.approx(result.summary["goodput_rps"] / 4, rel=1e-5)
    assert d["transfers"]["transfers"] == len(trace) and d["transfers"]["bytes"] > 0


def test_a_request_the_decode_side_rejects_frees_its_prefill_blocks():
    trace = trace_of(40, 5)
    longest = int(trace.prompt_len.max() + trace.output_len.max())
    limit = int(np.median(trace.prompt_len + trace.output_len))
    assert limit < longest
    _, result, _ = run_cluster(trace, prefill=1, decode=1, d_settings={"max_model_len": limit})
    m = result.requests
    rejected = m.status == REJECTED
    assert rejected.any() and (m.status[~rejected] == COMPLETED).all()
    assert result.prefill[0].scheduler.pd.held_sends() == [] and result.prefill[0].scheduler.pool.num_used_blocks == 0
    assert np.isnan(result.read_start_s[rejected]).all()


def test_a_closed_loop_client_drives_the_pair():
    trace = trace_of(60, 1000.0)
    _, result, _ = run_cluster(trace, prefill=1, decode=1, max_concurrency=4)
    m = result.requests
    assert (m.status == COMPLETED).all()
    order = np.argsort(m.arrival_s)
    in_flight = max(int(((m.arrival_s <= t) & (m.finish_s > t)).sum()) for t in m.arrival_s[order])
    assert in_flight <= 4


def test_transfers_sharing_a_port_queue_and_placement_fills_nodes():
    assert place([1] * 10, 8) == [0] * 8 + [1, 1]
    assert place([4, 4, 4, 2, 4], 8) == [0, 0, 1, 1, 2]  # (a replica never straddles two nodes)
    env = simpy.Environment()
    h100 = get_gpu_preset("h100-sxm")
    net = KvNetwork(env, [h100] * 3, [1, 1, 1], NetworkSpec(gpus_per_node=1, bandwidth_bytes_per_s=1 * GB, latency_s=0))
    ends = []

    def move(src, dst):
        yield from net.transfer(src, dst, 1 * GB)
        ends.append((src, dst, env.now))

    env.process(move(0, 2))
    env.process(move(1, 2))  # (the same receiving port: it waits for the first)
    env.process(move(0, 1))  # (the same sending port as the first: it waits too)
    env.run()
    assert sorted(ends) == [(0, 1, pytest.approx(2.0)), (0, 2, pytest.approx(1.0)), (1, 2, pytest.approx(2.0))]
    assert net.summary(2.0)["transfers_by_link"] == {"nvlink": 0, "rdma": 3}
    same_node = KvNetwork(env, [h100] * 2, [2, 2], NetworkSpec())
    link = same_node.link(0, 1)
    assert link.kind == "nvlink" and link.bytes_per_s == 2 * h100.interconnect_bytes_per_s


def test_the_cli_prints_the_split_and_writes_its_files(capsys, tmp_path):
    rc, out, err = simulate(capsys, *BASE, "--rate", "4", "--num-requests", "40", "--prefill-replicas", "1",
                            "--decode-replicas", "1", "--out", str(tmp_path / "run"))
    assert rc == 0, err
    assert "TTFT split (mean): prefill queue" in out and "KV transfers: 40" in out
    names = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert names == ["decisions-decode-0.jsonl", "decisions-prefill-0.jsonl", "requests.csv", "run_info.json",
                     "summary.json"]
    summary = simulate_json(capsys, *BASE, "--rate", "4", "--num-requests", "40", "--prefill-replicas", "1",
                            "--decode-replicas", "2", "--decode", "tp=2", "--decode", "max_num_seqs=32")
    d = summary["disaggregated"]
    assert d["decode_tp"] == 2 and d["gpus"] == 5 and summary["requests_completed"] == 40


@pytest.mark.parametrize("args, words", [
    (("--prefill-replicas", "1"), "give --prefill-replicas and --decode-replicas together"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--replicas", "2"), "does not apply to a disaggregated run"),
    (("--prefill-replicas", "0", "--decode-replicas", "1"), "--prefill-replicas must be an integer >= 1"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link-bandwidth", "0"), "must be a positive number of GB/s"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--decode", "num_gpu_blocks=10"),
     "the decode pool's KV cache holds 10 blocks of 16 tokens"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--prefill", "kv_cache_dtype=fp8"),
     "both pools serve the same model with the same KV layout"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--decode", "oops"), "--decode expects KEY=VALUE"),
    (("--decode", "tp=2"), "sets a pool of a disaggregated run"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--workload", "kwon2023-alpaca-parallel"),
     "one sequence per request"),
])
def test_settings_that_cannot_work_are_refused_before_the_run(capsys, args, words):
    base = [a for a in BASE]
    if "--workload" in args:
        i = base.index("--workload")
        del base[i:i + 2]
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--no-progress", *base, "--rate", "4", "--num-requests", "20", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err, err


def test_a_prefill_request_is_sent_with_max_tokens_one():
    trace = trace_of(10, 5)
    cluster, result, logs = run_cluster(trace, prefill=1, decode=1)
    assert (result.prefill_requests.output_tokens[result.prefill_requests.status == COMPLETED] == 1).all()
    assert (result.requests.output_tokens == trace.output_len).all()
    assert isinstance(RemoteDecode(), RemoteDecode)
