"""``pagesim serve``: vLLM's API as clients see it, cancellation, /metrics, and a saturating load.

The server runs in a thread on a free localhost port at ``--time-scale 0.05`` (20x faster than
real time), driven by aiohttp as benchmark clients drive vLLM. Nothing here asserts a wall-clock
figure: the client-vs-simulate comparison is benchmarks/bench_serve.py's.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.serve_support import aiohttp, post, run, running_server, stream

FAST = ("--model", "llama3-8b", "--gpu", "h100", "--time-scale", "0.05", "--max-model-len", "2048")


@pytest.fixture(scope="module")
def server():
    with running_server(*FAST) as pair:
        yield pair


def test_models_health_version_load(server):
    url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/health") as r:
                assert r.status == 200 and await r.read() == b""
            async with s.get(f"{url}/version") as r:
                assert await r.json() == {"version": "0.33.0"}
            async with s.get(f"{url}/v1/models") as r:
                card = (await r.json())["data"][0]
            async with s.get(f"{url}/load") as r:
                assert (await r.json()) == {"server_load": 0}
        return card

    card = run(go())
    assert card["id"] == "llama3-8b" and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == 2048


def test_completion_not_streamed(server):
    url, _ = server
    status, body = run(_once(post, f"{url}/v1/completions", {"model": "llama3-8b", "prompt": [1, 2, 3, 4, 5],
                                                             "max_tokens": 7}))
    assert status == 200
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 12, "completion_tokens": 7,
                             "prompt_tokens_details": None, "completion_tokens_details": None}
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and choice["text"] == " the" * 7
    assert list(choice) == ["index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
                            "prompt_logprobs", "prompt_token_ids", "routed_experts", "weight_versions"]


def test_default_max_tokens_is_16_for_completions(server):
    url, _ = server
    status, body = run(_once(post, f"{url}/v1/completions", {"prompt": "hello there"}))
    assert status == 200 and body["usage"]["completion_tokens"] == 16


def test_stream_chunks_as_vllm_sends_them(server):
    url, _ = server
    status, events = run(_once(stream, f"{url}/v1/completions",
                               {"prompt": [7] * 40, "max_tokens": 5, "ignore_eos": True, "stream": True,
                                "stream_options": {"include_usage": True}}))
    assert status == 200 and events[-1] == "[DONE]"
    *tokens, last_usage, _ = events
    assert sum(len(c["choices"][0]["text"]) for c in tokens) == len(" the") * 5
    for chunk in tokens:
        assert list(chunk) == ["id", "object", "created", "model", "choices", "kv_transfer_params"] or \
            list(chunk) == ["id", "object", "created", "model", "choices", "system_fingerprint", "kv_transfer_params"]
        (choice,) = chunk["choices"]
        assert list(choice) == ["index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids",
                                "token_ids", "weight_versions"]
    assert [c["choices"][0]["finish_reason"] for c in tokens][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in tokens[:-1])
    assert "system_fingerprint" not in tokens[-1]  # (with include_usage it moves to the usage chunk)
    assert last_usage["choices"] == [] and list(last_usage["usage"]) == ["prompt_tokens", "total_tokens",
                                                                         "completion_tokens"]
    assert last_usage["usage"] == {"prompt_tokens": 40, "total_tokens": 45, "completion_tokens": 5}
    assert last_usage["system_fingerprint"].startswith("vllm-0.33.0-")


def test_chat_stream_role_content_finish_usage(server):
    url, _ = server
    status, events = run(_once(stream, f"{url}/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "hi there"}], "max_completion_tokens": 3,
                                "stream": True, "stream_options": {"include_usage": True}}))
    assert status == 200 and events[-1] == "[DONE]"
    role, *content, usage, _ = events
    assert role["object"] == "chat.completion.chunk" and role["id"].startswith("chatcmpl-")
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == " the" * 3
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["usage"]["completion_tokens"] == 3 and usage["choices"] == []


def test_chat_not_streamed_defaults_to_the_rest_of_the_context(server):
    url, _ = server
    status, body = run(_once(post, f"{url}/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "x" * 4000}]}))
    assert status == 200
    # (the rest of the 2,048-token context: 1,000 prompt tokens + 10 template tokens)
    assert body["usage"]["completion_tokens"] == 2048 - body["usage"]["prompt_tokens"]
    assert body["choices"][0]["message"]["role"] == "assistant"


def test_n_and_several_prompts_number_their_choices(server):
    url, _ = server
    status, events = run(_once(stream, f"{url}/v1/completions",
                               {"prompt": ["a b c", "d e f"], "n": 2, "max_tokens": 4, "stream": True}))
    assert status == 200
    finishes = {}
    for chunk in events[:-1]:
        (choice,) = chunk["choices"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert finishes == {0: "length", 1: "length", 2: "length", 3: "length"}


def test_eos_lengths_finish_with_stop():
    with running_server(*FAST, "--output-lens", "fixed:3") as (url, _):
        status, body = run(_once(post, f"{url}/v1/completions", {"prompt": "hello", "max_tokens": 10,
                                                                 "min_tokens": 1}))
        assert status == 200 and body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] == 3
        status, body = run(_once(post, f"{url}/v1/completions", {"prompt": "hello", "max_tokens": 10,
                                                                 "ignore_eos": True}))
        assert body["usage"]["completion_tokens"] == 10 and body["choices"][0]["finish_reason"] == "length"


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("case", ["malformed", "empty", "wrong_type", "unknown_model", "max_tokens_over_context",
                                  "prompt_over_context", "unsupported", "stream_options", "no_prompt",
                                  "content_type", "negative_max_tokens", "n_zero"])
def test_bad_requests_answered_as_vllm_answers_them(server, case):
    url, _ = server
    completions = f"{url}/v1/completions"
    asks = {
        "malformed": dict(raw=b'{"prompt": "hi", }'),
        "empty": dict(raw=b""),
        "wrong_type": dict(body={"prompt": "hi", "max_tokens": "abc"}),
        "unknown_model": dict(body={"prompt": "hi", "model": "gpt-9"}),
        "max_tokens_over_context": dict(body={"prompt": "hi", "max_tokens": 5000}),
        "prompt_over_context": dict(body={"prompt": list(range(3000)), "max_tokens": 5}),
        "unsupported": dict(body={"prompt": "hi", "logprobs": 5}),
        "stream_options": dict(body={"prompt": "hi", "stream_options": {"include_usage": True}}),
        "no_prompt": dict(body={"max_tokens": 3}),
        "content_type": dict(raw=b'{"prompt": "hi"}', headers={"content-type": "text/plain"}),
        "negative_max_tokens": dict(body={"prompt": "hi", "max_tokens": -5}),
        "n_zero": dict(body={"prompt": "hi", "n": 0}),
    }
    expected = {
        "malformed": (400, "Bad Request", "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.17', "
                      "'msg': 'JSON decode error', 'input': '<dict of 0 items>', 'ctx': {'error': "
                      "'Expecting property name enclosed in double quotes'}}", "body.17"),
        "empty": (400, "Bad Request", "1 validation error:\n  {'type': 'missing', 'loc': 'body', 'msg': "
                  "'Field required', 'input': 'None'}", "body"),
        "wrong_type": (400, "Bad Request", "1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.max_tokens', "
                       "'msg': 'Input should be a valid integer, unable to parse string as an integer', "
                       "'input': 'abc'}", "body.max_tokens"),
        "unknown_model": (404, "NotFoundError", "The model `gpt-9` does not exist. Valid aliases: llama3-8b.", "model"),
        "max_tokens_over_context": (400, "BadRequestError", "max_tokens=5000 cannot be greater than max_model_len=2048. "
                                    "Please request fewer output tokens. (parameter=max_tokens, value=5000)",
                                    "max_tokens"),
        "prompt_over_context": (400, "BadRequestError", "This model's maximum context length is 2048 tokens. However, "
                                "your prompt contains 3000 input tokens, which exceeds this limit even without any "
                                "output tokens. Please reduce the length of the input prompt. "
                                "(parameter=input_tokens, value=3000)", "input_tokens"),
        "unsupported": (400, "BadRequestError", "pagesim serve does not simulate logprobs: its outputs are synthetic "
                        "tokens (parameter=logprobs, value=5)", "logprobs"),
        "stream_options": (400, "BadRequestError", "Stream options can only be defined when `stream=True`. "
                           "(parameter=stream_options)", "stream_options"),
        "no_prompt": (400, "BadRequestError", "Either prompt or prompt_embeds must be provided and non-empty. "
                      "(parameter=prompt)", "prompt"),
        "content_type": (400, "Bad Request", "1 validation error:\n  Unsupported Media Type: Only 'application/json' "
                         "is allowed", None),
        "negative_max_tokens": (400, "BadRequestError", "max_tokens must be at least 1, got -5. "
                                "(parameter=max_tokens, value=-5)", "max_tokens"),
        "n_zero": (400, "BadRequestError", "n must be at least 1, got 0.", None),
    }

    async def go():
        async with aiohttp.ClientSession() as s:
            ask = asks[case]
            answer = await post(s, completions, ask.get("body"), raw=ask.get("raw"), headers=ask.get("headers"))
            after = await post(s, completions, {"prompt": "still serving", "max_tokens": 2})
        return answer, after

    (status, body), after = run(go())
    code, kind, message, param = expected[case]
    assert status == code
    assert body == {"error": {"message": message, "type": kind, "param": param, "code": code}}
    assert after[0] == 200 and after[1]["usage"]["completion_tokens"] == 2


def test_unknown_fields_are_ignored_as_vllm_ignores_them(server):
    url, _ = server
    status, body = run(_once(post, f"{url}/v1/completions", {"prompt": "hi", "max_tokens": 2, "best_of": 3,
                                                             "foo": {"bar": 1}}))
    assert status == 200 and body["usage"]["completion_tokens"] == 2


# ------------------------------------------------------------------------- cancellation, metrics
def test_a_client_that_disconnects_is_aborted_and_its_blocks_freed(tmp_path):
    log = tmp_path / "decisions.jsonl"
    with running_server(*FAST, "--decision-log", str(log)) as (url, server):
        engine = server.state.engine

        async def go():
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{url}/v1/completions", json={"prompt": [3] * 500, "max_tokens": 1500,
                                                                  "stream": True}) as r:
                    seen = 0
                    async for piece in r.content.iter_any():
                        seen += piece.count(b"data: ")
                        if seen >= 5:
                            break  # (leaving the block closes the connection)
            for _ in range(200):  # the abort lands at the next step boundary
                if engine.in_flight() == 0:
                    break
                await asyncio.sleep(0.02)
            freed = (engine.in_flight(), len(engine.schedulers[0].requests),
                     engine.schedulers[0].kv_usage().allocated_slots)
            async with aiohttp.ClientSession() as s:  # (the next step's decision record lists the abort)
                after = await post(s, f"{url}/v1/completions", {"prompt": [4] * 20, "max_tokens": 2})
            return freed, after

        freed, after = run(go())
        assert freed == (0, 0, 0)  # nothing in flight, nothing in the scheduler, no block held
        assert after[0] == 200
    records = [json.loads(line) for line in log.read_text().splitlines()]
    marks = [k for k, r in enumerate(records) if r.get("aborted")]
    assert [records[k]["aborted"] for k in marks] == [["r0"]]
    assert not any("r0" in r["scheduled"] for r in records[marks[0]:])


def test_metrics_parse_and_add_up(server):
    from prometheus_client.parser import text_string_to_metric_families

    url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            before = await _scrape(s, url)
            answers = await asyncio.gather(*[post(s, f"{url}/v1/completions", {"prompt": [5] * (10 + i),
                                                                               "max_tokens": 1 + i})
                                             for i in range(8)])
            after = await _scrape(s, url)
        return before, answers, after

    before, answers, after = run(go())
    families = {f.name: f for f in text_string_to_metric_families(after)}  # (parses: the test's first check)
    assert "vllm:time_to_first_token_seconds" in families and "vllm:kv_cache_usage_perc" in families

    def total(text, name, **labels):
        value = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    value += sample.value
        return value

    assert all(status == 200 for status, _ in answers)
    served = len(answers)
    completion = sum(b["usage"]["completion_tokens"] for _, b in answers)
    prompt = sum(b["usage"]["prompt_tokens"] for _, b in answers)
    delta = {name: total(after, name) - total(before, name)
             for name in ("vllm:request_success_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                          "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count")}
    assert delta == {"vllm:request_success_total": served, "vllm:generation_tokens_total": completion,
                     "vllm:prompt_tokens_total": prompt, "vllm:time_to_first_token_seconds_count": served,
                     "vllm:e2e_request_latency_seconds_count": served}
    assert total(after, "vllm:request_success_total", finished_reason="length") - \
        total(before, "vllm:request_success_total", finished_reason="length") == served
    assert total(after, "vllm:num_requests_running", model_name="llama3-8b", engine="0") == 0
    assert total(after, "vllm:kv_cache_usage_perc") == 0  # (read at the scrape: every block given back)
    assert total(after, "vllm:prefix_cache_queries_total") - total(before, "vllm:prefix_cache_queries_total") == prompt


async def _scrape(session, url: str) -> str:
    async with session.get(f"{url}/metrics") as r:
        assert r.status == 200
        return await r.text()


async def _once(call, url, body):
    async with aiohttp.ClientSession() as s:
        return await call(s, url, body)


# ----------------------------------------------------------------------------------------- load
def test_a_saturating_load_loses_nothing_and_memory_stays_bounded():
    """A few thousand requests at once on a small KV cache (preemptions): each is answered in full,
    the queue drains, and the request table stays at the requests in flight. At 5x real time (not
    faster: a request must outlast the client's sending of the next few dozen, or on a busy machine
    too few are in flight at once for the small cache to preempt) the simulation may fall behind
    the wall clock (it says so), so idle keep-alive connections are given longer than vLLM's 5 s: a
    client reusing one as the server closes it is a race of the client's, not a lost request."""
    flags = ("--model", "llama3-8b", "--gpu", "h100", "--time-scale", "0.2", "--max-model-len", "2048",
             "--num-gpu-blocks", "150", "--timeout-keep-alive", "120")
    with running_server(*flags) as (url, server):
        engine = server.state.engine

        async def go():
            connector = aiohttp.TCPConnector(limit=256)
            async with aiohttp.ClientSession(connector=connector) as s:
                bodies = [{"prompt": [i] * (20 + i % 100), "max_tokens": 1 + i % 150, "stream": i % 2 == 0,
                           "stream_options": {"include_usage": True} if i % 2 == 0 else None}
                          for i in range(2000)]
                for b in bodies:
                    if b["stream_options"] is None:
                        del b["stream_options"]
                return await asyncio.gather(*[(stream if b["stream"] else post)(s, f"{url}/v1/completions", b)
                                              for b in bodies]), bodies

        answers, bodies = run(go())
        for (status, answer), body in zip(answers, bodies):
            assert status == 200
            usage = answer[-2]["usage"] if body["stream"] else answer["usage"]
            assert usage["completion_tokens"] == body["max_tokens"]
        # nothing kept per request served: the engine, the scheduler and the replica hold none of them, and
        # the request table's rows are reused (at most the requests in flight at once, doubled)
        assert engine.in_flight() == 0 and not engine.schedulers[0].requests and not engine.replicas[0]._rows
        assert len(engine.table) <= 1024 and len(engine.table._free) == len(engine.table)
        assert engine.replicas[0].preemptions["recompute"] > 0  # (the small cache did preempt)


