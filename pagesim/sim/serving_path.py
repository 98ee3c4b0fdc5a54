"""The serving path around the forward pass: how a request gets from the client into a step, and
its tokens back out, in a vLLM V1 server (``vllm serve``: an API-server process in front of an
engine-core process).

A request's time to first token is not one prefill step. In vLLM V1 (0.15.1 and 0.33.0 alike; the
files named are ``vllm/v1/engine/``'s):

1. **Into the engine** (``frontend_in_s``): the API server parses the HTTP request, tokenizes
   the prompt and builds the engine request (``async_llm.py``, ``input_processor.py``), and sends
   it over ZMQ to the engine core, whose input thread queues it (``core.py``,
   ``EngineCoreProc.process_input_sockets``).
2. **Into a step**: the engine core's busy loop takes queued requests only between steps
   (``_process_input_queue`` before each ``step``), so a request waits for the step in flight
   to end. With **asynchronous scheduling** (``--async-scheduling``, on by default in both
   versions unless an incompatible option is set: ``config/vllm.py``) the loop keeps a queue of
   two batches (``step_with_batch_queue``): when a step ends, the batch that runs next was
   scheduled one step earlier, and the batch scheduled now runs after it. A request that reached
   the engine core during step k is therefore first computed in step k + 2, not k + 1: one more
   step of waiting. An idle engine core (nothing scheduled) schedules it at once.
   The two versions differ only in when ``step_with_batch_queue`` returns early with a half-full
   queue (0.15: the newest batch still running; 0.33: anything left to schedule), which changes no
   step in which a request is first computed on a busy engine; one setting serves both.
3. **Out to the client** (``frontend_out_s``): the step's sampled token goes back over ZMQ to the
   API server (``EngineCoreOutputs``), whose output handler detokenizes it
   (``output_processor.py``, ``detokenizer.py``) and writes it to the stream (one
   server-sent event per step with ``--stream-interval 1``, the default in both).

Terms 1 and 3 are the same for every request, so they shift the whole engine timeline against
the client's clock without changing what it decides: they are added to each request's first
token and finish times (and term 1 to its first scheduling) as the simulator records them, and
the engine's own clock (steps, the decision log) is left as it was. Term 2 changes which step a
request first joins (never what the scheduler decides given what it has been told: the
scheduler still sees requests in arrival order, one step later); ``pagesim.sim.replica`` carries it out.

Constants are the same for every model, GPU and run (never fitted to a measurement): see
``VLLM_FRONTEND_IN_S`` and ``VLLM_FRONTEND_OUT_S`` for what they stand for. ``none`` is the
path of earlier pagesim versions (a request enters the next step; no frontend), which the
oracle cases and the paper reproduction use.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

#: Client send -> the engine core's input queue on a vLLM V1 server: an HTTP request parsed and
#: its prompt tokenized in the API server's event loop, the engine request built and sent over a
#: local ZMQ socket. About 1 ms for the HTTP and request handling plus the tokenizer: Hugging
#: Face tokenizers take 10-20 us per token from Python (tenstorrent/tt-inference-server#2173
#: measured 1.3-2.8 ms for 131 tokens), so a prompt of a few hundred tokens costs another
#: millisecond or more; 2 ms in all for the prompts of a few hundred tokens that serving
#: benchmarks send. A fixed figure, not one per token: it moves every request's clock alike.
VLLM_FRONTEND_IN_S = 2e-3
#: A step's end -> its token at the client: the outputs serialized to the API server, one
#: token detokenized incrementally and written as a server-sent event (about 1 ms).
VLLM_FRONTEND_OUT_S = 1e-3


@dataclass(frozen=True, slots=True)
class ServingPath:
    name: str
    async_scheduling: bool  # a request reaching a busy engine joins the step after next (vLLM V1's batch queue)
    frontend_in_s: float = 0.0  # client send -> the engine core's input queue
    frontend_out_s: float = 0.0  # a step's end -> the client

    def __post_init__(self) -> None:
        for name in ("frontend_in_s", "frontend_out_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"serving path {name} must be a finite number of seconds >= 0, got {value!r}")

    @property
    def client_offset_s(self) -> float:
        """What the frontend adds to every request's latency, in and out."""
        return self.frontend_in_s + self.frontend_out_s

    def with_async_scheduling(self, on: bool) -> ServingPath:
        return replace(self, async_scheduling=on)

    def describe(self) -> dict:
        return asdict(self)


