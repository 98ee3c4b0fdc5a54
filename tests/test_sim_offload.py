"""The simulator with KV offloading (``pagesim.engine.policy.offload``): the host link's copies, the
per-tier metrics, and ``pagesim simulate``'s offload flags.

The CLI runs replay a tiny Mooncake-like trace (``conversations``): 8 conversations, each
request's prompt two shared 512-token blocks of its conversation and one of its own, sent in
turn, on a GPU cache of 200 blocks of 16 tokens. The cache holds about two requests' blocks, so
a conversation's prefix is gone from HBM when it comes round again: HBM-only hits are low,
and an offload store holding every block serves the prefixes from CPU memory.

Loads are asynchronous by default (vLLM 0.33: the request parked until the link has copied them);
``SYNC`` (a budget of 1 TiB) makes every load that leaves a token to compute synchronous.

The timeline test charges ``LinearCost`` (1 s a step that computes, 0.1 s a token) and 0.5 s
per block copied over the host link, and checks the whole run by hand.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from pagesim.engine.cli import main
from pagesim.engine.policy import Scheduler, make_config
from pagesim.sim.cluster import Cluster
from pagesim.sim.router import make_router
from pagesim.sim.simulator import SimOptions, Simulation
from pagesim.traces.trace import Trace
from tests.test_sim_properties import LinearCost as SimLinearCost

BLOCK_BYTES = 32 * 8 * 128 * 2 * 2 * 16  # llama3-8b bf16: one 16-token block of every layer, K and V
OFFLOAD_KEYS = {"offload_hit_tokens", "hbm_hit_tokens", "hbm_hit_rate", "offload_hit_rate", "offload_loaded_blocks",
                "offload_stored_blocks", "offload_loaded_bytes", "offload_stored_bytes", "offload_evictions",
                "offload_refused_blocks", "offload_blocks", "host_link_busy_fraction", "offload_load_wait_s",
                "offload_parked_requests", "offload_parked_mean_s", "offload_parked_p99_s"}
SYNC = ("--offload-sync-load-budget-bytes", str(2**40))


@pytest.fixture(scope="module")
def conversations(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("offload") / "conversations.jsonl"
    rows = []
    for i in range(48):
        conversation = i % 8
        rows.append({"timestamp": 500 * i, "input_length": 3 * 512, "output_length": 20,
                     "hash_ids": [100 * conversation, 100 * conversation + 1, 10_000 + i]})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def simulate(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["simulate", "--no-progress", *args])
        except SystemExit as exc:  # (how the CLI reports an error)
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def summary_of(trace: Path, *args: str) -> dict:
    rc, out, err = simulate("--trace", str(trace), "--format", "mooncake", "--num-gpu-blocks", "200",
                            "--enable-prefix-caching", "--json", *args)
    assert rc == 0, err
    summary = json.loads(out)
    summary.pop("sim_wall_s")
    return summary


@pytest.fixture(scope="module")
def runs(conversations) -> dict:
    """Summaries without offloading, with a store holding everything, and with a slow host link."""
    return {
        "off": summary_of(conversations),
        "on": summary_of(conversations, "--num-offload-blocks", "4000"),
        "slow": summary_of(conversations, "--num-offload-blocks", "4000", "--cost-param", "pcie_efficiency=0.002"),
        "on sync": summary_of(conversations, "--num-offload-blocks", "4000", *SYNC),
        "slow sync": summary_of(conversations, "--num-offload-blocks", "4000", "--cost-param", "pcie_efficiency=0.002",
                                *SYNC),
    }


# --------------------------------------------------------------------------------- tiers
def test_offload_store_raises_the_hit_rate_and_lowers_ttft(runs):
    off, on = runs["off"], runs["on"]
    assert not OFFLOAD_KEYS & set(off), "offload keys only with offloading on"
    assert OFFLOAD_KEYS <= set(on)
    assert on["requests_completed"] == off["requests_completed"] == 48
    assert off["prefix_hit_rate"] < 0.1  # HBM alone: each prefix is evicted before it comes round
    assert on["prefix_hit_rate"] > 0.5 > off["prefix_hit_rate"] + 0.4
    assert on["offload_hit_rate"] > on["hbm_hit_rate"]
    assert on["hbm_hit_rate"] + on["offload_hit_rate"] == pytest.approx(on["prefix_hit_rate"], abs=2e-6)
    admitted = on["input_tokens"]  # every request completed: admitted = completed prompts
    assert on["hbm_hit_tokens"] + on["offload_hit_tokens"] == round(on["prefix_hit_rate"] * admitted)
    assert on["offload_hit_tokens"] % 16 == 0
    loaded_tokens = on["offload_loaded_blocks"] * 16
    if on["preemptions"]["recompute"] == 0:
        assert loaded_tokens == on["offload_hit_tokens"]
    else:  # resumed requests load too
        assert loaded_tokens >= on["offload_hit_tokens"]
    assert on["offload_loaded_bytes"] == on["offload_loaded_blocks"] * BLOCK_BYTES
    assert on["offload_stored_bytes"] == on["offload_stored_blocks"] * BLOCK_BYTES
    assert on["offload_stored_blocks"] >= 8 * 64 + 40 * 32  # every prompt block, at least once
    assert on["offload_blocks"] == 4000 and on["offload_evictions"] == 0 and on["offload_refused_blocks"] == 0
    assert 0 < on["host_link_busy_fraction"] < 0.2
    assert on["ttft_s"]["mean"] < off["ttft_s"]["mean"]
    assert on["ttft_s"]["p50"] <= off["ttft_s"]["p50"]


def test_a_slow_host_link_makes_the_loads_wait(runs):
    on, slow = runs["on sync"], runs["slow sync"]
    assert slow["offload_hit_tokens"] > 0
    assert slow["offload_load_wait_s"] > 10 * on["offload_load_wait_s"] > 0
    assert slow["ttft_s"]["mean"] > on["ttft_s"]["mean"] + 1.0
    assert 0.5 < slow["host_link_busy_fraction"] <= 1.0  # stores past the last completion count too


def test_asynchronous_loads_park_requests_and_synchronous_ones_do_not(runs):
    for label in ("on", "slow"):  # (the default: asynchronous)
        s = runs[label]
        assert s["requests_completed"] == 48
        assert s["offload_hit_tokens"] > 0 and s["offload_load_wait_s"] == 0  # no step waits for a load
        assert 0 < s["offload_parked_requests"] <= 48
        assert 0 < s["offload_parked_mean_s"] <= s["offload_parked_p99_s"]
    assert runs["slow"]["offload_parked_mean_s"] > 10 * runs["on"]["offload_parked_mean_s"]
    for label in ("on sync", "slow sync"):
        s = runs[label]
        assert s["requests_completed"] == 48
        assert s["offload_parked_requests"] == 0 and s["offload_parked_mean_s"] is None
        assert s["offload_parked_p99_s"] is None
    # the same CPU hits either way; asynchronous loads let the other requests compute meanwhile
    assert runs["on"]["offload_hit_tokens"] == runs["on sync"]["offload_hit_tokens"]
    assert runs["slow"]["ttft_s"]["mean"] <= runs["slow sync"]["ttft_s"]["mean"]


# ----------------------------------------------------------------- the link, by hand
class LinearCost(SimLinearCost):
    """1 s per step that computes plus 0.1 s per token; 0.5 s per block over the host link
    (test_sim_properties' model: offload copies cost what swaps do)."""

    name = "linear (tests)"


def prefix_trace(ids: list[list[int]], arrivals=None) -> Trace:
    """One request per list of 4-token block identities, the last block one token long, 1 output."""
    n = len(ids)
    return Trace(arrival_s=np.zeros(n) if arrivals is None else np.array(arrivals, float),
                 prompt_len=np.array([4 * len(i) - 3 for i in ids]), output_len=np.ones(n, np.int64),
                 prefix_id_values=np.array([x for i in ids for x in i]),
                 prefix_id_offsets=np.cumsum([0] + [len(i) for i in ids]), prefix_block_tokens=4)


def offload_scheduler(num_gpu_blocks: int, num_offload_blocks: int | None, *, sync: bool = False,
                      **settings) -> Scheduler:
    if sync and num_offload_blocks:  # (every load that leaves a token to compute: synchronous)
        settings.update(offload_sync_load_budget_bytes=2**40, offload_block_bytes=100)
    return Scheduler(make_config("pagesim", num_gpu_blocks=num_gpu_blocks, block_size=4, record_decisions=True,
                                 **({} if num_offload_blocks is None else {"num_offload_blocks": num_offload_blocks}),
                                 **settings))


def r9(values) -> list[float]:
    return [round(float(v), 9) for v in values]


def test_a_load_waits_for_the_link_and_a_store_waits_for_nobody():
    # Three 9-token prompts (blocks of 4) at t = 0 on 3 GPU blocks; c shares a's first 2 blocks.
    # step 0 [0, 1.9]: a's prefill (9 tokens); a finishes; its 2 full blocks are stored: the
    #   link is busy [1.9, 2.9] while step 1 runs.
    # step 1 [1.9, 3.8]: b's prefill, on a's blocks (evicted from HBM); b's 2 blocks are stored,
    #   the link busy [3.8, 4.8].
    # step 2 [3.8, 6.9]: c misses HBM and loads a's 2 blocks from the store: it waits for b's
    #   store (1 s) and for its load (1 s), then computes its last token (1.1 s).
    sched = offload_scheduler(3, 8, sync=True)
    records: list[str] = []
    result = Simulation(prefix_trace([[1, 2, 3], [4, 5, 6], [1, 2, 7]]), sched, LinearCost(), SimOptions(),
                        decision_sink=records.append, block_bytes=100).run()
    steps = result.steps
    assert list(zip(r9(steps.array("start_s")), r9(steps.array("duration_s")))) == [(0.0, 1.9), (1.9, 1.9),
                                                                                    (3.8, 3.1)]
    assert r9(result.requests.first_token_s) == [1.9, 3.8, 6.9]
    logs = [json.loads(line) for line in records]
    assert [len(r["blocks_to_store"]) for r in logs] == [2, 2, 0]
    assert [len(r["blocks_to_load"]) for r in logs] == [0, 0, 2]
    assert [r["offload_hits"] for r in logs] == [{}, {}, {"r2": 8}]
    s = result.summary
    assert s["offload_load_wait_s"] == pytest.approx(2.0)
    assert s["host_link_busy_fraction"] == pytest.approx(3.0 / 6.9, rel=1e-5)  # two stores and a load
    assert (s["offload_hit_tokens"], s["hbm_hit_tokens"], s["offload_loaded_blocks"], s["offload_stored_blocks"]) == (
        8, 0, 2, 4)
    assert (s["offload_loaded_bytes"], s["offload_stored_bytes"]) == (200, 400)
    assert s["prefix_hit_rate"] == s["offload_hit_rate"] == pytest.approx(8 / 27, rel=1e-5)


def test_stores_move_no_step():
    # Prompts sharing nothing: every block is stored and none loaded. However slow the link,
    # each step starts and lasts exactly as without offloading (and its decisions are the same).
    rng = np.random.default_rng(0)
    ids = [list(range(100 * i, 100 * i + int(k))) for i, k in enumerate(rng.integers(2, 12, 30))]
    tr = prefix_trace(ids, arrivals=np.sort(rng.uniform(0, 20, 30)))
    tr = Trace(arrival_s=tr.arrival_s, prompt_len=tr.prompt_len, output_len=rng.integers(1, 8, 30),
               prefix_id_values=tr.prefix_id_values, prefix_id_offsets=tr.prefix_id_offsets, prefix_block_tokens=4)
    slow = LinearCost()
    slow.offload_seconds = lambda num_blocks, block_size, *, to_gpu: 5.0 * num_blocks
    runs = {}
    for label, offload in (("off", None), ("on", 64)):
        runs[label] = Simulation(tr, offload_scheduler(24, offload), slow, SimOptions(skip_ahead=False)).run()
    on, off = runs["on"], runs["off"]
    for column in ("start_s", "duration_s", "num_tokens"):
        assert on.steps.array(column).tolist() == off.steps.array(column).tolist(), column
    assert on.summary["offload_stored_blocks"] > 0 and on.summary["offload_loaded_blocks"] == 0
    assert on.summary["offload_load_wait_s"] == 0
    assert 0.9 < on.summary["host_link_busy_fraction"] <= 1.0  # the stores outlast the run
    # (the ideal cache holds both tiers' blocks, so its size, and what it could hit, follow the store's size)
    sized = OFFLOAD_KEYS | {"ideal_cache_blocks", "ideal_hit_rate"}
    assert {k: v for k, v in on.summary.items() if k not in sized} == {k: v for k, v in off.summary.items() if k not in sized}
    assert on.summary["ideal_cache_blocks"] == off.summary["ideal_cache_blocks"] + 64


def test_skip_ahead_is_on_only_for_prompt_only_stores_and_a_one_replica_cluster_is_the_simulation():
    tr = prefix_trace([[1, 2, 3], [4, 5, 6], [1, 2, 7], [1, 2, 8]], arrivals=[0, 0, 0, 5])
    sim = Simulation(tr, offload_scheduler(3, 8), LinearCost(), SimOptions(), block_bytes=100)
    assert sim.replica.skip_ahead is True  # decodes store nothing (vLLM's offload_prompt_only)
    every_block = offload_scheduler(3, 8, offload_prompt_only=False)
    assert Simulation(tr, every_block, LinearCost(), SimOptions()).replica.skip_ahead is False
    single = sim.run()
    cluster = Cluster(tr, [(offload_scheduler(3, 8), LinearCost())], make_router("round-robin"), SimOptions(),
                      block_bytes=100).run()
    assert cluster.summary == single.summary
    # the 4th request finds c's loaded blocks in HBM
    assert (single.summary["offload_hit_tokens"], single.summary["hbm_hit_tokens"]) == (8, 8)


# ------------------------------------------------------------------------------- the CLI
def test_no_skip_ahead_gives_the_same_summary(conversations):
    args = ("--num-offload-blocks", "600")
    assert summary_of(conversations, *args) == summary_of(conversations, *args, "--no-skip-ahead")


@pytest.mark.parametrize("policy", ["lru", "arc", "lfu"])
def test_every_offload_policy_runs(conversations, policy):
    s = summary_of(conversations, "--num-offload-blocks", "800", "--kv-offloading-policy", policy)
    assert s["requests_completed"] == 48
    assert s["offload_blocks"] == 800 and s["offload_evictions"] > 0  # 2,048 distinct blocks offered
    assert s["offload_hit_tokens"] > 0
    assert s["hbm_hit_tokens"] + s["offload_hit_tokens"] == round(s["prefix_hit_rate"] * s["input_tokens"])


def test_kv_offloading_size_in_gib(conversations):
    s = summary_of(conversations, "--kv-offloading-size", "1")
    assert s["offload_blocks"] == 2**30 // BLOCK_BYTES  # 512 blocks of 2 MiB


def test_offloading_needs_prefix_caching():
    rc, out, err = simulate("--kv-offloading-size", "256", "--prefix-caching", "off", "--num-requests", "5")
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "prefix caching" in err


def test_decision_log_and_text_summary(conversations, tmp_path):
    out = tmp_path / "run"
    rc, text, err = simulate("--trace", str(conversations), "--format", "mooncake", "--num-gpu-blocks", "200",
                             "--enable-prefix-caching", "--num-offload-blocks", "4000", "--out", str(out))
    assert rc == 0, err
    line = next(x for x in text.splitlines() if x.startswith("offload "))
    assert line.startswith("offload    4,000 blocks (7.812 GiB): hits HBM ") and "link busy" in line
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(x) for x in (out / "decisions.jsonl").read_text().splitlines()]
    assert all({"blocks_to_load", "blocks_to_store", "offload_hits", "num_free_offload_blocks"} <= set(r)
               for r in records)
    assert sum(len(r["blocks_to_load"]) for r in records) == summary["offload_loaded_blocks"]
    assert sum(len(r["blocks_to_store"]) for r in records) == summary["offload_stored_blocks"]
    assert sum(sum(r["offload_hits"].values()) for r in records) >= summary["offload_hit_tokens"] > 0


