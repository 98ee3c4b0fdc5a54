"""What ``pagesim simulate --out DIR`` writes, and the readable summary it prints.

- ``summary.json``: the run's metrics (deterministic: same inputs and seed, same bytes);
- ``run_info.json``: what ran (deployment, scheduler settings, cost model, trace, versions) and
  the wall-clock time, which is not deterministic and so kept out of the summary;
- ``requests.csv`` and ``steps.csv``: the per-request and per-step tables (``pagesim.sim.metrics``);
- ``decisions.jsonl``: the scheduler's decision log, one record per step (streamed during the run);
- ``timeline.json``: a Chrome / Perfetto trace (open in ui.perfetto.dev): one slice per step on
  the replica's track with its batch, and each request as an async span, queued then running.

The folder is built whole beside DIR and renamed into place (``pagesim.engine.atomic.OutputFolder``), so
an interrupted run never leaves a truncated file, nor a new file beside an old one, under DIR; a
DIR holding files other than these is refused rather than replaced.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from pagesim.engine.outputs import OutputFile
from pagesim.sim.bench_metrics import Slo
from pagesim.sim.cost.base import TERMS
from pagesim.sim.metrics import COMPLETED, REJECTED, REQUEST_COLUMNS, STEP_COLUMNS, TIMED_OUT

_STATUS = {0: "pending", COMPLETED: "completed", REJECTED: "rejected", TIMED_OUT: "timed_out"}
# what --out DIR holds (shell patterns): a DIR holding only these may be replaced by a new run's
OUT_FILES = ("summary.json", "run_info.json", "requests.csv", "steps.csv", "decisions.jsonl",
             "decisions-replica-*.jsonl", "decisions-prefill-*.jsonl", "decisions-decode-*.jsonl", "timeline.json")


def atomic_write(path: Path | OutputFile, write) -> None:
    """One text file written whole by ``write(f)`` (a file outside an ``OutputFolder`` too):
    staged beside ``path`` under a fresh name and renamed, or streamed to a device or FIFO
    (``pagesim.engine.outputs``); after a failure no half-written file is left behind."""
    output = path if isinstance(path, OutputFile) else OutputFile(path)
    with output.open(newline="") as f:
        write(f)


def write_json(path: Path, obj) -> None:
    atomic_write(path, lambda f: (json.dump(obj, f, indent=2, sort_keys=True), f.write("\n")))


def write_tables(out: Path, result, request_ids: list[str], *, block_bytes: int = 0,
                 replica_of: np.ndarray | None = None) -> None:
    """``block_bytes``: bytes of one KV block per GPU, to state swap traffic in bytes.
    ``replica_of`` (a cluster run: each row's replica) adds a last ``replica`` column to
    ``requests.csv`` and a first one to ``steps.csv`` (whose rows go replica by replica)."""
    m = result.requests
    ttft, tpot, e2e = m.ttft_s(), m.tpot_s(), m.e2e_s()
    with np.errstate(invalid="ignore", divide="ignore"):
        normalized = e2e / m.generation_len

    def fmt(x) -> str:
        return "" if x is None or (isinstance(x, float) and not np.isfinite(x)) else repr(float(x))

    def write_requests(f):
        w = csv.writer(f)
        extra = ("replica",) if replica_of is not None else ()
        w.writerow(REQUEST_COLUMNS + ("normalized_latency_s_per_token", "reject_reason") + extra)
        for i, rid in enumerate(request_ids):
            w.writerow([rid, fmt(m.arrival_s[i]), int(m.prompt_tokens[i]), int(m.output_tokens[i]),
                        int(m.generation_len[i]), int(m.n[i]), int(m.beam_width[i]), _STATUS[int(m.status[i])],
                        fmt(m.first_scheduled_s[i]), fmt(m.first_token_s[i]), fmt(m.finish_s[i]), fmt(ttft[i]),
                        fmt(tpot[i]), fmt(e2e[i]), int(m.preemptions[i]), fmt(normalized[i]),
                        m.reject_reasons.get(i) or m.timeout_reasons.get(i, ""),  # (why it failed, either way)
                        *([int(replica_of[i])] if extra else [])])

    def write_steps(f):
        steps = result.steps
        derived = {  # spelled out for readers of the table
            "free_slots": steps.array("total_slots") - steps.array("allocated_slots") - steps.array("cached_slots"),
            "internal_fragmentation_slots": steps.array("allocated_slots") - steps.array("used_slots"),
            "swap_out_bytes": steps.array("swap_out_blocks") * block_bytes,
            "swap_in_bytes": steps.array("swap_in_blocks") * block_bytes,
        }
        lead = {"replica": steps.replica_index()} if replica_of is not None else {}
        names = tuple(lead) + STEP_COLUMNS + tuple(derived)
        w = csv.writer(f)
        w.writerow(names)
        cols = list(lead.values()) + [steps.array(name) for name in STEP_COLUMNS] + list(derived.values())
        ints = {name for name in names if not name.endswith("_s")}
        for row in zip(*cols):
            w.writerow([int(v) if name in ints else repr(float(v)) for name, v in zip(names, row)])

    atomic_write(out / "requests.csv", write_requests)
    atomic_write(out / "steps.csv", write_steps)


def write_timeline(path: Path, result, request_ids: list[str], *, max_requests: int = 20_000,
                   step_replica: np.ndarray | None = None) -> None:
    """Chrome trace events (microseconds). Requests beyond ``max_requests`` are left out of the
    request tracks (steps are all kept) so the file stays loadable. ``step_replica`` (a cluster
    run: each step's replica) puts replica k's steps on a track of its own (pid 1 for replica 0,
    as in a single-replica run; pid k + 2 for the others, pid 2 being the requests)."""
    steps = result.steps
    start, dur = steps.array("start_s"), steps.array("duration_s")
    batch, tokens = steps.array("num_requests"), steps.array("num_tokens")
    m = result.requests
    replica = np.zeros(len(start), np.int64) if step_replica is None else step_replica
    pids = [1] + [k + 2 for k in range(1, int(replica.max(initial=0)) + 1)]

    def write(f):
        f.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        f.write(json.dumps({"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "replica 0"}}))
        f.write(",\n" + json.dumps({"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "requests"}}))
        for k, pid in enumerate(pids[1:], start=1):
            f.write(",\n" + json.dumps({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"replica {k}"}}))
        for i in range(len(start)):
            f.write(",\n" + json.dumps({"ph": "X", "pid": pids[replica[i]], "tid": 1, "name": "step",
                                        "ts": round(start[i] * 1e6, 3),
                                        "dur": round(dur[i] * 1e6, 3),
                                        "args": {"requests": int(batch[i]), "tokens": int(tokens[i])}}))
        for i, rid in enumerate(request_ids[:max_requests]):
            if m.status[i] != COMPLETED:
                continue
            for name, t0, t1 in (("queued", m.arrival_s[i], m.first_scheduled_s[i]),
                                 ("running", m.first_scheduled_s[i], m.finish_s[i])):
                common = {"pid": 2, "tid": 1, "cat": "request", "id": i, "name": f"{rid} {name}"}
                f.write(",\n" + json.dumps({**common, "ph": "b", "ts": round(t0 * 1e6, 3)}))
                f.write(",\n" + json.dumps({**common, "ph": "e", "ts": round(t1 * 1e6, 3)}))
        f.write("\n]}\n")

    atomic_write(path, write)


def plain(x, digits: int = 4) -> str:
    """``x`` in plain digits, grouped by thousands, to about ``digits`` significant figures and
    never in exponent notation: 21,030; 1,166; 5.522; 0.05188; 0 (``-`` for ``None``)."""
    if x is None:
        return "-"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return f"{int(x):,}"
    x = float(x)
    if not np.isfinite(x):
        return str(x)
    magnitude = abs(x)
    if magnitude >= 10 ** (digits - 1) or magnitude == 0:
        return f"{x:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(magnitude))
    text = f"{x:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def pct(x) -> str:
    """A fraction as a percentage with one decimal (``-`` for ``None``)."""
    return "-" if x is None else f"{100 * x:.1f}%"


def _path_words(info: dict) -> str:
    """The serving path and the attention kernel, in words (``pagesim.sim.serving_path``)."""
    from pagesim.sim.serving_path import ServingPath, path_words

    path = info.get("options", {}).get("serving_path")  # (run_info's form: the path's settings)
    kernel = info["deployment"].get("cost_model", {}).get("params", {}).get("block_overhead_tokens")
    words = path_words(ServingPath(**path) if path else None)
    if kernel == 0:
        words += "; paged decode as today's kernels run it (no per-block cost)"
    elif kernel is not None:
        words += f"; paged decode paying {kernel:g} tokens' worth of reading per block"
    return words


def _profile_words(summary: dict) -> str:
    """The calibration profile a run took, in words (its summary's ``profile``)."""
    profile = summary["profile"]
    if profile["kind"] == "fitted":
        return f"roofline with parameters from the {profile['words']}"
    return f"calibrated: kernel-timed profile {profile['path']}"


def summary_table(summary: dict, info: dict, wall_s: float) -> str:
    """The readable summary ``pagesim simulate`` prints without ``--json`` (every number in plain,
    grouped digits: ``plain``)."""
    s = summary
    num = plain
    d = info["deployment"]
    rejected = rejection_words(s)
    timed_out = timed_out_words(s)  # "N timed out after S s", or None
    lines = [
        *([f"NOTE: {rejected}", ""] if rejected else []),
        f"{info['trace']}",
        f"{d['model']} on {d['gpu']} x{d['tp']}{_cluster_words(s)}, {d['allocator']} KV cache: {d['num_gpu_blocks']:,} blocks "
        f"of {d['block_size']} tokens ({d['kv_cache_source']}), policy {d['policy']}",
        *([f"settings   {d['batch_limits']}; {_path_words(info)}"] if "batch_limits" in d else []),
        *([f"cost model {_profile_words(s)}"] if s.get("profile") else []),
        "",
        f"requests   {s['requests_completed']:,} completed, {s['requests_rejected']:,} rejected, "
        f"{timed_out + ', ' if timed_out else ''}over {num(s['duration_s'])} s simulated",
        *(f"           rejected x{count:,}: {reason}" for reason, count in s["rejection_reasons"].items()),
        f"throughput {num(s['throughput_rps'])} req/s; output {num(s['throughput_tokens_s'])} tokens/s, input "
        f"{num(s['throughput_input_tokens_s'])}, total {num(s['throughput_total_tokens_s'])}; peak "
        f"{s['max_concurrent_requests']:,} requests in flight, {num(s['max_output_tokens_per_s'])} output tokens in one "
        "second",
        f"goodput    {num(s['goodput_rps'])} req/s ({slo_words(s['slo'])}: met by {s['slo']['met']:,} of "
        f"{s['requests_total']:,} requests submitted, {pct(s['slo']['attained'])})",
        "",
        f"{'latency (s)':<14}{'mean':>10}{'median':>10}{'std':>10}{'p90':>10}{'p99':>10}",
    ]
    for label, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("end-to-end", "e2e_s"),
                       ("queueing", "queueing_s")):
        row = s[key]
        lines.append(f"{label:<14}" + "".join(f"{num(row[k]):>10}" for k in ("mean", "median", "std", "p90", "p99")))
    lines += [
        f"normalized latency {num(s['normalized_latency_s_per_token'])} s/token",
        "",
        f"memory     {memory_words(s)}",
        f"batch      {num(s['avg_batched_requests'])} requests computing per step, {num(s['avg_running_requests'])} "
        f"running, on average over {s['steps']:,} steps",
        f"preemption {s['preemptions']['swap']:,} swap, {s['preemptions']['recompute']:,} recompute; blocks swapped "
        f"out {s['swapped_blocks']['out']:,}, in {s['swapped_blocks']['in']:,}; copy-on-write copies {s['cow_copies']:,}",
        *prefix_lines(s),
        *([_offload_line(s, d, pct)] if "offload_blocks" in s else []),
    ]
    busy = sum(s["time_by_term_s"].values()) or 1.0
    parts = [f"{t.replace('_', ' ')} {100 * s['time_by_term_s'][t] / busy:.1f}%" for t in TERMS
             if s["time_by_term_s"][t] > 0]
    lines.append(f"step time  {', '.join(parts)}")
    if "replicas" in s:
        lines += ["", *_replica_lines(s, num, pct)]
    rate = s["requests_total"] / wall_s if wall_s > 0 else float("inf")
    lines += ["", f"simulated in {wall_s:.2f} s wall ({rate:,.0f} requests per wall second)"]
    return "\n".join(lines)


def memory_words(s: dict) -> str:
    """The memory line: how much of the cache was allocated, and how much of that held tokens
    (``memory_utilization`` is the second: a share of the *allocated* slots, not of the cache)."""
    return (f"{pct(s['memory_allocated_fraction'])} of the cache's slots allocated on average; "
            f"{pct(s['memory_utilization'])} of allocated slots holding tokens; prefix sharing saved "
            f"{pct(s['sharing_saved'])}")


def prefix_lines(s: dict) -> list[str]:
    """The prefix cache's lines: the hit rate beside the best any eviction policy could do at this
    cache size (``pagesim.sim.ideal_cache``), and the evictions beside what they cost: the hit blocks
    later requests asked for and missed, against plain recycling (``pagesim.sim.metrics``)."""
    hit = f"prefix     hit rate {pct(s['prefix_hit_rate'])} of admitted prompt tokens"
    if s.get("prefix_reusable_blocks") == 0:
        hit += "; no prompt shares a block with a later one (nothing to hit, whatever the eviction policy)"
    elif s.get("ideal_hit_rate") is not None:
        hit += (f"; the best any eviction policy could do at this cache size {pct(s['ideal_hit_rate'])} (an ideal "
                f"cache of {s['ideal_cache_blocks']:,} blocks), with no evictions at all "
                f"{pct(s['infinite_cache_hit_rate'])} ({s['prefix_reusable_blocks']:,} blocks a later request "
                "could hit)")
    evicted = s["prefix_evictions"]
    missed = s.get("prefix_hit_blocks_missed")
    if missed is None:
        return [hit, f"           {evicted:,} cached blocks evicted" if evicted else "           no cached block evicted"]
    if not evicted:
        return [hit, "           no cached block evicted" + (
            f"; {missed:,} hit blocks missed, asked for while the request computing them was still being prefilled"
            if missed else "")]
    return [hit, f"           {evicted:,} cached blocks evicted; {missed:,} hit blocks lost (asked for again after an "
                 f"eviction), so at least {s['prefix_evictions_recycled']:,} evictions were plain recycling (content "
                 "never asked for again)"]


def _offload_line(s: dict, deployment: dict, pct) -> str:
    """The offload tier's line: its size, the hits per tier, the copies and the host link."""
    blocks = deployment["scheduler"]["num_offload_blocks"]  # one replica's store
    gib = blocks * deployment["kv_cache"]["block_bytes"] * deployment["tp"] / 2**30
    size = f"{blocks:,} blocks ({plain(gib)} GiB){' per replica' if 'replicas' in s else ''}"
    if deployment["scheduler"].get("offload_connector", "0.33") != "0.33":
        size += f", vLLM {deployment['scheduler']['offload_connector']}'s connector"
    return (f"offload    {size}: hits HBM {pct(s['hbm_hit_rate'])} + CPU {pct(s['offload_hit_rate'])} of admitted "
            f"prompt tokens; loaded {s['offload_loaded_blocks']:,} / stored {s['offload_stored_blocks']:,} blocks, "
            f"{s['offload_evictions']:,} evicted, {s['offload_refused_blocks']:,} refused; link busy "
            f"{pct(s['host_link_busy_fraction'])}, loads waited {plain(s['offload_load_wait_s'])} s{_parked_words(s)}")


def _parked_words(s: dict) -> str:
    """"; N requests parked for loads, mean M s, p99 P s" (nothing when none was parked)."""
    count = s.get("offload_parked_requests")
    if not count:
        return ""
    return (f"; {count:,} requests parked for loads, mean {plain(s['offload_parked_mean_s'])} s, "
            f"p99 {plain(s['offload_parked_p99_s'])} s")


def timed_out_words(summary: dict) -> str | None:
    """"N timed out after S s" when the clients' timeout aborted any request, else None."""
    count = summary.get("requests_timed_out")
    if not count:
        return None
    return f"{count:,} timed out after {plain(summary['request_timeout_s'])} s"


def rejection_words(summary: dict) -> str | None:
    """"K of N requests (P%) were rejected ...", or None when none were."""
    rejected, total = summary["requests_rejected"], summary["requests_total"]
    if not rejected:
        return None
    example = next(iter(summary["rejection_reasons"]), "")
    return (f"{rejected:,} of {total:,} requests ({100 * rejected / total:.1f}%) were rejected by the policy and never "
            f"served; they count as failed and as missing every SLO" + (f" (e.g. {example})" if example else ""))


def slo_words(slo: dict) -> str:
    """The summary's ``slo`` entry in words (``Slo.describe``)."""
    return Slo(slo.get("ttft_s"), slo.get("tpot_s"), slo.get("e2el_s")).describe()


def _cluster_words(summary: dict) -> str:
    replicas = summary.get("replicas")
    return f" per replica, {len(replicas)} replicas behind router {summary['router']}" if replicas else ""


def _replica_lines(summary: dict, num, pct) -> list[str]:
    """One row per replica of a cluster run (batch and step figures: the cluster-wide lines above
    average them per replica, weighted by step time)."""
    header = (f"{'replica':<8}{'tp':>3}{'routed':>8}{'done':>7}{'req/s':>8}{'TTFT p50':>10}{'TTFT p99':>10}"
              f"{'e2e mean':>10}{'preempt':>9}{'steps':>8}{'batch':>7}{'KV alloc':>10}{'prefix hit':>11}")
    lines = [header]
    for r in summary["replicas"]:
        preempted = r["preemptions"]["swap"] + r["preemptions"]["recompute"]
        lines.append(f"{r['replica']:<8}{r['tp']:>3}{r['requests_routed']:>8,}{r['requests_completed']:>7,}"
                     f"{num(r['throughput_rps'], 3):>8}{num(r['ttft_s']['p50']):>10}{num(r['ttft_s']['p99']):>10}"
                     f"{num(r['e2e_s']['mean']):>10}{preempted:>9,}{r['steps']:>8,}{num(r['avg_batched_requests'], 3):>7}"
                     f"{pct(r['memory_allocated_fraction']):>10}{pct(r['prefix_hit_rate']):>11}")
    return lines
