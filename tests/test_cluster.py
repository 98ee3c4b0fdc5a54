"""The cluster simulator: each router's rule on hand-built scheduler states, cluster runs that add
up, a one-replica cluster that is exactly the single-replica simulation, determinism, and
``pagesim simulate --replicas N --router R``.

Router tests drive real schedulers by hand (``schedule`` / ``update``) into the situation the
rule is about, then ask the router; nothing is mocked.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from pagesim.engine.policy import Request, Scheduler, make_config
from pagesim.sim.cluster import Cluster, build_replicas
from pagesim.sim.replica import iter_chunked
from pagesim.sim.cluster_metrics import requests_subset
from pagesim.sim.cost.base import TERMS, CostModel, StepCost, StepWork
from pagesim.sim.metrics import COMPLETED, REJECTED, RequestMetrics
from pagesim.sim.router import (ROUTERS, LeastKv, LeastOutstandingTokens, PrefixAffinity, RoundRobin, make_router,
                        outstanding_tokens, request_outstanding_tokens)
from pagesim.sim.setup import RunSpec, build
from pagesim.sim.simulator import SimOptions, Simulation
from pagesim.traces.generate import generate, workload_spec
from tests.test_sim_cli import simulate, simulate_json
from pagesim.traces.trace import Trace


class LinearCost(CostModel):
    """1 ms per step plus 0.1 ms per token."""

    name = "linear (tests)"

    def step_cost(self, work: StepWork) -> StepCost:
        terms = dict.fromkeys(TERMS, 0.0)
        terms["linear"] = 1e-3 + 1e-4 * work.num_tokens
        return StepCost(terms)


def paged(**overrides) -> Scheduler:
    settings = {"num_gpu_blocks": 64, "block_size": 4, "enable_prefix_caching": True, "record_decisions": True}
    return Scheduler(make_config("pagesim", **{**settings, **overrides}))


def request(rid: str, prompt: list[int] | int, max_tokens: int, **kw) -> Request:
    if isinstance(prompt, int):
        return Request(rid, prompt, max_tokens, **kw)
    return Request(rid, 0, max_tokens, prompt_token_ids=prompt, **kw)


def step(sched: Scheduler) -> None:
    sched.update(sched.schedule())


def run_to_end(sched: Scheduler) -> None:
    while sched.has_unfinished_requests:
        step(sched)


# --------------------------------------------------------------------- outstanding tokens
def test_outstanding_tokens_count_uncomputed_prompt_and_outputs_still_to_come():
    sched = paged(enable_prefix_caching=False)
    r = request("a", 10, 5)
    assert request_outstanding_tokens(r) == 10 + 5
    sched.add_request(r)
    step(sched)  # the prefill, which samples the first output
    assert request_outstanding_tokens(r) == 5 - 1
    step(sched)
    assert request_outstanding_tokens(r) == 5 - 2
    assert outstanding_tokens(sched) == 3


def test_outstanding_tokens_count_samples_not_yet_forked():
    sched = paged(enable_prefix_caching=False)
    r = request("n", 10, 5, n=3, sample_max_tokens=(5, 2, 3))
    beams = request("b", 10, 5, beam_width=2)
    assert request_outstanding_tokens(r) == 10 + 5 + 2 + 3
    assert request_outstanding_tokens(beams) == 10 + 2 * 5
    sched.add_request(r)
    step(sched)  # prefill, fork, one output each
    assert r.forked
    assert request_outstanding_tokens(r) == (5 - 1) + (2 - 1) + (3 - 1)


# -------------------------------------------------------------------------------- routers
def test_round_robin_cycles():
    router = RoundRobin()
    schedulers = [paged(), paged(), paged()]
    assert [router.route(request(f"r{i}", 8, 2), schedulers) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_and_least_kv_disagree_on_a_queue():
    # replica 0 runs a small request (holds blocks); replica 1 queues a big one (holds none)
    running, queued = paged(enable_prefix_caching=False), paged(enable_prefix_caching=False)
    running.add_request(request("small", 8, 3))
    step(running)
    queued.add_request(request("big", 40, 50))
    new = request("new", 8, 2)
    assert LeastOutstandingTokens().route(new, [running, queued]) == 0
    assert LeastKv().route(new, [running, queued]) == 1
    assert LeastKv().route(new, [queued, running]) == 0


def test_ties_go_to_the_lowest_index():
    schedulers = [paged(), paged(), paged()]
    new = request("new", 8, 2)
    for name in ROUTERS:
        if name != "round-robin":
            assert make_router(name).route(new, schedulers) == 0, name


def warm(prompt: list[int]) -> Scheduler:
    """A replica whose prefix cache holds ``prompt``'s blocks (its request has finished)."""
    sched = paged()
    sched.add_request(request("warm", prompt, 2))
    run_to_end(sched)
    return sched


