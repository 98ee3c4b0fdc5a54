"""The HTTP server: vLLM's OpenAI-compatible routes (FastAPI) in front of a ``ServeEngine``.

Routes, as vLLM 0.33 serves them: ``POST /v1/completions`` and ``/v1/chat/completions`` (streaming
and not), ``GET /v1/models``, ``/health`` and ``/ping``, ``/version``, ``/load``, ``/metrics``,
and ``POST /tokenize`` / ``/detokenize`` (``vllm bench serve`` calls them for its random datasets).
Bodies and errors are ``openai_api``'s.

A request's prompts enter the engine as separate requests (vLLM's too), their events on one queue
(``ServeEngine.submit``). A stream sends what has arrived: tokens of one choice that queued up
while the client was slow go out in one chunk, as vLLM's output collector merges them. When the
client goes away (Starlette cancels a stream's generator on ``http.disconnect``; a non-streaming
handler races a disconnect listener, as vLLM's ``with_cancellation``) every unfinished request
is aborted in the engine, which frees its blocks at the next step boundary.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from pagesim.sim.metrics import COMPLETED, REJECTED
from pagesim.sim.serve import openai_api as api
from pagesim.sim.serve.clock import DEAD, EngineDead, ServeEngine
from pagesim.sim.serve.lengths import OutputLengths
from pagesim.sim.serve.metrics import CONTENT_TYPE, ServeMetrics



@dataclass
class ServeState:
    """What the routes need: the engine, its metrics, and the served model as clients see it."""

    engine: ServeEngine
    metrics: ServeMetrics
    tokenizer: object  # pagesim.traces.bench.tokenizer: a Hugging Face tokenizer or the estimate
    model_name: str  # the name clients send (vLLM's --served-model-name; default the model)
    model_root: str
    max_model_len: int
    lengths: OutputLengths
    fingerprint: str
    created: int
    # one replica per port (``--port-per-replica``): local port -> (its replica, its metrics); None:
    # every replica behind one port, the router choosing, ``metrics`` covering them all
    ports: dict[int, tuple[int, ServeMetrics]] | None = None

    def replica_of(self, request: Request) -> tuple[int | None, ServeMetrics]:
        """The replica the port ``request`` came in on serves (None: the router's choice), and its metrics."""
        if self.ports is None:
            return None, self.metrics
        server = request.scope.get("server") or (None, None)
        return self.ports.get(server[1], (None, self.metrics))


def fingerprint(describe: dict, tp: int) -> str:
    """``system_fingerprint`` as vLLM's ``--fingerprint-mode full`` spells it, over pagesim's deployment."""
    digest = hashlib.sha256(json.dumps(describe, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"vllm-{api.VLLM_VERSION}" + (f"-tp{tp}" if tp > 1 else "") + f"-{digest}"


def create_app(state: ServeState) -> FastAPI:
    engine = state.engine

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(engine.run(), name="pagesim-serve-clock")
        try:
            yield
        finally:
            engine.stop()
            await task

    app = FastAPI(title="pagesim serve", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(api.ApiError)
    async def _api_error(request, exc: api.ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(EngineDead)
    async def _dead(request, exc: EngineDead):
        return JSONResponse(_engine_dead(str(exc)).body(), status_code=500)

    @app.get("/health")
    @app.get("/ping")
    async def health():
        return Response(status_code=200 if engine.dead is None else 503)

    @app.get("/version")
    async def version():
        return {"version": api.VLLM_VERSION}

    @app.get("/load")
    async def load(request: Request):
        return {"server_load": engine.in_flight(state.replica_of(request)[0])}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [api.model_card(state.model_name, state.model_root, state.max_model_len,
                                                          state.created)]}

    @app.get("/metrics")
    async def metrics(request: Request):
        return Response(state.replica_of(request)[1].exposition(), media_type=CONTENT_TYPE)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        obj = await _json(request)
        if not isinstance(obj, dict):
            raise api.validation_error([{"type": "model_attributes_type", "loc": ("body",),
                                         "msg": "Input should be a valid dictionary or object to extract fields from",
                                         "input": obj}])
        api.check_model(obj.get("model"), state.model_name)
        if "messages" in obj:
            tokens = _chat_ids(state, _validated(obj, api.ChatBody).messages)
        else:
            tokens = _ids(state, str(obj.get("prompt", "")))
        return {"count": len(tokens), "max_model_len": state.max_model_len, "tokens": tokens, "token_strs": None}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        obj = await _json(request)
        tokens = obj.get("tokens") if isinstance(obj, dict) else None
        if not isinstance(tokens, list):
            raise api.bad_request("tokens must be a list of token ids", "tokens")
        decode = getattr(getattr(state.tokenizer, "_tokenizer", None), "decode", None)
        # without a tokenizer, ids are hashes of text pieces: any text of as many pieces counts the same
        return {"prompt": decode(tokens) if decode else "abcd" * len(tokens)}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = _validated(await _json(request), api.CompletionBody)
        api.check_model(body.model, state.model_name)
        api.check_sampling(body)
        prompts = [_ids(state, p) for p in api.prompts_of(body)]
        return await _serve(state, request, body, prompts, "cmpl", body.max_tokens, "max_tokens", chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = _validated(await _json(request), api.ChatBody)
        api.check_model(body.model, state.model_name)
        api.check_sampling(body)
        ids = _chat_ids(state, body.messages)
        asked, name = ((body.max_completion_tokens, "max_completion_tokens") if body.max_completion_tokens is not None
                       else (body.max_tokens, "max_tokens"))
        return await _serve(state, request, body, [ids], "chatcmpl", asked, name, chat=True)

    return app


def _engine_dead(reason: str) -> api.ApiError:
    """vLLM's answer once its engine is dead (``EngineDeadError``: 500 ``InternalServerError``)."""
    return api.ApiError(500, "InternalServerError", f"The simulated engine stopped ({reason}); restart the server.")


async def _json(request: Request):
    """The body as JSON, refused as vLLM refuses it (400 ``Bad Request``) when it is not."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise api.ApiError(400, "Bad Request",
                           "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed")
    raw = await request.body()
    if not raw:
        raise api.validation_error([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        pos, reason = (exc.pos, exc.msg) if isinstance(exc, json.JSONDecodeError) else (0, str(exc))
        raise api.validation_error([{"type": "json_invalid", "loc": ("body", pos), "msg": "JSON decode error",
                                     "input": {}, "ctx": {"error": reason}}]) from None


def _validated(obj, model):
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
        raise api.validation_error(errors) from None


def _ids(state: ServeState, prompt) -> list[int]:
    if isinstance(prompt, list):
        return [int(t) for t in prompt]
    if len(prompt) > state.max_model_len * 64:  # (vLLM: more characters than max_model_len tokens can hold)
        raise api.prompt_too_long(len(prompt) // 4, state.max_model_len)
    return list(state.tokenizer.encode(prompt))


def _chat_ids(state: ServeState, messages: list[api.ChatMessage]) -> list[int]:
    """A chat prompt's ids: its messages' text, then the template's tokens (ids of their own, the
    same in every prompt; ``openai_api.chat_text``)."""
    text, added = api.chat_text(messages)
    return _ids(state, text) + [0] * added


async def _serve(state: ServeState, request: Request, body, prompts: list[list[int]], kind: str, asked: int | None,
                 name: str, *, chat: bool):
    engine = state.engine
    budgets = [api.output_budget(len(ids), asked, state.max_model_len, name, body.min_tokens) for ids in prompts]
    events: asyncio.Queue = asyncio.Queue()
    rid = api.request_id(kind, request.headers.get("x-request-id"))
    replica = state.replica_of(request)[0]
    served = [engine.submit(ids, budget, state.lengths.draw(body.n, budget, body.min_tokens, body.ignore_eos), events,
                            tag=i, priority=body.priority, replica=replica)
              for i, (ids, budget) in enumerate(zip(prompts, budgets))]
    stream = _Stream(state, rid, body, served, events, chat)
    if body.stream:
        return StreamingResponse(stream.chunks(), media_type="text/event-stream")
    collect = asyncio.ensure_future(stream.collect())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not collect.done():  # the client went away (or the server stops): abort what is left, send nothing
            collect.cancel()
            stream.abort()
    if not collect.done():
        return Response()
    result = collect.result()
    if stream.error is not None:
        return JSONResponse(stream.error.body(), status_code=stream.error.status)
    return JSONResponse(result)


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class _Stream:
    """One HTTP request's choices as they come: chunks (streaming) or the whole response."""

    def __init__(self, state: ServeState, rid: str, body, served: list, events: asyncio.Queue, chat: bool):
        self.state, self.rid, self.body, self.served, self.events, self.chat = state, rid, body, served, events, chat
        self.n = body.n
        self.created = api.now_s()
        self.model = state.model_name
        self.counts = [0] * (len(served) * self.n)  # tokens per choice
        self.finish: list[str | None] = [None] * len(self.counts)
        self.open = len(served)
        self.error: api.ApiError | None = None

    def abort(self) -> None:
        for served in self.served:
            self.state.engine.abort(served)

    def _take(self, event) -> list[tuple[int, int, bool]]:
        """Apply one event; returns ``(choice, new tokens, finished)`` for a token event."""
        tag, what = event[0], event[1]
        served = self.served[tag]
        if what == "token":
            sample, count = event[2], event[3]
            choice = tag * self.n + sample
            self.counts[choice] = count
            if count == served.lengths[sample]:
                self.finish[choice] = "length" if count >= served.max_tokens else "stop"
                return [(choice, 1, True)]
            return [(choice, 1, False)]
        status, reason = event[2], event[3]
        self.open -= 1
        if status == REJECTED:
            self.error = api.ApiError(400, "BadRequestError", f"the engine refused the request: {reason}")
        elif status == DEAD:
            self.error = _engine_dead(reason)
        elif status != COMPLETED:
            self.error = api.ApiError(500, "InternalServerError", f"the request was aborted: {reason}")
        return []

    async def collect(self) -> dict:
        while self.open:
            self._take(await self.events.get())
        if self.error is not None:
            return self.error.body()  # (_serve sends it with its status)
        state = self.state
        prompt_tokens = sum(s.prompt_len for s in self.served)
        completion = sum(self.counts)
        choices = [(count, finish or "length") for count, finish in zip(self.counts, self.finish)]
        build = api.chat_response if self.chat else api.completion_response
        return build(self.rid, self.created, self.model, choices, prompt_tokens, completion, state.fingerprint)

    async def chunks(self):
        """The SSE events: tokens as they arrive, a finish per choice, usage, ``[DONE]``."""
        options = self.body.stream_options
        include_usage = bool(options and options.include_usage)
        continuous = include_usage and bool(options.continuous_usage_stats)
        fingerprint = None if include_usage else self.state.fingerprint
        make = api.chat_chunk if self.chat else api.completion_chunk
        started = [False] * len(self.counts)
        try:
            while self.open:
                pending = [await self.events.get()]
                while not self.events.empty():
                    pending.append(self.events.get_nowait())
                merged: dict[int, list] = {}  # choice -> [tokens, finished], in arrival order
                for event in pending:
                    for choice, count, done in self._take(event):
                        entry = merged.setdefault(choice, [0, False])
                        entry[0] += count
                        entry[1] = entry[1] or done
                out = []
                for choice, (count, done) in merged.items():
                    prompt_len = self.served[choice // self.n].prompt_len
                    chunk_usage = api.usage(prompt_len, self.counts[choice]) if continuous else None
                    if self.chat and not started[choice]:
                        started[choice] = True
                        out.append(api.sse(make(self.rid, self.created, self.model, choice,
                                                {"role": "assistant", "content": ""}, None,
                                                api.usage(prompt_len, 0) if continuous else None)))
                    text = api.TOKEN_TEXT * count
                    finish = self.finish[choice] if done else None
                    payload = {"content": text} if self.chat else text
                    out.append(api.sse(make(self.rid, self.created, self.model, choice, payload, finish, chunk_usage,
                                            fingerprint if done else None)))
                if self.error is not None:
                    # (completions: json.dumps' spacing, as vLLM writes this event; chat: compact)
                    error = json.dumps(self.error.body()) if not self.chat else json.dumps(self.error.body(),
                                                                                         separators=(",", ":"))
                    out.append(api.sse(error))
                    self.abort()
                    yield b"".join(out)
                    break
                if out:
                    yield b"".join(out)
            else:
                if include_usage:
                    prompt_tokens = sum(s.prompt_len for s in self.served)
                    obj = "chat.completion.chunk" if self.chat else "text_completion"
                    yield api.sse(api.usage_chunk(self.rid, self.created, self.model, obj, prompt_tokens,
                                                  sum(self.counts), self.state.fingerprint))
            yield api.DONE
        finally:
            if self.open:  # cancelled: the client disconnected
                self.abort()
