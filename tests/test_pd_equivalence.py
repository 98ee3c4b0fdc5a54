"""One policy, two executors, disaggregated: the engine in lockstep writes the simulator's decision
logs for both instances.

The simulator runs a prefill and a decode replica of the ``tiny`` model (roofline costs, a slow
KV link so reads span steps) on a workload with shared prefixes and small caches (the decode side
preempts, both sides hit their prefix caches). From its tables and logs comes the ``PdSchedule``
the engine replays: the step each request reached each instance (``release_step``), the decode
step that saw each read done (``kv_received``) and the prefill step that saw each send freed
(``kv_freed``; a send freed after the prefill instance's last step is in no record, and frees
nothing the engine still needs). The engine (validation mode: freed blocks are NaN; KV copied
between two real caches) must then write both decision logs record for record, and its decode
outputs must equal the no-paging reference.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from pagesim.engine.model_presets import get_model_preset
from pagesim.engine.policy import Scheduler, make_config
from pagesim.engine.runtime import Engine, SamplingParams
from pagesim.engine.runtime.disagg import DisaggEngine, PdSchedule
from pagesim.engine.runtime.reference import check_outputs
from pagesim.reports.validation import runs
from pagesim.sim.cost.roofline import RooflineCostModel, RooflineParams
from pagesim.sim.deployment import Deployment
from pagesim.sim.disagg.cluster import DisaggCluster, Pool
from pagesim.sim.disagg.network import GB, NetworkSpec
from pagesim.sim.hardware import get_gpu_preset
from pagesim.sim.metrics import COMPLETED
from pagesim.sim.simulator import SimOptions
from pagesim.traces.trace import Trace
from tests.engine_support import TINY, tiny_model

BLOCK = 4


pytestmark = pytest.mark.usefixtures("one_thread")


def config(num_gpu_blocks: int):
    return make_config("vllm-v1", block_size=BLOCK, num_gpu_blocks=num_gpu_blocks, kv_connector="nixl",
                       max_model_len=TINY.max_position_embeddings, enable_prefix_caching=True, record_decisions=True)


def workload(num: int = 12, seed: int = 0) -> Trace:
    """Prompts of two shared system prompts (identities of BLOCK tokens) and private blocks."""
    rng = np.random.default_rng(seed)
    systems = [[100, 101, 102], [200, 201]]
    values, offsets, prompts = [], [0], []
    for i in range(num):
        private = int(rng.integers(1, 4))
        ids = systems[i % 2] + [1000 + 10 * i + k for k in range(private)]
        values.extend(ids)
        offsets.append(len(values))
        prompts.append(len(ids) * BLOCK - int(rng.integers(0, BLOCK)))  # (not block-aligned, mostly)
    return Trace(arrival_s=np.cumsum(rng.exponential(0.002, num)), prompt_len=np.array(prompts),
                 output_len=rng.integers(4, 14, num), prefix_id_values=np.array(values),
                 prefix_id_offsets=np.array(offsets), prefix_block_tokens=BLOCK, source="test")


def simulate(trace: Trace, p_blocks: int, d_blocks: int):
    cost = RooflineCostModel(Deployment(get_model_preset("tiny"), get_gpu_preset("a100-40gb"), 1), RooflineParams())
    gpu = get_gpu_preset("a100-40gb")
    logs: tuple[list[str], list[str]] = ([], [])
    cluster = DisaggCluster(trace, Pool([(Scheduler(config(p_blocks)), cost)], gpu, 1, 10**6),
                            Pool([(Scheduler(config(d_blocks)), cost)], gpu, 1, 10**6),
                            options=SimOptions(seed=0, sample_lengths="same"),
                            network=NetworkSpec(gpus_per_node=1, bandwidth_bytes_per_s=0.5 * GB),
                            decision_sinks=([logs[0].append], [logs[1].append]))
    result = cluster.run()
    return result, [json.loads(line) for line in logs[0]], [json.loads(line) for line in logs[1]]


def schedule_of(result, p_log, d_log) -> PdSchedule:
    rows = range(len(result.requests.status))
    read_done = {rid: rec["step"] for rec in d_log for rid in rec["kv_received"]}
    freed = {rid: rec["step"] for rec in p_log for rid in rec["kv_freed"]}
    last = p_log[-1]["step"] + 1
    return PdSchedule(prefill={f"r{i}": int(result.prefill_requests.release_step[i]) for i in rows},
                      decode={f"r{i}": int(result.requests.release_step[i]) for i in rows},
                      read_done=read_done, freed={f"r{i}": freed.get(f"r{i}", last) for i in rows})


@pytest.mark.parametrize("seed, p_blocks, d_blocks", [(0, 24, 16), (1, 14, 12), (2, 40, 40)])
def test_the_engine_in_lockstep_writes_both_instances_decision_logs(seed, p_blocks, d_blocks):
    trace = workload(seed=seed)
    result, p_log, d_log = simulate(trace, p_blocks, d_blocks)
    assert (result.requests.status == COMPLETED).all()
    pd = DisaggEngine(Engine(tiny_model(), config(p_blocks), backend="torch", validate=True),
                      Engine(tiny_model(), config(d_blocks), backend="torch", validate=True))
    requests = runs.engine_requests(trace, TINY.vocab_size)
    pd.run_lockstep([copy.deepcopy(r) for r in requests], schedule_of(result, p_log, d_log))
    assert list(pd.prefill.scheduler.decision_log) == p_log
    assert list(pd.decode.scheduler.decision_log) == d_log
    outputs = {rid: r.outputs for rid, r in pd.records.items() if r.status == "completed"}
    report = check_outputs(pd.decode.model, requests, outputs, lambda r: SamplingParams())
    assert report.match and report.checked_requests == len(trace), report.to_dict()
    if seed == 1:  # (the small caches: the decode side preempts; reads span steps; both sides hit)
        assert sum(rec["preempted"] != [] for rec in d_log) > 0
        assert any(rec["parked"] for rec in d_log)
        assert result.prefill[0].scheduler.num_prefix_hit_tokens > 0
        assert result.decode[0].scheduler.num_prefix_hit_tokens > 0


def test_a_read_reported_one_step_late_is_caught():
    trace = workload(seed=1)
    result, p_log, d_log = simulate(trace, 14, 12)
    schedule = schedule_of(result, p_log, d_log)
    late = dict(schedule.read_done)
    first = next(iter(late))
    late[first] += 1
    pd = DisaggEngine(Engine(tiny_model(), config(14), backend="torch", validate=True),
                      Engine(tiny_model(), config(12), backend="torch", validate=True))
    pd.run_lockstep([copy.deepcopy(r) for r in runs.engine_requests(trace, TINY.vocab_size)],
                    PdSchedule(prefill=schedule.prefill, decode=schedule.decode, read_done=late, freed=schedule.freed))
    assert list(pd.decode.scheduler.decision_log) != d_log
