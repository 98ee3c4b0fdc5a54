"""``GET /metrics``: what the served replicas do, under vLLM 0.33's Prometheus names and labels.

vLLM V1's ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py, buckets from
vllm/v1/metrics/buckets.py, 0.33) labels every series ``model_name`` (the served name) and ``engine``
(the data-parallel rank: here the replica's index). pagesim exports the series it knows with the
same names, types, labels and buckets, through ``prometheus_client`` on a registry of the server's
own, so a dashboard or an autoscaler built for vLLM reads them unchanged:

- at each scrape, from the schedulers as they are: ``vllm:num_requests_running`` / ``_waiting``
  (plus pagesim's ``pagesim:num_requests_swapped``: vLLM V1 has no swap),
  ``vllm:kv_cache_usage_perc`` (blocks held by requests over all blocks: cached blocks nobody holds
  count as free, as vLLM's ``BlockPool.get_usage``);
- per step, as it is scheduled (``step``): ``vllm:prefix_cache_queries`` / ``_hits`` (prompt tokens looked up at an
  admission, and found), ``vllm:num_preemptions``, ``vllm:iteration_tokens_total`` (tokens
  computed in the step, generated ones included);
- per token (``token``): ``vllm:generation_tokens``, ``vllm:inter_token_latency_seconds``;
- per finished request (``finished``): ``vllm:prompt_tokens``, ``vllm:request_success`` by
  ``finished_reason``, and the latency histograms (TTFT, E2E, queue, prefill, decode, inference,
  time per output token) and token-count histograms. As in vLLM, a request its client abandoned
  counts in none of them (vLLM's output processor drops it before its stats are recorded);
- the clock: ``pagesim:wall_clock_lag_seconds`` (the latest event's), ``_max_seconds`` and
  ``pagesim:late_events`` (``clock.py``),
  ``pagesim:requests_in_flight``.

Latencies are the simulated server's (in simulated seconds: wall seconds over ``--time-scale``),
from the request table: TTFT and E2E include the serving path's frontend terms, as ``simulate``
reports them.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pagesim.sim.metrics import COMPLETED, TIMED_OUT

CONTENT_TYPE = CONTENT_TYPE_LATEST
# vllm/v1/metrics/buckets.py (0.33)
REQUEST_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0]
TIME_TO_FIRST_TOKEN = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                       20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
INTER_TOKEN_LATENCY = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                       40.0, 80.0]
ITERATION_TOKENS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
REQUEST_PARAMS_N = [1, 2, 5, 10, 20]
REQUEST_NUM_PREEMPTIONS = [1, 2, 3, 4, 5, 10, 20]
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def request_token_buckets(max_model_len: int) -> list[int]:
    """vLLM's 1-2-5 series up to ``max_model_len`` (2048: 1, 2, 5, ..., 1000, 2000)."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return buckets
            buckets.append(value)
        exponent += 1


