"""The loop closed with a real client: inference-perf drives ``pagesim serve`` on localhost, and
``pagesim replay`` predicts the same run; printed side by side, with the HTTP and client overhead
measured apart.

    python benchmarks/bench_serve.py --inference-perf PATH/TO/inference-perf [--out DIR]
        [--rates 6 16] [--duration 40] [--input-len 3000] [--output-len 100] [-- extra serve flags]

1. A word-level tokenizer folder is written (one token per whitespace word, ``w0`` .. ``w31999``):
   inference-perf's random prompts are its words, so the client and ``pagesim serve --tokenizer``
   count the same prompt tokens, and the server's synthetic output (``" the"`` per token) counts one
   token per word too. Nothing is downloaded.
2. ``pagesim serve --model llama3.1-8b --gpu h100`` starts on a free port; ``/metrics`` is scraped
   every second into ``metrics.jsonl`` (queue, running, KV-cache usage, the lag gauge).
3. inference-perf (0.7, Python 3.12; ``pip install inference-perf`` in a venv of its own) sends a
   constant-rate stage per ``--rates`` value, ``--duration`` seconds each, random prompts of
   ``--input-len`` tokens, ``--output-len`` tokens out with ``ignore_eos``, streaming: the folder it
   writes is an inference-perf run like ``../shared/groundtruth``'s, with an ``exp-config.yaml`` beside it.
4. ``pagesim replay`` of that folder simulates the same workload and stages on the same deployment.

Three figures per stage and latency: what the client measured (inference-perf), what the server's
simulation recorded for the same requests (``/metrics``' TTFT and E2E sums over the stage), and
what ``replay`` predicts. client - server is the HTTP stack, the event loop and the client's own
overhead; server vs replay is the simulation itself (replay redraws inference-perf's send times, so
the two runs see different arrivals: queueing differs at saturation). Not a test: nothing here
asserts a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 32000


def write_tokenizer(folder: Path) -> None:
    """A Hugging Face tokenizer folder: WordLevel, ``[UNK]`` then ``w0..w{VOCAB-1}``, split on spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # (joins words with single spaces)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 1_000_000}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def scrape(url: str) -> dict[str, float]:
    """``/metrics`` summed over labels: ``{series name: value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(get(f"{url}/metrics").decode()):
        for sample in family.samples:
            if sample.labels.get("le") is None:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def inference_perf_config(args, url: str, tokenizer: Path, results: Path) -> dict:
    lengths = lambda n: {"type": "fixed", "min": n, "max": n, "mean": n, "std_dev": 0}  # noqa: E731
    return {
        "api": {"type": "completion", "streaming": True},
        "data": {"type": "random", "input_distribution": lengths(args.input_len),
                 "output_distribution": lengths(args.output_len)},
        "load": {"type": "constant", "interval": args.interval, "num_workers": args.workers, "request_timeout": 300,
                 "stages": [{"rate": rate, "duration": args.duration} for rate in args.rates]},
        "server": {"type": "vllm", "model_name": args.model, "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": True,
                                         "per_request_fields": {"request": False, "response": False,
                                                                "response_chunks": False, "computed_metrics": True}},
                   "prometheus": {"summary": False, "per_stage": False}},
        "storage": {"local_storage": {"path": str(results)}},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inference-perf", default=shutil.which("inference-perf"), metavar="PATH",
                   help="the inference-perf command (default: the one on PATH)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "serve"), metavar="DIR")
    p.add_argument("--model", default="llama3.1-8b")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--rates", type=float, nargs="+", default=[6.0, 16.0], metavar="R")
    p.add_argument("--duration", type=float, default=40.0, metavar="S")
    p.add_argument("--interval", type=float, default=5.0, metavar="S", help="pause between stages")
    p.add_argument("--input-len", type=int, default=3000)
    p.add_argument("--output-len", type=int, default=100)
    p.add_argument("--workers", type=int, default=2, help="inference-perf's worker processes")
    args = p.parse_args(argv)
    if not args.inference_perf or not Path(args.inference_perf).exists():
        print("bench_serve: skipped: give --inference-perf (python3.12 -m venv V && V/bin/pip install inference-perf)",
              file=sys.stderr)
        return 0
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    experiment = out / "experiment"
    experiment.mkdir(parents=True)
    tokenizer = out / "tokenizer"
    write_tokenizer(tokenizer)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve_cmd = [sys.executable, "-m", "pagesim.engine.cli", "serve", "--model", args.model, "--gpu", args.gpu,
                 "--port", str(port), "--tokenizer", str(tokenizer / "tokenizer.json"), "--log-level", "warning",
                 *extra]
    server_log = open(out / "serve.log", "w")
    server = subprocess.Popen(serve_cmd, stdout=server_log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get(f"{url}/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"pagesim serve did not start: see {out / 'serve.log'}")
                time.sleep(0.2)
        floor = http_floor(url)
        samples: list[dict] = []
        stop = threading.Event()

        def scraper():
            started = time.monotonic()
            with open(out / "metrics.jsonl", "w") as f:
                while not stop.wait(1.0):
                    try:
                        row = {"t": round(time.monotonic() - started, 2), **scrape(url)}
                    except OSError:
                        continue
                    samples.append(row)
                    f.write(json.dumps(row) + "\n")

        thread = threading.Thread(target=scraper, daemon=True)
        thread.start()
        config = inference_perf_config(args, url, tokenizer, experiment / "results")
        (out / "inference-perf.yaml").write_text(json.dumps(config, indent=1))
        (experiment / "exp-config.yaml").write_text(json.dumps({"model": "meta-llama/Llama-3.1-8B-Instruct",
                                                                 "tensor_parallelism": 1}))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        started = time.monotonic()
        with open(out / "inference-perf.log", "w") as log:
            rc = subprocess.run([args.inference_perf, "--config_file", str(out / "inference-perf.yaml")],
                                stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        client_s = time.monotonic() - started
        stop.set()
        thread.join()
        final = scrape(url)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        server_log.close()
    if rc != 0:
        print(f"bench_serve: inference-perf exited {rc}: see {out / 'inference-perf.log'}", file=sys.stderr)
        return 1
    report(args, out, experiment, samples, final, client_s)
    print(f"HTTP floor (aiohttp, {floor['count']} streamed 1-token requests one at a time on the idle server): client "
          f"TTFT {floor['client_ms']:.2f} ms - the server's simulated {floor['server_ms']:.2f} ms = "
          f"{floor['client_ms'] - floor['server_ms']:+.2f} ms")
    return 0


def http_floor(url: str, count: int = 50) -> dict:
    """The HTTP stack's and event loop's share of a client's TTFT with a minimal client: streamed
    1-token requests sent one at a time (nothing queues), aiohttp's time to the first chunk against
    the TTFT the server's simulation recorded for them (``/metrics`` sums before and after)."""
    import asyncio

    import aiohttp

    async def go():
        times = []
        async with aiohttp.ClientSession() as session:
            for i in range(count):
                started = time.perf_counter()
                async with session.post(f"{url}/v1/completions", json={"prompt": f"w{i}", "max_tokens": 1,
                                                                       "stream": True}) as response:
                    async for _ in response.content.iter_any():
                        times.append(time.perf_counter() - started)
                        break
                    await response.read()
        return times

    before = scrape(url)
    times = asyncio.run(go())
    after = scrape(url)
    name = "vllm:time_to_first_token_seconds"
    served = after[f"{name}_count"] - before[f"{name}_count"]
    server_s = (after[f"{name}_sum"] - before[f"{name}_sum"]) / served
    return {"count": len(times), "client_ms": 1e3 * sum(times) / len(times), "server_ms": 1e3 * server_s}


