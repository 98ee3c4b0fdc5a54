"""A ``pagesim serve`` app on a free localhost port in a background thread, and an aiohttp client
for it (tests/test_serve.py, benchmarks/bench_serve.py)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from contextlib import contextmanager

import pytest

uvicorn = pytest.importorskip("uvicorn")
aiohttp = pytest.importorskip("aiohttp")


@contextmanager
def running_server(*flags: str):
    """``pagesim serve FLAGS`` listening on 127.0.0.1 (a free port; with ``--port-per-replica`` free
    ports in a row, ``server.ports``): yields ``(base_url, server)``, the first port's URL."""
    from pagesim.engine.cli import build_parser
    from pagesim.sim.serve.cli import bind, build_server

    args = build_parser().parse_args(["serve", *flags])
    sockets = None
    if args.port_per_replica:
        for base in range(20000 + os.getpid() % 20000, 65000, 97):  # (ports in a row, free now)
            try:
                sockets = [bind("127.0.0.1", base + k) for k in range(args.replicas)]
                break
            except ValueError:
                continue
        args.port = base
        for sock in sockets:
            sock.close()
        sockets = [bind("127.0.0.1", base + k) for k in range(args.replicas)]
    server = build_server(args)
    config = uvicorn.Config(server.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                            timeout_keep_alive=args.timeout_keep_alive)
    http = uvicorn.Server(config)
    thread = threading.Thread(target=http.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not http.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("pagesim serve did not start")
        time.sleep(0.02)
    port = args.port if sockets else http.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        http.should_exit = True
        thread.join(timeout=30)
        server.close()
        for sock in sockets or ():
            sock.close()


async def post(session, url: str, body, *, raw: bytes | None = None, headers=None):
    """``(status, parsed JSON or text)`` of one POST."""
    kwargs = {"data": raw, "headers": headers or {"content-type": "application/json"}} if raw is not None \
        else {"json": body}
    async with session.post(url, **kwargs) as response:
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except json.JSONDecodeError:
            return response.status, text


async def stream(session, url: str, body) -> tuple[int, list]:
    """``(status, events)``: each SSE event's JSON (``"[DONE]"`` as is), in order."""
    events = []
    async with session.post(url, json=body) as response:
        buffer = b""
        async for piece in response.content.iter_any():
            buffer += piece
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                assert event.startswith(b"data: "), event
                payload = event[len(b"data: "):].decode()
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        assert buffer == b"", buffer
        return response.status, events


def run(coroutine):
    return asyncio.run(coroutine)