PROMPT = list(range(40))  # 10 blocks of 4
SHARING = PROMPT[:36] + [100, 101, 102, 103]  # shares 9 full blocks


def test_prefix_affinity_goes_to_the_replica_holding_the_prefix():
    cold, hot = paged(), warm(PROMPT)
    assert PrefixAffinity().route(request("b", SHARING, 4), [cold, hot]) == 1
    assert PrefixAffinity().route(request("c", list(range(500, 540)), 4), [cold, hot]) == 0  # nothing cached


def test_prefix_affinity_leaves_an_overloaded_replica():
    cold, hot = paged(), warm(PROMPT)
    hot.add_request(request("queued", 8, 20))  # 28 outstanding tokens on the warm replica, 0 on the cold
    new = request("b", SHARING, 4)
    assert PrefixAffinity(affinity_slack=1.5, affinity_slack_tokens=10).route(new, [cold, hot]) == 0
    assert PrefixAffinity(affinity_slack=1.5, affinity_slack_tokens=28).route(new, [cold, hot]) == 1  # not beyond
    cold.add_request(request("other", 8, 12))  # 20 outstanding: 28 is not 1.5x 20
    assert PrefixAffinity(affinity_slack=1.5, affinity_slack_tokens=0).route(new, [cold, hot]) == 1


def test_prefix_affinity_without_prefix_caching_is_least_outstanding_tokens():
    def replicas():
        a, b, c = (paged(enable_prefix_caching=False) for _ in range(3))
        b.add_request(request("warm", PROMPT, 2))
        run_to_end(b)
        a.add_request(request("queued", 8, 20))
        return [a, b, c]

    new = request("b", SHARING, 4)
    assert PrefixAffinity().route(new, replicas()) == LeastOutstandingTokens().route(new, replicas()) == 1


def test_probing_changes_neither_the_replicas_nor_the_request():
    cold, hot = paged(), warm(PROMPT)
    pool = hot.pool
    before = (list(pool.ref_counts), list(pool.hit_count), pool.num_free_blocks, pool.num_cached_free_blocks)
    new = request("b", SHARING, 4)
    for _ in range(3):
        assert PrefixAffinity().route(new, [cold, hot, cold]) == 1
    assert new.seqs[0].block_keys == [] and new.seqs[0].block_table == []
    assert (list(pool.ref_counts), list(pool.hit_count), pool.num_free_blocks, pool.num_cached_free_blocks) == before
    hot.add_request(new)
    step(hot)
    assert hot.num_prefix_hit_tokens == 36  # the hit the router saw is the hit admission takes


def test_router_registry_errors():
    with pytest.raises(ValueError, match="unknown router 'random'"):
        make_router("random")
    with pytest.raises(ValueError, match="takes no affinity_slack"):
        make_router("least-kv", affinity_slack=2.0)
    with pytest.raises(ValueError, match="affinity-slack"):
        make_router("prefix-affinity", affinity_slack=0.5)


