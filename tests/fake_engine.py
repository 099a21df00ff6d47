"""Fake inference engines: one real HTTP server (aiohttp, in a thread), each engine under a path
prefix of its own (``<url>/<prefix>`` is a backend URL), answering as the engine it plays would.

Each :class:`Engine` names its model its own way whatever it is asked for (llama.cpp its model
file, Ollama a tag), writes its JSON in its own encoding (llama.cpp: sorted keys, compact;
Python servers: ``", "`` and ``": "`` with ASCII escapes; ``\\/`` for a slash), and splits every
SSE event into two writes inside its ``"model"`` member, so chunk boundaries fall there. It
serves chat and completions (whole and streamed), embeddings, Responses and Messages (whole
and streamed, for pools that pass those through), ``/metrics`` (its ``metrics`` text, or a 404
when None) and, for a chat prompt holding ``OVERFLOW``, llama.cpp's context-size error.
Every request body is kept in ``requests``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.ports import free_port

__all__ = ["OVERFLOW", "Engine", "FakeEngines"]

#: a chat prompt holding this gets llama.cpp's ``exceed_context_size_error`` (a 400)
OVERFLOW = "OVERFLOW"
LLAMACPP_OVERFLOW = {"error": {
    "code": 400, "message": "the request exceeds the available context size, try increasing it",
    "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}}


@dataclass
class Engine:
    """One engine: the model name it answers with and how it writes JSON."""

    model: str
    #: "llamacpp" (sorted keys, compact, raw UTF-8), "python" (json.dumps defaults) or
    #: "slashes" (compact, ASCII, "\\/")
    style: str = "llamacpp"
    #: its /metrics text (None: 404)
    metrics: bytes | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: GET /metrics seen
    scrapes: int = 0

    def encode(self, obj: Any) -> bytes:
        if self.style == "python":
            return json.dumps(obj).encode()
        if self.style == "slashes":
            return json.dumps(obj, separators=(",", ":")).replace("/", "\\/").encode()
        return json.dumps(obj, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode()


class FakeEngines:
    """The server; ``url(prefix)`` is the backend URL of ``engines[prefix]``."""

    def __init__(self, engines: dict[str, Engine]) -> None:
        self.engines = engines
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def url(self, prefix: str) -> str:
        return f"{self.base}/{prefix}"

    # --- answers
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        prefix, _, rest = request.path.lstrip("/").partition("/")
        engine = self.engines.get(prefix)
        if engine is None:
            return web.Response(status=404)
        if request.method == "GET":
            engine.scrapes += rest == "metrics"
            if rest == "metrics" and engine.metrics is not None:
                return web.Response(body=engine.metrics, content_type="text/plain")
            return web.Response(status=404, text="File Not Found")
        body = await request.json()
        engine.requests.append(body)
        if rest == "v1/chat/completions" and OVERFLOW in json.dumps(body.get("messages")):
            return web.Response(status=400, body=engine.encode(LLAMACPP_OVERFLOW),
                                content_type="application/json")
        events = _ANSWERS[rest](engine, body)
        if not body.get("stream"):
            return web.Response(body=engine.encode(events[-1][1] if rest in _NATIVE
                                                   else events[0]),
                                content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            name, obj = event if rest in _NATIVE else (None, event)
            data = (f"event: {name}\n".encode() if name else b"") + b"data: " + \
                engine.encode(obj) + b"\n\n"
            cut = data.find(b'"model"')
            cut = cut + 12 if cut >= 0 else len(data) // 2
            for part in (data[:cut], data[cut:]):  # a write boundary inside the member
                await response.write(part)
                await asyncio.sleep(0.002)
        if rest not in _NATIVE:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._started.set()
        self._loop.run_forever()

    def __enter__(self) -> FakeEngines:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
         "prompt_tokens_details": {"cached_tokens": 0}}


def _chat(engine: Engine, body: dict[str, Any]) -> list[Any]:
    head = {"id": "chatcmpl-1", "created": int(time.time()), "model": engine.model,
            "system_fingerprint": "b1-fake"}
    if not body.get("stream"):
        return [{**head, "object": "chat.completion", "usage": USAGE, "choices": [
            {"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "content": "Hi there"}}]}]
    chunk = {**head, "object": "chat.completion.chunk"}
    return [
        {**chunk, "choices": [{"index": 0, "finish_reason": None,
                               "delta": {"role": "assistant", "content": None}}]},
        {**chunk, "choices": [{"index": 0, "finish_reason": None, "delta": {"content": "Hi"}}]},
        {**chunk, "choices": [{"index": 0, "finish_reason": None,
                               "delta": {"content": " there"}}]},
        {**chunk, "choices": [{"index": 0, "finish_reason": "stop", "delta": {}}]},
        {**chunk, "choices": [], "usage": USAGE},
    ]


def _completions(engine: Engine, body: dict[str, Any]) -> list[Any]:
    head = {"id": "cmpl-1", "created": int(time.time()), "model": engine.model,
            "object": "text_completion"}
    if not body.get("stream"):
        return [{**head, "usage": USAGE, "choices": [
            {"index": 0, "finish_reason": "stop", "text": "Hi there", "logprobs": None}]}]
    return [{**head, "choices": [{"index": 0, "finish_reason": None, "text": t,
                                  "logprobs": None}]} for t in ("Hi", " there")] + [
        {**head, "choices": [], "usage": USAGE}]


def _embeddings(engine: Engine, body: dict[str, Any]) -> list[Any]:
    return [{"object": "list", "model": engine.model, "usage": {
        "prompt_tokens": 2, "total_tokens": 2}, "data": [
        {"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 0.125]}]}]


def _responses(engine: Engine, body: dict[str, Any]) -> list[Any]:
    base = {"id": "resp_1", "object": "response", "created_at": int(time.time()),
            "model": engine.model, "status": "in_progress", "output": [], "usage": None}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Hi there", "annotations": []}]}
    done = {**base, "status": "completed", "output": [item], "usage": {
        "input_tokens": 5, "output_tokens": 2, "total_tokens": 7,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0}}}
    return [
        ("response.created", {"type": "response.created", "sequence_number": 0,
                              "response": base}),
        ("response.output_text.delta", {"type": "response.output_text.delta",
                                        "sequence_number": 1, "item_id": "msg_1",
                                        "output_index": 0, "content_index": 0,
                                        "delta": "Hi there"}),
        ("response.completed", {"type": "response.completed", "sequence_number": 2,
                                "response": done}),
    ] if body.get("stream") else [("", done)]


def _messages(engine: Engine, body: dict[str, Any]) -> list[Any]:
    message: dict[str, Any] = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": engine.model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1}}
    if not body.get("stream"):
        return [("", {**message, "content": [{"type": "text", "text": "Hi there"}],
                      "stop_reason": "end_turn", "usage": {"input_tokens": 5,
                                                           "output_tokens": 2}})]
    return [
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "Hi there"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                              "stop_sequence": None},
                           "usage": {"output_tokens": 2}}),
        ("message_stop", {"type": "message_stop"}),
    ]


_ANSWERS = {"v1/chat/completions": _chat, "v1/completions": _completions,
            "v1/embeddings": _embeddings, "v1/responses": _responses,
            "v1/messages": _messages}
_NATIVE = {"v1/responses", "v1/messages"}
