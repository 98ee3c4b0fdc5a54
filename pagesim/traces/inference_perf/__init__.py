"""inference-perf output folders, read back: the workload a run sent, as a ``Trace``, and what it measured.

inference-perf (github.com/kubernetes-sigs/inference-perf) is the Kubernetes WG Serving benchmark
client: it sends synthetic or dataset prompts to a server in load stages and writes the run's
configuration and latency summaries to a folder (``files``). It is not a dependency: it needs
Python >= 3.12 and a heavy stack and is not on pagesim's package index, so this package reads the
subset of its files that a replay needs, following its source (cited by file and line, at
commit 3b6f82a, the October 2025 main branch the shared ground truth ran, and at 2026 releases
where they differ):

- ``config`` — the load stages and workload ``config.yaml`` describes; what is not modelled is
  refused with an ``InferencePerfError`` naming the key, never guessed;
- ``lengths`` — fixed token counts and inference-perf's clipped normal distributions;
- ``workload`` — each request's lengths and prompt contents (prefix identities): shared-prefix
  groups cycled in one shuffled order, random and synthetic prompts;
- ``schedule`` — send times as inference-perf's constant and Poisson timers draw them;
- ``metrics`` — the measured latencies (E2E, TTFT), lengths and rates per stage;
- ``run`` — ``read_inference_perf`` and ``InferencePerfRun``.

Usage::

    run = read_inference_perf("../shared/groundtruth/vllm-0.15.1-h100/20260217-231439-llama-2-7b-tp1-general")
    trace = run.trace(seed=0)               # 16,800 requests, 16-token prefix identities
    stage = run.stage_of_rows(trace)        # 0 for the first 4,800, 1 for the rest
    run.measured_stages[1].ttft.mean        # 0.0519 s
"""

from pagesim.traces.inference_perf.config import LoadStage
from pagesim.traces.inference_perf.keys import InferencePerfError
from pagesim.traces.inference_perf.metrics import LatencyStats, MeasuredStage
from pagesim.traces.inference_perf.run import InferencePerfRun, ServerSettings, read_inference_perf

__all__ = ["InferencePerfError", "InferencePerfRun", "LatencyStats", "LoadStage", "MeasuredStage",
           "ServerSettings", "read_inference_perf"]
