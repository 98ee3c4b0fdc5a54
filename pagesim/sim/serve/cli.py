"""pagesim serve: a vLLM-compatible HTTP endpoint whose timing comes from the simulator.

``pagesim serve --model llama3.1-8b --gpu h100`` listens on 127.0.0.1:8000 and answers vLLM's
OpenAI-compatible API as a vLLM 0.33 server of that deployment would: the same scheduler
(``--policy vllm-v1`` by default), KV cache, cost model and serving path as ``pagesim simulate``,
run against the wall clock (``pagesim.sim.serve.clock``). Point a router, a gateway, an
autoscaler or a load test (``vllm bench serve``, inference-perf, GuideLLM) at it as at a GPU.
``--replicas N`` serves N replicas behind one port and ``--router``, each labelled
``engine="k"`` in ``/metrics``.
"""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_MODEL = "llama3-8b"
DEFAULT_GPU = "h100"


def add_parser(subparsers) -> None:
    from pagesim.sim.cli import add_cost_args, add_deployment_args
    from pagesim.sim.router import ROUTERS
    from pagesim.sim.serve.lengths import SPELLINGS
    from pagesim.sim.serving_path import add_serving_path_args

    p = subparsers.add_parser("serve", help="a vLLM-compatible HTTP endpoint timed by the simulator (for clients, "
                                             "routers and load tests)", description=__doc__.split("\n\n")[0])
    add_deployment_args(p)
    p.set_defaults(policy="vllm-v1", gpu=DEFAULT_GPU, model=DEFAULT_MODEL, affinity_slack=None, affinity_slack_tokens=None)
    h = p.add_argument_group("server")
    h.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    h.add_argument("--port", type=int, default=8000, help="port (default 8000, as vllm serve)")
    h.add_argument("--served-model-name", metavar="NAME",
                   help="the model name clients send and /v1/models lists (default: --model as given)")
    h.add_argument("--tokenizer", metavar="PATH",
                   help="a Hugging Face tokenizer folder or tokenizer.json that counts text prompts' tokens "
                        "(default: an estimate of 1 token per 4 characters, said at startup; token-id prompts "
                        "are counted exactly either way)")
    h.add_argument("--output-lens", default="max", metavar="SPEC",
                   help=f"output lengths of requests that honour EOS (no ignore_eos): {SPELLINGS} (default max: "
                        "every request runs to max_tokens)")
    h.add_argument("--seed", type=int, default=0, help="seeds drawn output lengths and beam choices (default 0)")
    h.add_argument("--time-scale", type=float, default=1.0, metavar="F",
                   help="wall seconds per simulated second (default 1: real time; 2: half speed; 0.5: twice as fast)")
    h.add_argument("--decision-log", metavar="FILE",
                   help="write every step's decisions here as JSON lines, as the server runs (with --replicas: "
                        "FILE.K per replica)")
    h.add_argument("--timeout-keep-alive", type=float, default=5.0, metavar="S",
                   help="close an idle keep-alive connection after S seconds (default 5, vLLM's "
                        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE)")
    h.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="server log level (default info)")
    h.add_argument("--replicas", type=int, default=1, metavar="N", help="replicas behind one port (default 1)")
    h.add_argument("--router", default="round-robin", choices=list(ROUTERS),
                   help="which replica serves a request behind the one port (default round-robin)")
    h.add_argument("--port-per-replica", action="store_true",
                   help="serve replica K on --port + K instead, each a vLLM server of its own (its /metrics labelled "
                        "engine=\"0\"): for a router or gateway of your own in front")
    o = p.add_argument_group("cost model")
    add_cost_args(o)
    o.add_argument("--profile", metavar="FILE", help="a calibration profile: kernel-timed (pagesim calibrate) or "
                   "fitted (pagesim calibrate --from-measurements), as for simulate")
    add_serving_path_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn  # (missing: the dispatcher names the serve extra, pagesim.engine.cli.missing_extra_hint)

    server = build_server(args)
    print(f"pagesim serve: {server.words}", file=sys.stderr, flush=True)
    sockets = [bind(args.host, port) for port in server.ports] if args.port_per_replica else None
    where = ", ".join(f"http://{args.host}:{port} (replica {k})" for k, port in enumerate(server.ports)) \
        if sockets else f"http://{args.host}:{args.port}"
    print(f"pagesim serve: listening on {where} (Ctrl-C stops)", file=sys.stderr, flush=True)
    config = uvicorn.Config(server.app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_keep_alive=args.timeout_keep_alive, timeout_graceful_shutdown=5)
    try:
        uvicorn.Server(config).run(sockets=sockets)
    finally:
        server.close()
        for sock in sockets or ():
            sock.close()
    return 0