def test_each_replica_has_its_own_store(conversations):
    # round-robin: conversation c's requests all go to replica c % 2
    s = summary_of(conversations, "--num-offload-blocks", "4000", "--replicas", "2")
    replicas = s["replicas"]
    assert [r["offload_blocks"] for r in replicas] == [4000, 4000] and s["offload_blocks"] == 8000
    for key in ("offload_hit_tokens", "hbm_hit_tokens", "offload_loaded_blocks", "offload_stored_blocks",
                "offload_stored_bytes"):
        assert sum(r[key] for r in replicas) == s[key], key
    assert all(r["offload_stored_blocks"] > 0 and r["offload_hit_tokens"] > 0 for r in replicas)
    assert s["offload_hit_tokens"] > 0 and 0 < s["host_link_busy_fraction"] <= 1


@pytest.mark.slow  # three spawned processes of a second or two each
def test_bench_offload_smoke(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_offload.py"), "--num-requests", "30",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    if "skipped" in report:  # the shared Mooncake trace is absent: said so, not measured
        assert "skipped" in proc.stdout
        return
    cases = report["cases"]
    assert list(cases) == ["off", "off, step by step", "on 256 GiB lru"]
    assert all(c["requests"] == c["completed"] == 30 for c in cases.values())
    assert cases["off"]["prefix_hit_rate"] == cases["off, step by step"]["prefix_hit_rate"]
    assert cases["off"]["hbm_hit_rate"] is None and cases["on 256 GiB lru"]["offload_blocks"] == 131_072
    assert "x off step by step" in proc.stdout


def test_a_contiguous_baseline_refuses_offloading():
    from pagesim.sim.setup import RunSpec

    with pytest.raises(ValueError, match="--kv-offloading-size applies to the paged allocator only"):
        RunSpec(allocator="max", kv_offloading_gb=8.0)
    with pytest.raises(ValueError, match="--kv-offloading-policy applies to the paged allocator only"):
        RunSpec(allocator="pow2", overrides={"offload_eviction_policy": "arc"})



# ------------------------------------------------------------- asynchronous loads, parked
def test_every_request_parked_at_once_does_not_hang():
    # Eight requests share a 2-block prefix a first request stored and a second evicted from
    # HBM (3 GPU blocks); they arrive together: the first loads it from the store,
    # asynchronously, parked, and the others wait for that load (its blocks are being loaded),
    # so every unfinished request waits on the link: the replica sleeps until the copy ends
    # instead of spinning through empty steps or declaring a stall.
    ids = [[1, 2, 3], [4, 5, 6]] + [[1, 2, 10 + i] for i in range(8)]
    tr = prefix_trace(ids, arrivals=[0, 10] + [20] * 8)
    slow = LinearCost()
    slow.offload_seconds = lambda num_blocks, block_size, *, to_gpu: 3.0 * num_blocks
    records: list[str] = []
    result = Simulation(tr, offload_scheduler(3, 64), slow, SimOptions(), decision_sink=records.append).run()
    s = result.summary
    assert s["requests_completed"] == 10
    assert s["offload_parked_requests"] >= 1 and s["offload_parked_mean_s"] >= 6.0  # two blocks at 3 s each
    logs = [json.loads(line) for line in records]
    only_parked = [r for r in logs if r["parked"] and not r["scheduled"]]
    assert only_parked, "some step had only parked requests"
    # no spinning: a step that schedules nothing is followed by a wait, so such steps are few
    assert sum(1 for r in logs if not r["scheduled"]) <= 2 * s["offload_loaded_blocks"] + 2
    parked_rows = result.requests.offload_parks > 0
    assert (result.requests.offload_parked_s[parked_rows] >= 6.0).all()


def test_parked_time_runs_from_the_parking_step_to_the_report():
    # a's blocks are stored, then b (sharing them) parks while the link copies 2 blocks (1 s):
    # it is parked from the start of its parking step to the boundary after the copy ends.
    tr = prefix_trace([[1, 2, 3], [4, 5, 6], [1, 2, 7]], arrivals=[0, 0, 10])
    result = Simulation(tr, offload_scheduler(3, 8), LinearCost(), SimOptions()).run()
    m = result.requests
    assert m.offload_parks.tolist() == [0, 0, 1]
    assert m.offload_parked_s[2] == pytest.approx(1.0)  # nothing else ran: the copy's own time
    assert result.summary["offload_parked_requests"] == 1
    assert result.summary["offload_parked_mean_s"] == result.summary["offload_parked_p99_s"] == pytest.approx(1.0)
    # c starts computing when its load is reported done, 1 s after it arrived
    assert m.first_scheduled_s[2] >= 10.0 and m.first_token_s[2] >= 11.0


def test_summaries_without_offloading_have_no_parked_keys(runs):
    assert not {"offload_parked_requests", "offload_parked_mean_s", "offload_parked_p99_s"} & set(runs["off"])