# ------------------------------------------------------------------------- replicas, tokenize
def test_replicas_behind_one_port_are_labelled_by_engine():
    from prometheus_client.parser import text_string_to_metric_families

    with running_server(*FAST, "--replicas", "2", "--router", "round-robin") as (url, server):
        async def go():
            async with aiohttp.ClientSession() as s:
                answers = await asyncio.gather(*[post(s, f"{url}/v1/completions", {"prompt": [i] * 30,
                                                                                   "max_tokens": 4})
                                                 for i in range(6)])
                return answers, await _scrape(s, url)

        answers, text = run(go())
    assert all(status == 200 for status, _ in answers)
    served = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total" and sample.value:
                served[sample.labels["engine"]] = served.get(sample.labels["engine"], 0) + sample.value
    assert served == {"0": 3.0, "1": 3.0}


def test_tokenize_counts_as_the_server_does(server):
    url, _ = server
    status, body = run(_once(post, f"{url}/tokenize", {"prompt": "abcdefgh" * 3}))
    assert status == 200 and body["count"] == 6 and body["max_model_len"] == 2048  # (1 token per 4 characters)
    # a chat prompt counts as the chat route counts it: the text, then 5 template tokens per message and 5 more
    status, body = run(_once(post, f"{url}/tokenize", {"messages": [{"role": "user", "content": "abcdefgh"}]}))
    assert status == 200 and body["count"] == 2 + 5 + 5
    status, body = run(_once(post, f"{url}/tokenize", {"messages": [{"content": "no role"}]}))
    assert status == 400 and body["error"]["param"] == "body.messages.0.role"