# ---------------------------------------------------------------------------- cluster runs
def small_trace(num: int = 40) -> Trace:
    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0, 2.0, num))
    arrivals[num // 2] = arrivals[num // 2 - 1]  # two rows arriving together
    return Trace(arrival_s=arrivals, prompt_len=rng.integers(4, 40, num), output_len=rng.integers(1, 30, num))


def cluster(trace: Trace, num: int, router: str = "round-robin", *, sinks=None, **options):
    replicas = [(paged(), LinearCost()) for _ in range(num)]
    return Cluster(trace, replicas, make_router(router), SimOptions(**options), decision_sinks=sinks).run()


def test_round_robin_cluster_splits_the_work_and_adds_up():
    result = cluster(small_trace(40), 4)
    s = result.summary
    assert result.replica_of.tolist() == [i % 4 for i in range(40)]
    assert [r["requests_routed"] for r in s["replicas"]] == [10] * 4
    assert sum(r["requests_completed"] for r in s["replicas"]) == s["requests_completed"] == 40
    assert sum(r["steps"] for r in s["replicas"]) == s["steps"] == len(result.steps)
    assert sum(r["busy_s"] for r in s["replicas"]) == pytest.approx(s["busy_s"])
    assert sum(r["generated_tokens"] for r in s["replicas"]) == s["generated_tokens"]
    assert s["router"] == "round-robin" and {r["tp"] for r in s["replicas"]} == {1}
    assert (result.requests.status == COMPLETED).all()


@pytest.mark.parametrize("router", list(ROUTERS))
def test_every_router_completes_a_shared_prefix_workload(router):
    trace = generate(workload_spec("shared-system-prompt", rate_rps=40, num_requests=60, seed=1))
    builts = build_replicas(RunSpec(gpu="a100-40gb", num_gpu_blocks=400, overrides={"enable_prefix_caching": True}), 3)
    result = Cluster(trace, [(b.scheduler, b.cost_model) for b in builts], make_router(router)).run()
    s = result.summary
    assert s["requests_completed"] + s["requests_rejected"] == 60
    assert sorted(set(result.replica_of.tolist())) <= [0, 1, 2] and (result.replica_of >= 0).all()
    assert [r["requests_routed"] for r in s["replicas"]] == np.bincount(result.replica_of, minlength=3).tolist()
    assert s["prefix_hit_rate"] > 0


def test_one_replica_cluster_is_the_single_replica_simulation():
    trace = generate(workload_spec("kwon2023-alpaca-beam", rate_rps=10, num_requests=40, seed=2))
    spec = RunSpec(gpu="a100-40gb", num_gpu_blocks=300, record_decisions=True,
                   overrides={"enable_prefix_caching": True})
    alone, records_alone = build(spec), []
    single = Simulation(trace, alone.scheduler, alone.cost_model, decision_sink=records_alone.append).run()
    (built,), records = build_replicas(spec, 1), []
    one = Cluster(trace, [(built.scheduler, built.cost_model)], make_router("prefix-affinity"),
                  decision_sinks=[records.append]).run()
    assert json.dumps(one.summary, sort_keys=True) == json.dumps(single.summary, sort_keys=True)
    assert "replicas" not in one.summary and "router" not in one.summary
    assert records == records_alone and records
    for name in ("start_s", "duration_s", "num_tokens", "allocated_slots"):
        assert one.steps.array(name).tolist() == single.steps.array(name).tolist()


def test_same_inputs_give_the_same_cluster_run():
    trace = small_trace(60)
    runs = []
    for _ in range(2):
        sinks = [[] for _ in range(3)]
        result = cluster(trace, 3, "prefix-affinity", sinks=[s.append for s in sinks], seed=5)
        runs.append((json.dumps(result.summary, sort_keys=True), result.replica_of.tolist(), sinks))
    assert runs[0] == runs[1]
    assert all(runs[0][2])  # every replica logged decisions


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_run_keeping_no_step_rows_has_the_same_summary(monkeypatch, replicas):
    """``SimOptions(step_rows=False)`` (``pagesim simulate`` without ``--out``) keeps only what the
    summary reads, with chunks of 16 rows so every replica spills many times: the summary is the
    same, float for float, and the columns it did not keep are refused by name."""
    from pagesim.sim.step_metrics import StepMetrics

    monkeypatch.setitem(StepMetrics.__init__.__kwdefaults__, "chunk_rows", 16)
    trace = generate(workload_spec("kwon2023-sharegpt", rate_rps=20, num_requests=80, seed=4))
    runs = {}
    for step_rows in (True, False):
        builts = build_replicas(RunSpec(gpu="a100-40gb", num_gpu_blocks=300, overrides={"enable_prefix_caching": True}),
                                replicas)
        result = Cluster(trace, [(b.scheduler, b.cost_model) for b in builts], make_router("round-robin"),
                         SimOptions(step_rows=step_rows)).run()
        runs[step_rows] = result
        assert result.summary["steps"] > 16 * 8 * replicas  # (many spills per replica)
    assert json.dumps(runs[False].summary, sort_keys=True) == json.dumps(runs[True].summary, sort_keys=True)
    kept, full = runs[False].steps, runs[True].steps
    for name in ("start_s", "duration_s"):
        assert kept.array(name).tolist() == full.array(name).tolist()
    with pytest.raises(ValueError, match=r"\['used_slots'\] were not kept"):
        kept.array("used_slots")


@pytest.mark.parametrize("router", ["round-robin", "least-outstanding-tokens", "prefix-affinity"])
def test_skip_ahead_changes_no_routing_or_decision(router):
    # the router reads every replica's progress at each arrival: skipping ahead must leave each
    # replica, at every arrival, exactly where stepping would have
    trace = small_trace(60)
    runs = []
    for skip_ahead in (True, False):
        sinks = [[] for _ in range(3)]
        result = cluster(trace, 3, router, sinks=[s.append for s in sinks], skip_ahead=skip_ahead)
        runs.append((result.replica_of.tolist(), sinks, result.summary["requests_completed"]))
        skipped = sum(getattr(r, "steps_skipped", 0) for r in result.replicas)
        assert (skipped > 0) == skip_ahead
    assert runs[0] == runs[1]


@pytest.mark.parametrize("router", ["least-outstanding-tokens", "prefix-affinity"])
def test_implicit_decoders_change_no_routing(router):
    # decisions not recorded: the fast path's decoders are implicit (engine.policy.bulk_decode), their
    # counters lag, and a router reading them (outstanding tokens) settles them, in the middle of a
    # step that admits beside the decodes too, where the step's tokens are computed but not sampled
    trace = small_trace(60)
    runs = []
    for skip_ahead in (True, False):
        replicas = [(paged(record_decisions=False, block_size=16), LinearCost()) for _ in range(3)]
        chosen = make_router(router)
        seen = []  # what the router read at each arrival: every replica's outstanding tokens

        def route(request, schedulers, route=chosen.route):
            seen.append([outstanding_tokens(s) for s in schedulers])
            return route(request, schedulers)

        chosen.route = route
        result = Cluster(trace, replicas, chosen, SimOptions(skip_ahead=skip_ahead)).run()
        runs.append((seen, result.replica_of.tolist(), json.dumps(result.summary, sort_keys=True)))
        assert (sum(r.steps_skipped for r in result.replicas) > 0) == skip_ahead
    assert runs[0][0] == runs[1][0]
    assert runs[0][1:] == runs[1][1:]


@pytest.mark.parametrize("router", ["least-outstanding-tokens", "least-kv"])
def test_skip_ahead_under_vllm_v0_changes_no_routing_or_decision(router):
    # vllm-v0's pure decode steps are skipped too; a step that admits runs its prefills alone, so
    # it goes through schedule() even when a skip stops short of an arrival it must not pass
    trace = small_trace(60)
    runs = []
    for skip_ahead in (True, False):
        sinks = [[] for _ in range(3)]
        replicas = [(Scheduler(make_config("vllm-v0", num_gpu_blocks=24, block_size=4, record_decisions=True)),
                     LinearCost()) for _ in range(3)]
        result = Cluster(trace, replicas, make_router(router), SimOptions(skip_ahead=skip_ahead),
                         decision_sinks=[s.append for s in sinks]).run()
        runs.append((result.replica_of.tolist(), sinks, json.dumps(result.summary, sort_keys=True)))
        skipped = sum(getattr(r, "steps_skipped", 0) for r in result.replicas)
        assert (skipped > 0) == skip_ahead
    assert runs[0] == runs[1]


def test_cluster_refuses_shared_schedulers_and_bad_routes():
    sched = paged()
    with pytest.raises(ValueError, match="its own scheduler"):
        Cluster(small_trace(4), [(sched, LinearCost()), (sched, LinearCost())])

    class Broken(RoundRobin):
        def route(self, request, schedulers):
            return len(schedulers)

    with pytest.raises(ValueError, match="chose replica 2 of 2"):
        Cluster(small_trace(4), [(paged(), LinearCost()), (paged(), LinearCost())], Broken()).run()


def test_requests_subset_keeps_the_selected_rows():
    m = RequestMetrics(5)
    m.arrival_s[:] = np.arange(5.0)
    m.status[:] = [COMPLETED, REJECTED, COMPLETED, REJECTED, COMPLETED]
    m.reject_reasons = {1: "too long", 3: "too wide"}
    sub = requests_subset(m, np.array([False, True, True, True, False]))
    assert sub.arrival_s.tolist() == [1.0, 2.0, 3.0]
    assert sub.status.tolist() == [REJECTED, COMPLETED, REJECTED]
    assert sub.reject_reasons == {0: "too long", 2: "too wide"}
    assert len(sub.n) == len(sub.preemptions) == 3
    assert m.arrival_s.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]  # the original is untouched