def report(args, out: Path, experiment: Path, samples: list[dict], final: dict, client_s: float) -> None:
    results = experiment / "results"
    replay = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", "replay", str(experiment), "--gpu", args.gpu,
                             "--json", "--no-progress"], capture_output=True, text=True, cwd=ROOT)
    (out / "replay.json").write_text(replay.stdout)
    if replay.returncode != 0:
        print(replay.stderr, file=sys.stderr)
        raise SystemExit("bench_serve: pagesim replay failed")
    predicted = json.loads(replay.stdout)
    server_stages = server_figures(results)
    same_sends = simulate_sends(args, out, results)
    print(f"pagesim serve {args.model} on {args.gpu}: inference-perf random {args.input_len} -> {args.output_len} "
          f"tokens, ignore_eos, streaming; {len(args.rates)} stages of {args.duration:g} s "
          f"(client wall {client_s:.0f} s)")
    print(f"{'stage':>5} {'rate':>5} {'ok':>5}  {'figure':<16} {'client':>9} {'server':>9} {'simulate':>9} "
          f"{'replay':>9}  {'client-server':>13}  {'sim/client':>10}  {'replay/client':>13}")
    rows = {row["stage"]: row for row in predicted["rows"]}
    for k, rate in enumerate(args.rates):
        row, srv = rows.get(k), server_stages.get(k, {})
        if row is None:
            continue
        ok = row["counts"].get("measured", {}).get("successes", "-")
        for name, figure, stat in (("TTFT mean ms", "ttft", "mean"), ("TTFT p90 ms", "ttft", "p90"),
                                   ("E2E mean ms", "e2e", "mean"), ("E2E p90 ms", "e2e", "p90"),
                                   ("per token ms", "per_token", "mean")):
            cell = row[figure][stat]
            client, replayed, server_value = cell["measured_s"], cell["predicted_s"], srv.get((figure, stat))
            simulated = same_sends.get(k, {}).get((figure, stat))
            diff = f"{(client - server_value) * 1e3:+.1f} ms" if None not in (client, server_value) else "-"
            ratio = f"{cell['error']:+.1%}" if cell["error"] is not None else "-"
            sim_ratio = f"{simulated / client - 1:+.1%}" if None not in (client, simulated) else "-"
            print(f"{k:>5} {rate:>5g} {ok:>5}  {name:<16} {_ms(client):>9} {_ms(server_value):>9} "
                  f"{_ms(simulated):>9} {_ms(replayed):>9}  {diff:>13}  {sim_ratio:>10}  {ratio:>13}")
    for k, rate in enumerate(args.rates):
        load = json.loads((results / f"stage_{k}_lifecycle_metrics.json").read_text())["load_summary"]
        print(f"stage {k}: the client sent {load['count']} requests at {load['achieved_rate']:.2f}/s of the "
              f"{rate:g}/s asked (its schedule delay: mean {load['schedule_delay']['mean']:.3f} s, max "
              f"{load['schedule_delay']['max']:.3f} s)")
    peak_waiting = max((s.get("vllm:num_requests_waiting", 0) for s in samples), default=0)
    peak_kv = max((s.get("vllm:kv_cache_usage_perc", 0) for s in samples), default=0)
    worst_lag = final.get("pagesim:wall_clock_lag_max_seconds", 0)
    print(f"/metrics (scraped every second, {len(samples)} scrapes): peak waiting {peak_waiting:.0f}, peak KV-cache "
          f"usage {peak_kv:.3f}, late events (over 10 ms) {final.get('pagesim:late_events', 0):.0f}, the worst lag "
          f"{worst_lag * 1e3:.1f} ms; requests served {final.get('vllm:request_success_total', 0):.0f}")
    print(f"wrote {out}/: experiment/ (inference-perf's run), metrics.jsonl, replay.json, serve.log")