def test_a_non_streamed_request_whose_client_gives_up_is_aborted():
    with running_server(*FAST) as (url, server):
        engine = server.state.engine

        async def go():
            timeout = aiohttp.ClientTimeout(total=0.3)
            async with aiohttp.ClientSession(timeout=timeout) as s:
                with pytest.raises(asyncio.TimeoutError):
                    await post(s, f"{url}/v1/completions", {"prompt": [9] * 100, "max_tokens": 1900})
            for _ in range(200):
                if engine.in_flight() == 0:
                    break
                await asyncio.sleep(0.02)

        run(go())
        assert engine.in_flight() == 0 and not engine.schedulers[0].requests


# ------------------------------------------------------------------------------- the pieces
def test_the_request_table_reuses_rows_and_grows():
    import numpy as np

    from pagesim.sim.serve.clock import ServeTable

    table = ServeTable(rows=2)
    a, b = table.take(), table.take()
    table.first_token_s[a] = 1.5
    table.preemptions[a] = 3
    table.reject_reasons[a] = "why"
    c = table.take()  # (none free: it doubles)
    assert len(table) == 4 and len({a, b, c}) == 3
    table.give_back(a)
    assert np.isnan(table.first_token_s[a]) and table.preemptions[a] == 0 and table.n[a] == 1
    assert a not in table.reject_reasons and table.take() == a