def test_arrivals_are_read_in_chunks():
    values = np.arange(10, dtype=float) / 3
    assert list(iter_chunked(values, chunk=4)) == values.tolist()


def test_a_study_grid_runs_clusters():
    from pagesim.reports.runner import run_one
    from pagesim.reports.spec import parse_spec

    spec = parse_spec("[source]\nworkload = 'shared-system-prompt'\nrate = 12.0\nnum_requests = 30\n[base]\n"
                      "kv_cache_gb = 1.0\nprefix_caching = true\n[[grid]]\nreplicas = [1, 2]\n"
                      "router = ['round-robin', 'prefix-affinity']")
    records = {(r["config"]["replicas"], r["config"]["router"]): r for r in map(run_one, spec.runs())}
    assert all(r["status"] == "ok" for r in records.values()), [r.get("error") for r in records.values()]
    assert records[1, "round-robin"]["summary"] == records[1, "prefix-affinity"]["summary"]  # one replica: no routing
    for router in ("round-robin", "prefix-affinity"):
        s = records[2, router]["summary"]
        assert s["router"] == router and sum(r["requests_routed"] for r in s["replicas"]) == 30


# ------------------------------------------------------------------------------------- CLI
CLI_WORKLOAD = ["--workload", "kwon2023-alpaca", "--rate", "20", "--num-requests", "200"]




