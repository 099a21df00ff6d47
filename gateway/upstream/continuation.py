"""A stream that survives its engine: broken after its first byte, it goes on on another backend.

``pools[].continuation`` (off by default; on for pools whose backends serve the same weights).
When a chat stream breaks after its first byte reached the client (a reset connection, an idle
timeout, an engine killed: the relay's ``UpstreamError``), :class:`Continuer` asks another
backend of the pool (the usual pick; ``route.tried`` keeps it off the failed one) to continue
the text already sent, and the relay sends its chunks into the same client stream:

* the request: the upstream body as first sent (model, cache salt, ``include_usage`` kept),
  plus the text already streamed as a final assistant message, with
  ``continue_final_message: true`` and ``add_generation_prompt: false`` (vLLM, SGLang, and
  llama.cpp's server, which otherwise echoes the prefill in its answer), and its output limit
  reduced by the tokens sent (:func:`continuation_body`);
* the splice (:class:`Splice`): the continuation's role-only first chunk is dropped (the
  client had its role), its id and model become the client's (the gateway's id, the public
  name), its usage becomes the whole answer's (the original prompt, and the tokens sent before
  plus the continuation's output: what the client received), and its finish and usage chunks
  carry ``"metadata": {"x-gateway-continued": "1"}``.

Then the scanner sees one stream, so the meter, the translated APIs (their events are made
from the chat chunks the scanner decodes, in order) and the record need nothing else. The
record says ``continued`` and holds the continuations' prompt (``continuation_prompt``: the
prompt plus the prefix, as the backend reported it, else the gateway's count) and its price
(``continuation_cost``, from the meter: ``accounting.meter.add_continuation``), the operator's
cost, charged to the tenant too only with ``continuation.billed``. The pool's
``gateway_stream_continuation_prompt_tokens_total`` counts those tokens.

Not continued (the error event ends the stream, as without continuation): a stream that
carried tool calls or reasoning or several choices (``Scanner.reply_text`` is None), one whose
client holds part of an event (the break fell inside one), one past
``max_output_tokens`` or its own output limit, past ``max_attempts`` continuations, or when no
other backend answers with a stream.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.errors import GatewayError
from gateway.upstream.forward import forward, release

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from gateway.accounting import Scanner
    from gateway.config import Timeouts
    from gateway.config.model import Continuation
    from gateway.context import RequestContext
    from gateway.http.base import UpstreamClient
    from gateway.http.errors import UpstreamError
    from gateway.routing.router import Route, Router
    from gateway.telemetry import Metrics, RequestSpan
    from gateway.types import RawHeaders
    from gateway.upstream.forward import Forwarded
    from gateway.upstream.rename import AnswerRewriter

__all__ = ["MARKER", "Continuer", "Splice", "continuation_body"]

log = logging.getLogger("gateway.upstream")

#: what a continued stream's finish and usage chunks carry
MARKER = {"x-gateway-continued": "1"}
_decode = msgspec.json.decode
_encode = msgspec.json.encode
_LIMITS = ("max_completion_tokens", "max_tokens")


def continuation_body(body: bytes, prefix: str, sent: int) -> bytes | None:
    """The upstream ``body`` (a chat request) continuing the assistant text ``prefix`` of
    ``sent`` tokens; None when there is nothing left to ask for (its limit reached)."""
    payload = _decode(body)
    for name in _LIMITS:
        limit = payload.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - sent < 1:
                return None
            payload[name] = limit - sent
    payload["messages"] = [*payload.get("messages", []),
                           {"role": "assistant", "content": prefix}]
    payload["continue_final_message"] = True
    payload["add_generation_prompt"] = False
    payload.pop("n", None)
    return _encode(payload)


class Splice:
    """The continuation's SSE bytes made the rest of the client's stream (see the module
    docstring); per continuation, fed every chunk in order, then flushed.

    ``prompt``: the original prompt's tokens; ``sent``: the output tokens the client had.
    ``usage`` is the continuation's own usage once its usage chunk passed (else None).
    """

    __slots__ = ("_buf", "_rewriter", "_sep", "_started", "prompt", "sent", "usage")

    def __init__(self, rewriter: AnswerRewriter, *, prompt: int, sent: int) -> None:
        self._rewriter = rewriter
        self.prompt, self.sent = prompt, sent
        self._buf = b""
        self._sep: bytes | None = None
        self._started = False  # its first data chunk seen (the role-only one dropped)
        self.usage: dict[str, Any] | None = None

    def feed(self, data: bytes) -> bytes:
        """The bytes of whole events, spliced (a partial event waits for its end)."""
        data = self._buf + data
        sep = self._sep or self._detect(data)
        if sep is None:
            self._buf = data
            return b""
        cut = data.rfind(sep)
        if cut < 0:
            self._buf = data
            return b""
        cut += len(sep)
        self._buf = data[cut:]
        events = data[:cut].split(sep)[:-1]
        out = b"".join(e + sep for event in events if (e := self._event(event)))
        return self._rewriter.chunk(out)

    def flush(self) -> bytes:
        """The bytes still held at the continuation's end (a last event with no blank line)."""
        tail, self._buf = self._buf, b""
        event = tail.rstrip(b"\r\n")
        out = self._event(event) if event.strip() else b""
        if out:
            out += tail[len(event):]
        return self._rewriter.chunk(out) + self._rewriter.flush()

    def _detect(self, data: bytes) -> bytes | None:
        i = data.find(b"\n")
        if i < 0:
            return None
        self._sep = b"\r\n\r\n" if i > 0 and data[i - 1] == 13 else b"\n\n"
        return self._sep

    def _event(self, event: bytes) -> bytes:
        """One event as the client gets it (b"": dropped)."""
        if not event.startswith(b"data:"):
            return event  # a comment, a keep-alive
        payload = event[5:].strip()
        if payload == b"[DONE]":
            return event
        started, self._started = self._started, True
        if started and not _rewritten(payload):
            return event  # the common case: a content delta, passed as the backend wrote it
        try:
            chunk = _decode(payload)
        except msgspec.DecodeError:
            return event
        if not isinstance(chunk, dict):
            return event
        if not started and _role_only(chunk):
            return b""
        usage = chunk.get("usage")
        finished = any(isinstance(c, dict) and c.get("finish_reason")
                       for c in chunk.get("choices") or ())
        if not isinstance(usage, dict) and not finished:
            return event
        if isinstance(usage, dict):
            self.usage = usage
            chunk["usage"] = self._whole_usage(usage)
            chunk.pop("timings", None)  # llama.cpp's cache figures are the continuation's
        chunk["metadata"] = {**(chunk.get("metadata") or {}), **MARKER}
        rewriter = self._rewriter  # re-encoded: the engine's bytes are not there to rewrite
        if rewriter.gateway_id is not None and "id" in chunk:
            chunk["id"] = rewriter.gateway_id
        if rewriter.public is not None and "model" in chunk:
            chunk["model"] = rewriter.public
        return b"data: " + _encode(chunk)

    def _whole_usage(self, usage: dict[str, Any]) -> dict[str, int]:
        """The answer's usage as the client received it: the original prompt, and the output
        sent before the break plus the continuation's."""
        produced = usage.get("completion_tokens")
        output = self.sent + (produced if isinstance(produced, int) and produced >= 0 else 0)
        return {"prompt_tokens": self.prompt, "completion_tokens": output,
                "total_tokens": self.prompt + output}