def simulate_sends(args, out: Path, results: Path) -> dict[int, dict]:
    """Per stage, ``pagesim simulate`` of the requests the client sent, at the client's own send times
    (inference-perf's per-request start times, split into stages at the pauses between them) with their
    lengths: the same workload, with no HTTP in between."""
    requests = json.loads((results / "per_request_lifecycle_metrics.json").read_text())
    requests.sort(key=lambda r: r["start_time"])
    stages, current = [], [requests[0]]
    for prev, row in zip(requests, requests[1:]):
        if row["start_time"] - prev["start_time"] > args.interval * 0.8:  # (the pause between stages)
            stages.append(current)
            current = []
        current.append(row)
    stages.append(current)
    figures = {}
    for k, stage in enumerate(stages):
        trace = out / f"sends-stage-{k}.csv"
        t0 = stage[0]["start_time"]
        lines = ["arrival_s,prompt_len,output_len"]
        for r in stage:
            m = r["info"]["request_metrics"]["text"]["input_tokens"], r["info"]["response_metrics"]["output_tokens"]
            lines.append(f"{r['start_time'] - t0:.6f},{m[0]},{args.output_len}")
        trace.write_text("\n".join(lines) + "\n")
        done = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", "simulate", "--trace", str(trace),
                               "--model", args.model, "--gpu", args.gpu, "--policy", "vllm-v1", "--json",
                               "--no-progress"], capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            raise SystemExit("bench_serve: pagesim simulate failed")
        summary = json.loads(done.stdout)
        figures[k] = {("ttft", "mean"): summary["ttft_s"]["mean"], ("ttft", "p90"): summary["ttft_s"]["p90"],
                      ("e2e", "mean"): summary["e2e_s"]["mean"], ("e2e", "p90"): summary["e2e_s"]["p90"],
                      ("per_token", "mean"): summary["tpot_s"]["mean"]}
    return figures


def server_figures(results: Path) -> dict[int, dict]:
    """Per stage, the means the server's simulation recorded (``/metrics``' histogram sums and counts,
    differences between the scrapes that open and close the stage: stages are separated by a pause
    with nothing in flight)."""
    samples = [json.loads(line) for line in (results.parent.parent / "metrics.jsonl").read_text().splitlines()]
    stages: dict[int, dict] = {}
    # stage boundaries: stretches where requests were served, separated by a scrape with none in flight
    k, first = 0, None
    for prev, row in zip(samples, samples[1:]):
        busy = row.get("pagesim:requests_in_flight", 0) > 0 or prev.get("pagesim:requests_in_flight", 0) > 0
        if busy and first is None:
            first = prev
        elif not busy and first is not None:
            stages[k] = _deltas(first, row)
            k, first = k + 1, None
    if first is not None:
        stages[k] = _deltas(first, samples[-1])
    return stages


def _deltas(a: dict, b: dict) -> dict:
    def mean(name):
        count = b.get(f"{name}_count", 0) - a.get(f"{name}_count", 0)
        return (b.get(f"{name}_sum", 0) - a.get(f"{name}_sum", 0)) / count if count else None

    return {("ttft", "mean"): mean("vllm:time_to_first_token_seconds"),
            ("e2e", "mean"): mean("vllm:e2e_request_latency_seconds"),
            ("per_token", "mean"): mean("vllm:request_time_per_output_token_seconds")}


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