def test_output_lengths_spellings(tmp_path):
    from pagesim.sim.serve.lengths import OutputLengths

    assert OutputLengths("max").draw(2, 50, 0, ignore_eos=False) == (50, 50)
    assert OutputLengths("fixed:7").draw(1, 50, 0, ignore_eos=False) == (7,)
    assert OutputLengths("fixed:7").draw(1, 5, 0, ignore_eos=False) == (5,)  # (max_tokens bounds it)
    assert OutputLengths("fixed:7").draw(1, 50, 9, ignore_eos=False) == (9,)  # (and min_tokens)
    assert OutputLengths("fixed:7").draw(1, 50, 0, ignore_eos=True) == (50,)
    drawn = OutputLengths("uniform:3:5", seed=1).draw(200, 100, 0, ignore_eos=False)
    assert set(drawn) == {3, 4, 5}
    trace = tmp_path / "lengths.csv"
    trace.write_text("arrival_s,prompt_len,output_len\n0,10,11\n1,10,13\n")
    assert set(OutputLengths("trace:" + str(trace)).draw(50, 100, 0, ignore_eos=False)) == {11, 13}
    for bad in ("fixed:0", "uniform:5:3", "poisson:3", "fixed:x"):
        with pytest.raises(ValueError, match="--output-lens"):
            OutputLengths(bad)