def _rewritten(payload: bytes) -> bool:
    """Whether an event may carry usage or a finish reason (then it is decoded)."""
    return (b'"usage":{' in payload or b'"usage": {' in payload
            or b'"finish_reason":"' in payload or b'"finish_reason": "' in payload)


def _role_only(chunk: dict[str, Any]) -> bool:
    """A first chunk that only opens the assistant message (no text, call or finish)."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict) or choice.get("finish_reason"):
            return False
        if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
            return False
    return True


class Continuer:
    """One streamed request's continuations (per request, not shared): :meth:`resume` is the
    relay's ``resume``. ``forwarded`` is the answer being relayed now, which the caller
    releases at the end (None: none is, every one was released here)."""

    __slots__ = ("_body", "_count", "_ctx", "_forward", "_metrics", "_prompt", "_rewriter",
                 "_scanner", "_settings", "attempts", "forwarded")

    def __init__(
        self,
        settings: Continuation,
        forwarded: Forwarded,
        *,
        router: Router,
        upstream: UpstreamClient,
        route: Route,
        ctx: RequestContext,
        path: str,
        body: bytes,
        headers: RawHeaders,
        timeouts: Timeouts,
        scanner: Scanner,
        rewriter: Callable[[], AnswerRewriter],
        count_text: Callable[[str], int],
        prompt_tokens: Callable[[], int],
        span: RequestSpan,
        metrics: Metrics | None,
    ) -> None:
        self._settings = settings
        self.forwarded: Forwarded | None = forwarded
        self._ctx, self._body, self._scanner = ctx, body, scanner
        self._rewriter, self._count, self._prompt = rewriter, count_text, prompt_tokens
        self._metrics = metrics
        self.attempts = 0

        def again(body: bytes) -> Awaitable[Forwarded]:
            return forward(router, upstream, route, ctx, path, body, headers, timeouts, span,
                           metrics, max_attempts=router.policy.routing.retry.max_attempts)

        self._forward: Callable[[bytes], Awaitable[Forwarded]] = again

    @property
    def billed(self) -> bool:
        """Whether the continuations' prompt is charged to the tenant (``billed``)."""
        return self._settings.billed

    async def resume(self, error: UpstreamError) -> AsyncIterator[bytes] | None:
        """The rest of the answer from another backend, or None (see the module docstring)."""
        ctx, failed = self._ctx, self.forwarded
        if failed is None:
            return None
        pool = failed.pool.name
        plan = self._plan()
        if plan is None:
            self._count_outcome(pool, "refused")
            return None
        body, splice = plan
        self.attempts += 1
        self.forwarded = None
        release(failed, ctx, "failed")  # its slot and its health, before the next pick
        try:
            answer = await self._forward(body)
        except GatewayError as exc:
            log.info("request %s: stream broken on %s (%s), no backend continued it: %s",
                     ctx.request_id, failed.backend.label, error, exc.message)
            self._count_outcome(pool, "failed")
            return None
        if (answer.response.status != 200 or not answer.response.is_event_stream
                or answer.first_chunk is None):  # e.g. an engine refusing the request (4xx)
            log.info("request %s: stream broken on %s (%s), %s answered %d to its "
                     "continuation", ctx.request_id, failed.backend.label, error,
                     answer.backend.label, answer.response.status)
            release(answer, ctx, "cancelled")  # neither its success nor its failure
            self._count_outcome(pool, "failed")
            return None
        self.forwarded = answer
        ctx.continued = True
        estimate = splice.prompt + splice.sent
        ctx.continuation_prompt += estimate
        self._count_outcome(pool, "continued")
        log.info("request %s: stream broken on %s after %d tokens (%s), continued on %s",
                 ctx.request_id, failed.backend.label, splice.sent, error,
                 answer.backend.label)
        return self._relay(answer, splice, estimate, pool)

    def _plan(self) -> tuple[bytes, Splice] | None:
        """The continuation's body and splice, or None when this stream is not continued."""
        settings, scanner = self._settings, self._scanner
        if self.attempts >= settings.max_attempts or getattr(scanner, "partial_sent", False):
            return None
        text = scanner.reply_text()
        if not text:
            return None
        sent = self._count(text)
        if sent > settings.max_output_tokens:
            return None
        body = continuation_body(self._body, text, sent)
        if body is None:
            return None
        return body, Splice(self._rewriter(), prompt=self._prompt(), sent=sent)

    async def _relay(self, answer: Forwarded, splice: Splice, estimate: int, pool: str
                     ) -> AsyncIterator[bytes]:
        counted = estimate  # the continuation's prompt tokens, as the record holds them
        try:
            first = answer.first_chunk
            if first:
                yield splice.feed(first)
            async for chunk in answer.response.chunks():
                yield splice.feed(chunk)
            if tail := splice.flush():
                yield tail
            prompt = splice.usage.get("prompt_tokens") if splice.usage is not None else None
            if isinstance(prompt, int) and prompt >= 0:  # the backend's figure for it
                self._ctx.continuation_prompt += prompt - estimate
                counted = prompt
        finally:  # once, whether it ended, broke or was left
            if self._metrics is not None:
                self._metrics.continuation_prompt(pool, counted)

    def _count_outcome(self, pool: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.stream_continuation(pool, outcome)
