"""One inference-perf run, read whole: its configuration, its server, its figures, and its trace.

``read_inference_perf(path)`` reads the folder (``files.locate``), its ``config.yaml``
(``config.parse_config``), the experiment's ``exp-config.yaml`` when there is one, and every
lifecycle metrics file present; ``InferencePerfRun.trace(seed)`` rebuilds the requests the run
sent as a ``Trace`` (``schedule`` for the times, ``workload`` for the lengths and identities),
stage after stage, and ``stage_of_rows`` says which stage sent each row.

Invariants: ``measured_stages`` has a key for each ``stage_N_lifecycle_metrics.json`` present,
each ``N`` < ``len(stages)``; ``trace`` has ``sum(stage.num_requests)`` rows, those of stage 0
first; the same seed gives the same trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import numpy as np

from pagesim.traces.inference_perf.config import LoadStage, RunConfig, ensure_traceable, parse_config
from pagesim.traces.inference_perf.files import locate, metrics_files, read_json, read_yaml
from pagesim.traces.inference_perf.keys import Node
from pagesim.traces.inference_perf.metrics import MeasuredStage, parse_metrics
from pagesim.traces.inference_perf.schedule import stage_sends
from pagesim.traces.inference_perf.workload import rows
from pagesim.traces.trace import Trace

#: aiohttp's ClientSession timeout when ``load.request_timeout`` is null (ClientTimeout(total=300));
#: inference-perf passes its ``sentinel`` then (openai_client.py:90 at 3b6f82a)
AIOHTTP_DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ServerSettings:
    """The server an experiment ran, from its ``exp-config.yaml`` (None: not stated)."""

    model: str | None = None
    tensor_parallelism: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None


def _server(top: Node | None) -> ServerSettings:
    if top is None:
        return ServerSettings()
    counts = {name: top[name].optional_count(minimum=1, maximum=2**31)
              for name in ("tensor_parallelism", "max_model_len", "max_num_batched_tokens", "max_num_seqs")}
    return ServerSettings(model=top["model"].optional_text(), **counts)


@dataclass(frozen=True)
class InferencePerfRun:
    results_dir: Path
    model_name: str | None  # server.model_name (else tokenizer.pretrained_model_name_or_path)
    ignore_eos: bool
    streaming: bool
    request_timeout_s: float | None  # load.request_timeout (None when null or absent)
    stages: tuple[LoadStage, ...]
    workload: str  # one line: "shared_prefix: 10 groups x 10 prompts, 100 + 447 -> 248 tokens"
    server: ServerSettings
    measured_stages: dict[int, MeasuredStage]  # stage index -> figures (the files present)
    measured_summary: MeasuredStage | None  # summary_lifecycle_metrics.json
    config: RunConfig  # everything config.yaml said that the trace needs
    config_file: Path  # the config.yaml read

    @property
    def client_timeout_s(self) -> float:
        """The timeout each request ran under: ``request_timeout_s``, else aiohttp's 300 s."""
        return AIOHTTP_DEFAULT_TIMEOUT_S if self.request_timeout_s is None else self.request_timeout_s

    @property
    def num_requests(self) -> int:
        return sum(stage.num_requests for stage in self.stages)

    def trace(self, seed: int = 0, prefix_block_tokens: int = 16) -> Trace:
        """The requests the run sent, redrawn from ``seed`` (see ``schedule`` and ``workload``)."""
        if isinstance(prefix_block_tokens, bool) or not isinstance(prefix_block_tokens, (int, np.integer)) \
                or not 1 <= prefix_block_tokens <= 2**20:
            raise ValueError(f"prefix_block_tokens must be a whole number from 1 to {2**20:,}")
        ensure_traceable(self.config, str(self.config_file))
        workload_seed, arrival_seed = np.random.SeedSequence(seed).spawn(2)
        positions = np.concatenate([np.arange(stage.num_requests, dtype=np.int64) for stage in self.stages])
        columns = rows(self.config.workload, positions, np.random.default_rng(workload_seed), int(prefix_block_tokens))
        arrival_s, origins = stage_sends(self.stages, self.config.load_type, self.config.interval_s,
                                         np.random.default_rng(arrival_seed))
        return Trace(
            arrival_s=arrival_s, **columns,
            prefix_block_tokens=int(prefix_block_tokens) if "prefix_id_values" in columns else 0,
            source=f"inference-perf:{self.results_dir} (seed {seed})",
            metadata={"stage_start_s": origins,
                      "stage_num_requests": [stage.num_requests for stage in self.stages]},
        )

    def stage_of_rows(self, trace: Trace) -> np.ndarray:
        """The stage (int64) that sent each row of ``trace``, one of this run's traces."""
        counts = [stage.num_requests for stage in self.stages]
        if len(trace) != sum(counts):
            raise ValueError(f"the trace has {len(trace):,} rows, but this run's stages send {sum(counts):,}: "
                             "stage_of_rows needs a whole trace of this run")
        return np.repeat(np.arange(len(counts), dtype=np.int64), counts)

    def describe(self) -> str:
        """A few lines for a person: model, workload, stages and what each measured."""
        lines = [f"inference-perf run {self.results_dir}",
                 f"  model {self.model_name or '(not stated)'}"
                 + (f", TP {self.server.tensor_parallelism}" if self.server.tensor_parallelism else ""),
                 f"  {self.workload}; ignore_eos {str(self.ignore_eos).lower()}, "
                 f"timeout {self.client_timeout_s:g} s"
                 + ("" if self.request_timeout_s is not None else " (aiohttp's default)")]
        for k, stage in enumerate(self.stages):
            line = (f"  stage {k}: {stage.rate_per_s:g}/s x {stage.duration_s:g} s = "
                    f"{stage.num_requests:,} requests ({self.config.load_type}), from {stage.start_s:g} s")
            measured = self.measured_stages.get(k)
            if measured is not None:
                line += f"; measured {measured.successes:,} ok, {measured.failures:,} failed"
                if measured.e2e is not None:
                    line += f", E2E mean {_seconds(measured.e2e.mean)}"
                if measured.ttft is not None:
                    line += f", TTFT mean {_seconds(measured.ttft.mean)}"
            lines.append(line)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def _seconds(value_s: float) -> str:
    return f"{value_s * 1e3:.3g} ms" if value_s < 1 else f"{value_s:.3g} s"