#: The labelled series: (key, type, vLLM's name, its help text, buckets for a histogram: a list, or
#: "tokens" for the 1-2-5 series up to max_model_len). Each exists from the start, at zero, per replica.
SERIES: tuple[tuple[str, type, str, str, object], ...] = (
    ("running", Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.", None),
    ("waiting", Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", None),
    ("swapped", Gauge, "pagesim:num_requests_swapped", "Requests swapped out to CPU memory (vLLM v0's swap).", None),
    ("kv_usage", Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", None),
    ("prefix_queries", Counter, "vllm:prefix_cache_queries",
     "Prefix cache queries, in terms of number of queried tokens.", None),
    ("prefix_hits", Counter, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", None),
    ("preemptions", Counter, "vllm:num_preemptions", "Cumulative number of preemption from the engine.", None),
    ("prompt_tokens", Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.", None),
    ("generation_tokens", Counter, "vllm:generation_tokens", "Number of generation tokens processed.", None),
    ("iteration_tokens", Histogram, "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
     ITERATION_TOKENS),
    ("request_prompt", Histogram, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", "tokens"),
    ("request_generation", Histogram, "vllm:request_generation_tokens", "Number of generation tokens processed.",
     "tokens"),
    ("request_max_tokens", Histogram, "vllm:request_params_max_tokens",
     "Histogram of the max_tokens request parameter.", "tokens"),
    ("request_n", Histogram, "vllm:request_params_n", "Histogram of the n request parameter.", REQUEST_PARAMS_N),
    ("request_preemptions", Histogram, "vllm:request_num_preemptions", "Number of preemptions per request.",
     REQUEST_NUM_PREEMPTIONS),
    ("ttft", Histogram, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     TIME_TO_FIRST_TOKEN),
    ("itl", Histogram, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     INTER_TOKEN_LATENCY),
    ("tpot", Histogram, "vllm:request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request.", INTER_TOKEN_LATENCY),
    ("e2e", Histogram, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
     REQUEST_LATENCY),
    ("queue", Histogram, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
     REQUEST_LATENCY),
    ("inference", Histogram, "vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY),
    ("prefill", Histogram, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
     REQUEST_LATENCY),
    ("decode", Histogram, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
     REQUEST_LATENCY),
)


class ServeMetrics:
    """The registry and its series for the replicas ``engines`` names (replica index -> its ``engine``
    label: every replica behind one port, ``{k: "k"}``; one replica on a port of its own, ``{k: "0"}``,
    as a vLLM server of its own labels itself), serving ``model_name``. ``attach`` gives it the
    ``ServeEngine`` it reads at each scrape (the engine is built with its metrics)."""

    def __init__(self, model_name: str, engines: dict[int, str], max_model_len: int):
        self.registry = registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self._engine = None
        self._labels = {k: (model_name, label) for k, label in engines.items()}
        tokens = request_token_buckets(max_model_len)
        self._series = {}  # (key, replica) or ("success", reason, replica) -> the labelled series
        for key, kind, name, doc, buckets in SERIES:
            if kind is Histogram:
                family = Histogram(name, doc, labels, buckets=tokens if buckets == "tokens" else buckets,
                                   registry=registry)
            else:
                family = kind(name, doc, labels, registry=registry)
            for k, values in self._labels.items():
                self._series[key, k] = family.labels(*values)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*labels, "finished_reason"], registry=registry)
        for k, values in self._labels.items():
            for reason in FINISHED_REASONS:
                self._series["success", reason, k] = success.labels(*values, reason)
        self.lag = Gauge("pagesim:wall_clock_lag_seconds", "How late the simulation processed its latest event against "
                         "the wall clock (wall seconds).", registry=registry)
        self.max_lag = Gauge("pagesim:wall_clock_lag_max_seconds", "The most the simulation has been behind the wall "
                             "clock since the server started (wall seconds).", registry=registry)
        self.late = Gauge("pagesim:late_events", "Simulation events processed more than 10 ms (wall) late.",
                          registry=registry)
        self.in_flight = Gauge("pagesim:requests_in_flight", "Requests sent to the engine and not yet finished.",
                               registry=registry)

    def attach(self, engine) -> None:
        self._engine = engine

    # ---------------------------------------------------------------- from the engine
    def step(self, k: int, scheduler, out, usage) -> None:
        s = self._series
        if out.new or out.resumed:  # (the tokens each admission looked up: its prompt, or all it had on a resume)
            requests = scheduler.requests
            queried = sum(requests[rid].prompt_len for rid in out.new if rid in requests)
            for rid in out.resumed:
                request = requests.get(rid)
                if request is not None:
                    queried += max((seq.num_tokens for seq in request.live_seqs), default=request.prompt_len)
            s["prefix_queries", k].inc(queried)
            s["prefix_hits", k].inc(sum(out.new.values()) + sum(out.resumed.values()))
        if out.preempted:
            s["preemptions", k].inc(len(out.preempted))
        computed = out.total_num_scheduled_tokens
        if computed:
            s["iteration_tokens", k].observe(computed)

    def token(self, served, now_wall: float) -> None:
        s = self._series
        k = served.replica
        s["generation_tokens", k].inc()
        if served.token_wall_s == served.token_wall_s:  # (not the first: a gap to the previous one, simulated)
            s["itl", k].observe((now_wall - served.token_wall_s) / self._engine.clock.time_scale)

    def finished(self, served, table, row: int, status: int, reason: str | None) -> None:
        """Request ``served`` ended with ``status`` (row ``row`` of ``table``, read before it is reused)."""
        if status == TIMED_OUT:  # abandoned by its client: vLLM records no stats for it
            return
        s = self._series
        k = served.replica
        if status != COMPLETED:  # refused by the engine after it was sent
            s["success", "error", k].inc()
            return
        arrival, scheduled = table.arrival_s[row], table.first_scheduled_s[row]
        first, finish = table.first_token_s[row], table.finish_s[row]
        generated = int(table.output_tokens[row])
        s["prompt_tokens", k].inc(served.prompt_len)
        s["success", "stop" if served.stopped else "length", k].inc()
        s["request_prompt", k].observe(served.prompt_len)
        s["request_generation", k].observe(generated)
        s["request_max_tokens", k].observe(served.max_tokens)
        s["request_n", k].observe(len(served.lengths))
        s["request_preemptions", k].observe(int(table.preemptions[row]))
        for name, value in (("ttft", first - arrival), ("e2e", finish - arrival), ("queue", scheduled - arrival),
                            ("inference", finish - scheduled), ("prefill", first - scheduled),
                            ("decode", finish - first)):
            if math.isfinite(value):
                s[name, k].observe(max(0.0, value))
        length = int(table.generation_len[row])
        s["tpot", k].observe((finish - first) / (length - 1) if length > 1 else 0.0)

    # ---------------------------------------------------------------- scrape
    def exposition(self) -> bytes:
        engine = self._engine
        if engine is not None:
            s = self._series
            for k in self._labels:  # (the queues and the cache as they are now)
                scheduler = engine.schedulers[k]
                usage = scheduler.kv_usage()
                s["running", k].set(len(scheduler.running))
                s["waiting", k].set(len(scheduler.waiting))
                s["swapped", k].set(len(scheduler.swapped))
                s["kv_usage", k].set(usage.allocated_slots / usage.total_slots if usage.total_slots else 0.0)
            self.lag.set(engine.lag_s)
            self.max_lag.set(engine.max_lag_s)
            self.late.set(engine.late_events)
            self.in_flight.set(sum(engine.in_flight(k) for k in self._labels))
        return generate_latest(self.registry)