SERVING_PATHS: dict[str, ServingPath] = {
    p.name: p for p in (
        ServingPath("vllm", async_scheduling=True, frontend_in_s=VLLM_FRONTEND_IN_S,
                    frontend_out_s=VLLM_FRONTEND_OUT_S),
        ServingPath("none", async_scheduling=False),
    )
}


def serving_path(name: str, *, async_scheduling: bool | None = None) -> ServingPath:
    """The named path (``vllm`` or ``none``), with ``async_scheduling`` overridden when given."""
    try:
        path = SERVING_PATHS[name]
    except KeyError:
        raise ValueError(f"unknown serving path {name!r}; known: {', '.join(SERVING_PATHS)}") from None
    return path if async_scheduling is None else path.with_async_scheduling(async_scheduling)


def roofline_overrides(path: ServingPath | None, kernel: str = "flash") -> dict[str, float]:
    """The roofline parameters a run's path and paged decode ``kernel``
    (``pagesim.sim.cost.roofline.ATTENTION_KERNELS``) set. With asynchronous scheduling the scheduler's and
    the input preparation's per-request CPU work for a step runs while the previous step computes
    (vLLM V1's ``step_with_batch_queue``: ``schedule()`` and ``execute_model`` of step k + 1 are
    issued before step k's output is awaited: ``scheduler_overlap`` 1), so the roofline's
    per-sequence CPU term (``cpu_per_seq_s``) is hidden behind the forward pass, as are the KV
    offloading connector's walks (``pagesim.sim.cost.connector_cpu``) up to its length; its
    per-step term (``cpu_step_s``: the sampler's synchronisation, output handling) is not, nor
    are the step's kernels (``kernel_launch``)."""
    from pagesim.sim.cost.roofline import ATTENTION_KERNELS

    params = {"scheduler_overlap": 1.0} if path is not None and path.async_scheduling else {}
    return {**params, **(ATTENTION_KERNELS[kernel] if kernel != "flash" else {})}


def path_words(path: ServingPath | None) -> str:
    """The path in words, as the summaries state it."""
    if path is None:
        return "serving path none (a request enters the next step; no frontend)"
    return (f"serving path {path.name} (async scheduling {'on' if path.async_scheduling else 'off'}, "
            f"frontend {path.frontend_in_s * 1e3:g} ms in + {path.frontend_out_s * 1e3:g} ms out)")


def add_serving_path_args(parser) -> None:
    """``--serving-path`` and vLLM's ``--async-scheduling`` / ``--no-async-scheduling``."""
    g = parser.add_argument_group("serving path (time outside the forward pass: pagesim/sim/serving_path.py)")
    g.add_argument("--serving-path", choices=list(SERVING_PATHS), metavar="NAME",
                   help="vllm: a vLLM V1 server's API-server frontend and engine-core queue (0.15 and 0.33 alike); "
                        "none: a request enters the next step and its tokens reach the client as the step ends "
                        "(default: vllm with --policy vllm-v1, none otherwise)")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM's flag: the next batch is scheduled while the current one runs, so a request "
                        "reaching a busy engine joins one step later (default: the serving path's; vllm: on, "
                        "as vLLM 0.15 and 0.33 default to)")
    g.add_argument("--frontend-latency-ms", nargs=2, type=float, metavar=("IN", "OUT"),
                   help="the path's frontend terms in ms: client send -> engine core, and step end -> client "
                        "(default: the path's; vllm: 2 and 1), e.g. to add a gateway in front of the server")


def serving_path_from_args(args, policy: str | None = None) -> ServingPath | None:
    """The path ``args`` ask for (``chosen_path``)."""
    return chosen_path(args.serving_path, policy, args.async_scheduling, getattr(args, "frontend_latency_ms", None))


def chosen_path(name: str | None, policy: str | None, async_scheduling: bool | None = None,
                frontend_ms: Sequence[float] | None = None) -> ServingPath | None:
    """The path named (by default ``vllm`` under the ``vllm-v1`` policy, ``none`` otherwise), with
    ``async_scheduling`` and the frontend terms (``frontend_ms``: in and out, milliseconds)
    overridden when given; ``None`` for the plain path (``none`` without async scheduling)."""
    path = serving_path(name or ("vllm" if policy == "vllm-v1" else "none"), async_scheduling=async_scheduling)
    if frontend_ms is not None:
        try:
            path = replace(path, frontend_in_s=frontend_ms[0] / 1e3, frontend_out_s=frontend_ms[1] / 1e3)
        except ValueError:
            raise ValueError(f"--frontend-latency-ms takes two finite numbers of milliseconds >= 0, got "
                             f"{frontend_ms[0]:g} and {frontend_ms[1]:g}") from None
    return None if path == SERVING_PATHS["none"] else path