def test_bad_serve_flags_are_refused_before_listening():
    from pagesim.engine.cli import main

    for flags, words in ((["--time-scale", "0"], "--time-scale"), (["--port", "70000"], "--port"),
                         (["--output-lens", "nope"], "--output-lens"), (["--replicas", "0"], "--replicas")):
        with pytest.raises(SystemExit) as exc:
            main(["serve", *flags])
        assert exc.value.code == 2, (flags, words)


def test_request_token_buckets_follow_vllms_series():
    from pagesim.sim.serve.metrics import request_token_buckets

    assert request_token_buckets(2048) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert request_token_buckets(8192)[-1] == 5000


def test_aborts_reach_requests_held_back_and_requests_running():
    """``Replica.abort`` under asynchronous scheduling: a request that reached the engine while a step
    ran (held back, not yet in the scheduler) is dropped at once; one running is aborted at the next
    step boundary, its blocks freed; both end ``TIMED_OUT`` with their reason."""
    from pagesim.sim.cluster import build_replicas
    from pagesim.sim.metrics import TIMED_OUT
    from pagesim.sim.serve.clock import ServeEngine
    from pagesim.sim.serving_path import serving_path
    from pagesim.sim.setup import RunSpec

    builts = build_replicas(RunSpec(model="llama3-8b", gpu="h100", policy="vllm-v1", max_model_len=2048), 1)
    engine = ServeEngine(builts, serving_path=serving_path("vllm"))
    env = engine.env
    engine.clock.sim_now = lambda: env.now  # (stepped by hand here: simulated time only)
    events: asyncio.Queue = asyncio.Queue()
    running = engine.submit([1] * 300, 500, (500,), events)
    env.run(until=0.05)
    assert engine.replicas[0]._in_flight and running.tokens[0] > 0
    held = engine.submit([2] * 300, 500, (500,), events)
    env.run(until=env.now + 1e-9)  # (its arrival: held back, the step running was scheduled before it)
    assert [request.request_id for _, _, request in engine.replicas[0]._held] == [held.request_id]
    engine.abort(held, "gone")
    engine.abort(running, "gone too")
    env.run(until=env.now + 0.2)
    finishes = []
    while not events.empty():
        event = events.get_nowait()
        if event[1] == "done":
            finishes.append((event[0], event[2], event[3]))
    assert sorted(finishes) == [(0, TIMED_OUT, "gone"), (0, TIMED_OUT, "gone too")]
    scheduler = engine.schedulers[0]
    assert not scheduler.requests and scheduler.kv_usage().allocated_slots == 0 and engine.in_flight() == 0


