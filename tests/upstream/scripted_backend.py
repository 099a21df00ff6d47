"""A backend whose streams are written byte for byte by the test, over a real socket.

:class:`ScriptedBackend` is a bare HTTP/1.1 server (asyncio, in a thread) answering
``/v1/chat/completions`` and ``/v1/messages`` with one deterministic answer, :data:`WORDS`,
streamed one word an event, each HTTP chunk written alone (a pause between writes, so the
gateway reads them one by one). A request that continues a text (chat: a final assistant
message with ``continue_final_message``; Messages: a final assistant turn, Anthropic's
prefill) is answered with the rest of :data:`WORDS` after that text. Its ``fault`` (set by
the test, per backend) breaks its answers:

* ``("abort", n)``: after ``n`` events the connection is closed without ending the body;
* ``("cut", n, k)``: the same, with the first ``k`` bytes of the next event before the close;
* ``("error", n, split)``: after ``n`` events the engine's error event, cut ``split`` bytes
  into it: its first part in the read of the ``n``-th event, the rest in the next read (and,
  on chat, a ``[DONE]`` after it: nothing after the error may reach the client), then the
  body ends cleanly (vLLM's way).

Every request body is kept in ``requests``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from tests.ports import free_port

__all__ = ["CHAT_ERROR", "MESSAGES_ERROR", "WORDS", "ScriptedBackend", "whole"]

#: the answer, one token a word in o200k_base; one word ends with a line break (a prefill
#: cannot end in whitespace: the continuation writes it again)
WORDS = ["Hello", " world", ",", " this", " is", " a", " test", ".\n", "Bye", " now", "."]
#: a chat engine's error event (vLLM's shape)
CHAT_ERROR = (b'data: {"error": {"object": "error", "message": "engine died", '
              b'"type": "InternalServerError", "code": 500}}\n\n')
#: Anthropic's error event
MESSAGES_ERROR = (b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", '
                  b'"message": "Overloaded"}}\n\n')
INPUT_TOKENS = 12


def whole() -> str:
    return "".join(WORDS)


def _rest(prefix: str) -> list[str]:
    """The pieces of the answer after ``prefix`` (one of its beginnings): what is left of the
    word it ends inside, then the next words."""
    text = whole()
    assert text.startswith(prefix), (prefix, text)
    pieces: list[str] = []
    at = 0
    for word in WORDS:
        end = at + len(word)
        if end > len(prefix):
            pieces.append(word[max(0, len(prefix) - at):])
        at = end
    return pieces


def _prefill(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


class ScriptedBackend:
    """The server; ``url`` is its backend URL, ``fault`` its next fresh answers' break."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.fault: tuple[Any, ...] | None = None
        self.requests: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None

    # --- the answers
    def _chat(self, body: dict[str, Any]) -> tuple[list[bytes], tuple[Any, ...] | None]:
        messages = body["messages"]
        last = messages[-1]
        continuing = body.get("continue_final_message") and last["role"] == "assistant"
        pieces = _rest(last["content"]) if continuing else list(WORDS)
        head = {"id": "chatcmpl-engine", "object": "chat.completion.chunk", "created": 1,
                "model": body["model"]}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n"

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": p}) for p in pieces]
        events.append(chunk({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": INPUT_TOKENS, "completion_tokens": len(pieces),
                     "total_tokens": INPUT_TOKENS + len(pieces)}
            events.append(b"data: " + json.dumps({**head, "choices": [], "usage": usage})
                          .encode() + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        return events, self.fault

    def _messages(self, body: dict[str, Any]) -> tuple[list[bytes], tuple[Any, ...] | None]:
        last = body["messages"][-1]
        continuing = last["role"] == "assistant"
        prefill = _prefill(last["content"]) if continuing else ""
        pieces = _rest(prefill)
        assert len(pieces) <= body["max_tokens"], (pieces, body["max_tokens"])
        inputs = INPUT_TOKENS + len(prefill.split())

        def event(kind: str, data: dict[str, Any]) -> bytes:
            return f"event: {kind}\ndata: ".encode() + json.dumps(
                {"type": kind, **data}).encode() + b"\n\n"

        message = {"id": "msg_engine", "type": "message", "role": "assistant",
                   "model": body["model"], "content": [], "stop_reason": None,
                   "stop_sequence": None,
                   "usage": {"input_tokens": inputs, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 0, "output_tokens": 1}}
        events = [event("message_start", {"message": message}),
                  event("content_block_start",
                        {"index": 0, "content_block": {"type": "text", "text": ""}}),
                  event("ping", {})]
        events += [event("content_block_delta", {"index": 0, "delta": {
            "type": "text_delta", "text": p}}) for p in pieces]
        events.append(event("content_block_stop", {"index": 0}))
        events.append(event("message_delta", {
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"input_tokens": inputs, "output_tokens": len(pieces)}}))
        events.append(event("message_stop", {}))
        return events, self.fault

    # --- HTTP
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = json.loads(await reader.readexactly(length))
            self.requests.append(body)
            if path.endswith("/v1/messages"):
                events, fault = self._messages(body)
            elif path.endswith("/v1/chat/completions"):
                events, fault = self._chat(body)
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n"
                             b"connection: close\r\n\r\n")
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
            await self._stream(writer, events, fault, messages=path.endswith("/v1/messages"))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, events: list[bytes],
                      fault: tuple[Any, ...] | None, *, messages: bool) -> None:
        async def write(piece: bytes) -> None:
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)  # read alone

        if fault is None:
            for event in events:
                await write(event)
        elif fault[0] in ("abort", "cut"):
            for event in events[:fault[1]]:
                await write(event)
            if fault[0] == "cut":  # the start of the next event, its end never
                await write(events[fault[1]][:fault[2]])
            writer.transport.abort()  # no end of the chunked body: a broken stream
            return
        else:  # the error event: its first part in the read of the event before it
            error = MESSAGES_ERROR if messages else CHAT_ERROR
            before, split = events[:fault[1]], fault[2]
            for event in before[:-1]:
                await write(event)
            await write(before[-1] + error[:split])
            await write(error[split:] + b"data: [DONE]\n\n" if not messages else
                        error[split:])
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    # --- the thread
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

        self._loop.run_until_complete(start())
        self._started.set()
        self._loop.run_forever()

    def __enter__(self) -> ScriptedBackend:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
