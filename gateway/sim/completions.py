"""Chat and text completions: parse the request, run it through the engine, answer.

Parsing decides everything up front (prompt tokens, the exact words, finish reason), so the engine
only counts tokens and the response loop only slices the word list. A streaming response sends its
headers once the request is accepted, then one SSE event per token as the engine emits them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.sim.asgi import SSE_HEADERS, abort_connection, send_bytes
from gateway.sim.engine import EngineError, QueueFullError, RequestState, RequestTooLargeError
from gateway.sim.errors import BadRequest, Overloaded, SimHTTPError
from gateway.sim.shapes import DONE, ChunkFormat, completion_body, usage
from gateway.sim.text import generate_words, request_seed
from gateway.tokenizers import count_chat_prompt, count_text

if TYPE_CHECKING:
    from gateway.sim.asgi import Send
    from gateway.sim.config import SimConfig
    from gateway.sim.engine import Engine, SimRequest
    from gateway.sim.faults import FaultConfig

__all__ = ["Call", "Completion", "parse_completion", "respond"]

_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)
class Completion:
    """What one chat or text completion will produce, decided before it runs."""

    chat: bool
    model: str
    prompt_tokens: int
    words: list[str]
    finish_reason: str
    stream: bool
    include_usage: bool


@dataclass(slots=True)
class Call:
    """Per-request mutable state shared with the disconnect watcher."""

    disconnected: bool = False
    request: SimRequest | None = None

    def on_disconnect(self) -> None:
        self.disconnected = True
        if self.request is not None:
            self.request.cancel()


def _max_tokens(body: dict[str, Any], default: int) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest(f"{key} must be a positive integer", param=key)
        return value
    return default


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise BadRequest("stop must be a string or a list of strings", param="stop")


def _prompt_tokens(body: dict[str, Any], chat: bool, encoding: str) -> tuple[int, bytes]:
    """Prompt token count and the bytes that seed the generated text."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages must be a list of message objects", param="messages")
        return count_chat_prompt(messages, encoding), _encode(messages)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return count_text(prompt, encoding), prompt.encode()
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(count_text(p, encoding) for p in prompt), _encode(prompt)
        if all(isinstance(p, int) for p in prompt):
            return len(prompt), _encode(prompt)
        if all(isinstance(p, list) for p in prompt):
            return sum(len(p) for p in prompt), _encode(prompt)
    raise BadRequest("prompt must be a string, a list of strings or token arrays", param="prompt")


def parse_completion(body: dict[str, Any], *, chat: bool, model: str, cfg: SimConfig) -> Completion:
    """Validate a request body and decide its output."""
    prompt_tokens, key = _prompt_tokens(body, chat, cfg.encoding)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest("seed must be an integer", param="seed")
    n = _max_tokens(body, cfg.default_max_tokens)
    words, finish = generate_words(request_seed(key, seed), n, _stop(body))
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return Completion(
        chat=chat,
        model=model,
        prompt_tokens=prompt_tokens,
        words=words,
        finish_reason=finish,
        stream=bool(body.get("stream")),
        include_usage=include_usage,
    )


def _submit(engine: Engine, c: Completion) -> SimRequest:
    try:
        return engine.submit(c.prompt_tokens, len(c.words))
    except QueueFullError as exc:
        raise Overloaded(str(exc)) from exc
    except RequestTooLargeError as exc:
        raise BadRequest(str(exc), param="max_tokens") from exc
    except EngineError as exc:
        raise Overloaded(str(exc)) from exc


async def respond(
    send: Send, engine: Engine, c: Completion, faults: FaultConfig, call: Call
) -> None:
    """Answer a parsed completion; raises :class:`SimHTTPError` only before headers are sent."""
    if c.stream:
        await _stream(send, engine, c, faults, call)
    else:
        await _whole(send, engine, c, faults, call)


async def _whole(
    send: Send, engine: Engine, c: Completion, faults: FaultConfig, call: Call
) -> None:
    if faults.stall_ms > 0:
        await asyncio.sleep(faults.stall_ms / 1000)
    if call.disconnected:
        return
    req = call.request = _submit(engine, c)
    await req.wait(len(c.words))
    if req.state is not RequestState.FINISHED:
        if not call.disconnected:  # the engine shut down under us
            raise Overloaded("engine stopped before the request finished")
        return
    text = "".join(c.words[: req.generated])
    u = usage(c.prompt_tokens, req.generated)
    body = completion_body(
        chat=c.chat, model=c.model, text=text, finish_reason=c.finish_reason, usage_=u
    )
    await send_bytes(send, 200, body)


async def _stream(
    send: Send, engine: Engine, c: Completion, faults: FaultConfig, call: Call
) -> None:
    if engine.num_waiting >= engine.profile.queue_limit:
        raise Overloaded(f"waiting queue full ({engine.profile.queue_limit} requests)")
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    fmt = ChunkFormat(chat=c.chat, model=c.model)
    limit = faults.disconnect_after
    if faults.stall_ms > 0:
        await asyncio.sleep(faults.stall_ms / 1000)
    if limit == 0:
        await _abort(send, call)
        return
    if call.disconnected:
        return
    try:
        req = call.request = _submit(engine, c)
    except SimHTTPError as exc:  # headers are out: report in-stream, as vLLM does
        await _send(send, fmt.error(exc.message, exc.type, exc.code) + DONE, more=False)
        return
    seen = 0
    words = c.words
    token = fmt.token
    while True:
        n = await req.wait(seen)
        if req.state is RequestState.CANCELLED:
            if not call.disconnected:  # the engine shut down: end the stream cleanly
                err = fmt.error("engine stopped", "server_error", "engine_stopped")
                await _send(send, err + DONE, more=False)
            return
        if n > seen:
            if limit is not None and n >= limit:
                await _send(send, _events(fmt, words, seen, limit), more=True)
                await _abort(send, call)
                return
            # Hot path: one token per wake-up unless this consumer fell behind.
            body = token(words[seen]) if n == seen + 1 and seen else _events(fmt, words, seen, n)
            await send({"type": "http.response.body", "body": body, "more_body": True})
            seen = n
        if req.done:
            break
    tail = fmt.finish(c.finish_reason)
    if c.include_usage:
        tail += fmt.usage(usage(c.prompt_tokens, req.generated))
    await _send(send, tail + DONE, more=False)


def _events(fmt: ChunkFormat, words: list[str], start: int, end: int) -> bytes:
    """Events for tokens ``start..end``; the role event leads the first token's."""
    events = [fmt.token(w) for w in words[start:end]]
    if start == 0:
        events.insert(0, fmt.role())
    return b"".join(events)


async def _send(send: Send, body: bytes, *, more: bool) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more})


async def _abort(send: Send, call: Call) -> None:
    """Break the connection without ending the chunked body, then wait for the server to notice.

    Waiting lets uvicorn mark the request disconnected before the app returns, so it does not log
    "returned without completing response".
    """
    if call.request is not None:
        call.request.cancel()
    if not abort_connection(send):
        raise ConnectionAbortedError("simulated disconnect")  # server without a transport
    for _ in range(100):
        if call.disconnected:
            return
        await asyncio.sleep(0.001)