def bind(host: str, port: int):
    """A listening socket on ``host:port`` (one per replica with ``--port-per-replica``: one uvicorn
    server, one app, the port a request came in on naming its replica)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def open_log(path: str):
    """``--decision-log``'s file, written line by line as the server runs (``tail -f`` follows it):
    checked as every pagesim output is (``pagesim.engine.outputs.OutputFile``: no folder, a writable
    place); a device or FIFO is written into, never replaced, and a regular file is opened without
    following a link it was swapped for (``own_opener``)."""
    from pagesim.engine.output_folders import own_opener
    from pagesim.engine.outputs import OutputFile

    output = OutputFile(path, "--decision-log")
    if output.stream:
        return os.fdopen(output.begin().fd, "w", encoding="ascii", buffering=1)
    return open(output.target, "w", encoding="ascii", buffering=1, opener=own_opener)


class Server:
    def __init__(self, app, state, words: str, files: list, ports: list[int]):
        self.app, self.state, self.words, self._files, self.ports = app, state, words, files, ports

    def close(self) -> None:
        for f in self._files:
            f.close()


def build_server(args: argparse.Namespace) -> Server:
    """The app ``args`` describe, checked and built before anything listens."""
    from pagesim.sim.cli import _router, run_spec_from_args
    from pagesim.sim.cluster import build_replicas
    from pagesim.sim.fit.profile_file import apply_profile
    from pagesim.sim.serve.app import ServeState, create_app, fingerprint
    from pagesim.sim.serve.clock import ServeEngine
    from pagesim.sim.serve.lengths import OutputLengths
    from pagesim.sim.serve.metrics import ServeMetrics
    from pagesim.sim.serve.openai_api import now_s
    from pagesim.sim.serving_path import serving_path_from_args
    from pagesim.traces.bench.tokenizer import load_tokenizer

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be 0..65535, got {args.port}")
    for flag in ("tp", "ep", "replicas"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    profile_words = apply_profile(args, "serve")
    tokenizer = load_tokenizer(args.tokenizer)
    lengths = OutputLengths(args.output_lens, seed=args.seed)
    args.out = args.decision_log  # (run_spec_from_args records decisions when a log is asked for)
    builts = build_replicas(run_spec_from_args(args), args.replicas)
    built = builts[0]
    path = serving_path_from_args(args, args.policy)
    files = []
    if args.decision_log:
        names = [args.decision_log] if args.replicas == 1 else [f"{args.decision_log}.{k}" for k in range(args.replicas)]
        try:
            for name in names:
                files.append(open_log(name))
        except BaseException:
            for f in files:
                f.close()
            raise
    config = built.scheduler.config
    name = args.served_model_name or args.model
    every = ServeMetrics(name, {k: str(k) for k in range(args.replicas)}, config.max_model_len)
    ports = [args.port + k for k in range(args.replicas)] if args.port_per_replica else [args.port]
    if ports[-1] > 65535:
        raise ValueError(f"--port-per-replica: replica {args.replicas - 1} would listen on {ports[-1]}, past 65535")
    own = {k: ServeMetrics(name, {k: "0"}, config.max_model_len) for k in range(args.replicas)} \
        if args.port_per_replica else None
    engine = ServeEngine(builts, router=_router(args) if args.replicas > 1 else None, serving_path=path,
                         seed=args.seed, time_scale=args.time_scale,
                         observers=own or {k: every for k in range(args.replicas)},
                         decision_sinks=[f.write for f in files] or None)
    for metrics in [every, *(own or {}).values()]:
        metrics.attach(engine)
    describe = built.describe()
    state = ServeState(engine=engine, metrics=every, tokenizer=tokenizer, model_name=name,
                       model_root=built.deployment.model.name, max_model_len=config.max_model_len, lengths=lengths,
                       fingerprint=fingerprint(describe, args.tp), created=now_s(),
                       ports={port: (k, own[k]) for k, port in enumerate(ports)} if own else None)
    words = (f"{name} on {args.replicas} x {built.deployment.gpu.name} (tp {args.tp}), policy {args.policy}, "
             f"{config.num_gpu_blocks:,} KV blocks of {config.block_size} tokens per replica, max_model_len "
             f"{config.max_model_len:,}, max_num_seqs {config.max_num_seqs}, max_num_batched_tokens "
             f"{config.max_num_batched_tokens:,}; cost model {built.cost_model.name}"
             + (f" ({profile_words})" if profile_words else "")
             + f"; serving path {path.name if path else 'none'}; prompts counted by {tokenizer.describe}; "
             f"outputs: {lengths.describe()}; time scale {args.time_scale:g}")
    return Server(create_app(state), state, words, files, ports)