def read_inference_perf(path: str | PathLike[str]) -> InferencePerfRun:
    """The run in ``path``: a results folder (``config.yaml``), the experiment folder above it
    (``results/``, ``exp-config.yaml``) or the ``config.yaml``; an ``InferencePerfError`` naming
    the file and key of the first problem."""
    found = locate(path)
    config_top = read_yaml(found.config, what="config.yaml")
    config = parse_config(config_top)
    server = _server(None if found.exp_config is None else read_yaml(found.exp_config, what="exp-config.yaml"))
    summary_path, stage_paths = metrics_files(found.results_dir, config.report_file_prefix)
    for index, stage_path in stage_paths.items():
        if index >= len(config.stages):
            raise Node(None, "", stage_path).error(
                f"is stage {index}'s, but {found.config.name} has {len(config.stages)} load stage(s)")
    measured = {index: parse_metrics(read_json(p, what="lifecycle metrics file")) for index, p in stage_paths.items()}
    return InferencePerfRun(
        results_dir=found.results_dir,
        model_name=config.model_name,
        ignore_eos=config.ignore_eos,
        streaming=config.streaming,
        request_timeout_s=config.request_timeout_s,
        stages=config.stages,
        workload=config.workload.describe(),
        server=server,
        measured_stages=measured,
        measured_summary=None if summary_path is None else parse_metrics(
            read_json(summary_path, what="lifecycle metrics file")),
        config=config,
        config_file=found.config,
    )