def test_a_decision_log_is_checked_as_every_output_is(tmp_path):
    from pagesim.engine.cli import main

    for target in (tmp_path, "/"):  # a folder, the root
        with pytest.raises(SystemExit) as exc:
            main(["serve", "--decision-log", str(target)])
        assert exc.value.code == 2


def test_priority_orders_the_queue_under_priority_scheduling():
    """``priority`` reaches the policy: with one sequence at a time, of two requests waiting behind a
    running one, the one of lower priority value is served first (vLLM's convention)."""
    flags = (*FAST, "--scheduling-policy", "priority", "--max-num-seqs", "1")
    with running_server(*flags) as (url, _):
        async def go():
            order = []
            async with aiohttp.ClientSession() as s:
                async def ask(name, priority, delay, tokens):
                    await asyncio.sleep(delay)
                    await post(s, f"{url}/v1/completions", {"prompt": [7] * 20, "max_tokens": tokens,
                                                            "priority": priority})
                    order.append(name)

                # (the first runs about 10 simulated seconds, half a second here: the others queue behind it)
                await asyncio.gather(ask("first", 0, 0.0, 1500), ask("late", 5, 0.05, 20), ask("urgent", -1, 0.1, 20))
            return order

        assert run(go()) == ["first", "urgent", "late"]


def test_an_engine_that_dies_fails_its_requests_and_says_so():
    """A simulation that raises (a policy bug) kills the engine as vLLM's dies: the request in flight
    and every later one answer 500 ``InternalServerError``, ``/health`` 503; nothing hangs."""
    with running_server(*FAST) as (url, server):
        metrics = server.state.metrics  # (told of every step: raising there raises in the replica's loop)

        def broken(*args):
            raise RuntimeError("a policy bug")

        async def go():
            async with aiohttp.ClientSession() as s:
                assert (await post(s, f"{url}/v1/completions", {"prompt": "ok", "max_tokens": 2}))[0] == 200
                metrics.step = broken  # (not the scheduler's method: a compiled build's cannot be replaced)
                during = await post(s, f"{url}/v1/completions", {"prompt": "boom", "max_tokens": 2})
                after = await post(s, f"{url}/v1/completions", {"prompt": "later", "max_tokens": 2})
                async with s.get(f"{url}/health") as r:
                    health = r.status
            return during, after, health

        during, after, health = run(go())
    assert during[0] == 500 and during[1]["error"]["type"] == "InternalServerError"
    assert "a policy bug" in during[1]["error"]["message"]
    assert after[0] == 500 and health == 503


def test_a_port_per_replica_is_a_vllm_server_of_its_own():
    """``--port-per-replica``: replica K answers on port + K, takes every request sent there (no
    router), and its /metrics describe it alone, labelled ``engine="0"`` as a vLLM server labels itself."""
    from prometheus_client.parser import text_string_to_metric_families

    with running_server(*FAST, "--replicas", "2", "--port-per-replica") as (url, server):
        first, second = server.ports
        urls = [f"http://127.0.0.1:{first}", f"http://127.0.0.1:{second}"]

        async def go():
            async with aiohttp.ClientSession() as s:
                sent = [post(s, f"{urls[1]}/v1/completions", {"prompt": [i] * 30, "max_tokens": 3}) for i in range(5)]
                sent.append(post(s, f"{urls[0]}/v1/completions", {"prompt": [9] * 30, "max_tokens": 3}))
                answers = await asyncio.gather(*sent)
                return answers, [await _scrape(s, u) for u in urls]

        answers, texts = run(go())
        assert all(status == 200 for status, _ in answers)
        assert [server.state.engine.replicas[k].scheduler.next_step > 0 for k in (0, 1)] == [True, True]

    def served(text):
        return {sample.labels["engine"]: sample.value for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "vllm:request_success_total" and sample.labels["finished_reason"] == "length"}

    assert [served(text) for text in texts] == [{"0": 1.0}, {"0": 5.0}]