def test_cli_cluster_summary(capsys):
    s = simulate_json(capsys, *CLI_WORKLOAD, "--replicas", "4", "--router", "prefix-affinity", "--tp", "2")
    assert s["router"] == "prefix-affinity" and len(s["replicas"]) == 4
    assert sum(r["requests_routed"] for r in s["replicas"]) == s["requests_total"] == 200
    assert sum(r["requests_completed"] for r in s["replicas"]) == s["requests_completed"]
    assert [r["replica"] for r in s["replicas"]] == [0, 1, 2, 3] and {r["tp"] for r in s["replicas"]} == {2}
    for r in s["replicas"]:
        assert {"throughput_rps", "ttft_s", "tpot_s", "e2e_s", "preemptions", "steps", "memory_utilization",
                "num_gpu_blocks", "kv_cache_slots"} <= set(r)


def test_cli_one_replica_is_todays_output(capsys):
    plain = simulate_json(capsys, *CLI_WORKLOAD)
    one = simulate_json(capsys, *CLI_WORKLOAD, "--replicas", "1", "--router", "least-kv")
    plain.pop("sim_wall_s"), one.pop("sim_wall_s")
    assert one == plain


def test_cli_cluster_out_files(capsys, tmp_path):
    out = tmp_path / "run"
    rc, stdout, err = simulate(capsys, *CLI_WORKLOAD, "--replicas", "2", "--router", "least-kv", "--out", str(out))
    assert rc == 0, err
    assert "replica  tp  routed" in stdout and "behind router least-kv" in stdout
    names = {p.name for p in out.iterdir()}
    assert names == {"summary.json", "run_info.json", "requests.csv", "steps.csv", "timeline.json",
                     "decisions-replica-0.jsonl", "decisions-replica-1.jsonl"}
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(out / "steps.csv", newline="") as f:
        steps = list(csv.DictReader(f))
    for k, replica in enumerate(summary["replicas"]):
        assert sum(r["replica"] == str(k) for r in rows) == replica["requests_routed"]
        mine = [s for s in steps if s["replica"] == str(k)]
        assert len(mine) == replica["steps"]
        records = [json.loads(line) for line in (out / f"decisions-replica-{k}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [int(s["step"]) for s in mine]
    info = json.loads((out / "run_info.json").read_text())
    assert info["cluster"] == {"replicas": 2, "router": {"name": "least-kv"}}
    pids = {e["pid"] for e in json.loads((out / "timeline.json").read_text())["traceEvents"] if e["ph"] == "X"}
    assert pids == {1, 3}


@pytest.mark.parametrize("args, message", [
    (["--replicas", "0"], "--replicas must be >= 1, got 0"),
    (["--replicas", "2", "--router", "least-kv", "--affinity-slack", "2"], "apply to --router prefix-affinity only"),
    (["--replicas", "2", "--router", "prefix-affinity", "--affinity-slack", "0.5"], "--affinity-slack must be"),
    (["--router", "random"], "invalid choice: 'random'"),
])
def test_cli_cluster_errors_are_one_line(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, *CLI_WORKLOAD, *args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("pagesim simulate: error: ") and message in last


@pytest.mark.parametrize("router", ["round-robin"])
def test_routing_ahead_for_a_stateless_router_changes_nothing(router, monkeypatch):
    """A router that never reads state routes ahead and bounds each replica's skip-ahead by its own
    arrivals: decisions and summaries equal those with skip-ahead off (every step one by one)."""
    trace = generate(workload_spec("kwon2023-sharegpt", rate_rps=40, num_requests=120, seed=4))
    results = []
    for skip_ahead in (True, False):
        builts = build_replicas(RunSpec(model="llama3-8b", gpu="a100-80gb", record_decisions=True), 3)
        logs = [[] for _ in builts]
        cluster = Cluster(trace, [(b.scheduler, b.cost_model) for b in builts], make_router(router),
                          SimOptions(skip_ahead=skip_ahead), decision_sinks=[log.append for log in logs])
        result = cluster.run()
        results.append((result.summary, logs, result.replica_of.tolist(),
                        sum(r.steps_skipped for r in result.replicas)))
    assert results[0][:3] == results[1][:3]
    assert results[0][3] > 0
