"""A stream that survives its engine: broken after its first byte, it goes on on another backend.

``pools[].continuation`` (``models[].continuation`` in its place for that model's streams; off
by default; on for pools whose backends serve the same weights). When a stream breaks after
its first byte reached the client (a reset connection, an idle timeout, an engine killed: the
relay's ``UpstreamError``; or an error event of the engine's own, ``data: {"error": ...}`` or a
passed-through Messages stream's ``event: error``, which the relay finds in the backend's bytes
before the scanner reads them, also when it is split across two reads, and never passes on),
:class:`Continuer` asks another backend of the pool (the usual pick; ``route.tried`` keeps it
off the failed one) to continue the text already sent, and the relay sends its events into
the same client stream, through the same scanner.

What is continued, by what the backend streams (``dialects.plan.Upstream.continues_as``):

* chat completions: a chat stream, and a Messages or Responses stream the gateway translates
  to chat (their events are made from the chat chunks the scanner decodes, in order, so the
  translators see one chat stream, ``sequence_number`` still increasing);
* Anthropic's Messages, passed through to a pool whose backends speak it (``api: messages``):
  continued with Anthropic's prefill.

Never continued: a Responses stream passed through (``api: responses``): that API has no way
to continue an assistant text, so its break ends with its error event, as without
continuation.

Chat (:func:`continuation_body`, :class:`Splice`):

* the tokens sent: counted as the engine counts them, by the stream's chat scanner
  (``accounting.sse.StreamScanner.output_sent``), never by tokenising the text again (the
  gateway's encoding is not the engine's tokenizer: o200k counted 1.15 times a GPT-2 model's
  tokens at the median, 1.44 at most, and refused every break in the last fifth of an
  answer). Where the chunks carry the engine's running count (llama.cpp's
  ``timings.predicted_n`` with ``timings_per_token``, vLLM's usage on every chunk with
  ``stream_options.continuous_usage_stats``), that count, exact; otherwise one token a chunk
  that carried text, never more than the engine's tokens (a chunk carries one at least), so a
  stream with room left is never refused, and the answer may run past its ``max_tokens`` by
  the tokens an engine sent several to a chunk (llama.cpp: a token that ends inside a UTF-8
  character goes out with the next one; none in ASCII text). The gateway does not ask the
  engine for the running count: both ways put it on every chunk the client gets;
* the request: the upstream body as first sent (model, cache salt, ``include_usage`` kept),
  plus the text already streamed as a final assistant message, with
  ``continue_final_message: true`` and ``add_generation_prompt: false`` (vLLM, SGLang, and
  llama.cpp's server, which otherwise echoes the prefill in its answer), and its output limit
  reduced by the tokens sent (nothing left: not continued);
* the splice: the continuation's role-only first chunk is dropped (the client had its role),
  its id and model become the client's (the gateway's id, the public name), its usage becomes
  the whole answer's, and its finish and usage chunks carry
  ``"metadata": {"x-gateway-continued": "1"}``. The whole answer's usage is what the client
  received: ``completion_tokens`` the tokens sent before plus the continuation's own output;
  ``prompt_tokens`` the original prompt as the first engine counted it where its chunks said
  it (llama.cpp's per-token ``timings``: ``prompt_n + cache_n``; vLLM's per-chunk usage), else
  the gateway's count. The continuation's own prompt is no help there: it holds the text sent
  as the engine tokenised it again, which is not always as many tokens as it generated. A
  figure that is the gateway's makes the record ``estimated``, its ``estimate_reason``
  ``continued:prompt_tokens``, ``continued:completion_tokens`` or both, comma-separated.

Messages passed through (:func:`messages_continuation_body`, :class:`MessagesSplice`; the
client's message as the stream's scanner read it: ``NativeStreamScanner.messages_so_far``):

* the request: the body as first sent, plus the text already streamed as a final
  ``assistant`` turn (Anthropic's prefill: the answer continues it without repeating it;
  added to the client's own final assistant turn if it had one; its trailing whitespace left
  out, which Anthropic refuses there), ``max_tokens`` reduced by the tokens sent; nothing
  streamed yet (a break right after ``message_start``): the body as first sent;
* the splice: the continuation's ``message_start`` and ``ping`` are dropped (the client had
  its own); its content blocks are numbered after the client's: its first text block
  continues the client's open one (its ``content_block_start`` dropped, its deltas and stop
  at that block's index) or, after a closed one, is the next index; the whitespace left out
  of the prefill is dropped from the start of its text (it writes it again); its
  ``message_delta`` usage becomes the whole answer's (``output_tokens``: the tokens sent
  before plus the continuation's; the input figures the original ``message_start``'s); its
  ``message_stop`` ends the message, once. Nothing is added to the events (an Anthropic
  client takes them as they are): the record says it was continued.

Then the scanner sees one stream, so the meter and the record need nothing else. The record
says ``continued`` and holds the continuations' prompt (``continuation_prompt``: the prompt
plus the prefix, as the backend reported it, else the gateway's count) and its price
(``continuation_cost``, from the meter: ``accounting.meter.add_continuation``), the operator's
cost, charged to the tenant too only with ``continuation.billed``. The pool's
``gateway_stream_continuation_prompt_tokens_total`` counts those tokens.

Not continued (the error event ends the stream, as without continuation): a chat stream that
carried tool calls or reasoning or several choices (``Scanner.reply_text`` is None), no text
yet, or a finish reason already; a Messages stream with a block other than text (a tool call,
thinking: Anthropic takes no prefill with thinking) or whose ``message_delta`` already went
out; a stream whose client holds part of an event (the break fell inside one); one past
``max_output_tokens`` or its own output limit; past ``max_attempts`` continuations; a
Responses stream passed through; or when no other backend answers with a stream. Each such
break writes one log line with its reason (``gateway.upstream``, warning: request id, the
backend, the break, the reason) and counts ``refused`` (``failed``: no backend answered).

A Messages stream passed through counts the tokens sent with the gateway's tokenizer still
(its scanner keeps no count of the deltas it passed), and its usage's input figures are the
first engine's own (its ``message_start``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting.sse import StreamScanner
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

__all__ = ["MARKER", "Continuer", "MessageSoFar", "MessagesSplice", "Splice",
           "continuation_body", "messages_continuation_body"]

log = logging.getLogger("gateway.upstream")

#: what a continued stream's finish and usage chunks carry
MARKER = {"x-gateway-continued": "1"}
_decode = msgspec.json.decode
_encode = msgspec.json.encode
_LIMITS = ("max_completion_tokens", "max_tokens")
#: a continued stream's usage with a figure of the gateway's: ``continued:<fields>``
ESTIMATED = "continued"


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


def messages_continuation_body(body: bytes, prefix: str, sent: int) -> bytes | None:
    """The upstream ``body`` (a Messages request) continuing the assistant text ``prefix`` of
    ``sent`` tokens: ``prefix`` as a final assistant message (Anthropic's prefill; added to the
    request's own final assistant message, if it had one), ``max_tokens`` reduced by ``sent``;
    the body unchanged but for its limit when ``prefix`` is empty. None when there is nothing
    left to ask for (its limit reached)."""
    payload = _decode(body)
    limit = payload.get("max_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool):
        if limit - sent < 1:
            return None
        payload["max_tokens"] = limit - sent
    if prefix:
        messages = list(payload.get("messages") or [])
        last = messages[-1] if messages else None
        if isinstance(last, dict) and last.get("role") == "assistant":  # the client's prefill
            messages[-1] = {**last, "content": _prefilled(last.get("content"), prefix)}
        else:
            messages.append({"role": "assistant", "content": prefix})
        payload["messages"] = messages
    return _encode(payload)


def _prefilled(content: Any, prefix: str) -> Any:
    """A final assistant message's content with ``prefix`` after it (the answer continues
    it, and ``prefix`` continued it)."""
    if isinstance(content, str):
        return content + prefix
    if isinstance(content, list):
        last = content[-1] if content else None
        if isinstance(last, dict) and last.get("type") == "text" and \
                isinstance(last.get("text"), str):
            return [*content[:-1], {**last, "text": last["text"] + prefix}]
        return [*content, {"type": "text", "text": prefix}]
    return prefix


class _Events:
    """A continuation's SSE bytes, event by event (``_event``: what the client gets of one,
    b"" to drop it); fed every chunk in order, then flushed."""

    __slots__ = ("_buf", "_sep")

    def __init__(self) -> None:
        self._buf = b""
        self._sep: bytes | None = None

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
        return self._out(b"".join(e + sep for event in events if (e := self._event(event))))

    def flush(self) -> bytes:
        """The bytes still held at the continuation's end (a last event with no blank line)."""
        tail, self._buf = self._buf, b""
        event = tail.rstrip(b"\r\n")
        out = self._event(event) if event.strip() else b""
        if out:
            out += tail[len(event):]
        return self._out(out) + self._end()

    def _detect(self, data: bytes) -> bytes | None:
        i = data.find(b"\n")
        if i < 0:
            return None
        self._sep = b"\r\n\r\n" if i > 0 and data[i - 1] == 13 else b"\n\n"
        return self._sep

    def _out(self, data: bytes) -> bytes:
        return data

    def _end(self) -> bytes:
        return b""

    def _event(self, event: bytes) -> bytes:
        raise NotImplementedError

    @property
    def reported_prompt(self) -> int | None:
        """The continuation's prompt tokens as its backend reported them (None: not yet)."""
        return None


class Splice(_Events):
    """The continuation's SSE bytes made the rest of the client's chat stream (see the module
    docstring); per continuation, fed every chunk in order, then flushed.

    ``prompt``: the original prompt's tokens; ``sent``: the output tokens the client had;
    ``exact``: ``sent`` is the engine's count; ``estimated``: which of the two are the
    gateway's (``continued:<fields>``; None: both are the engines'). ``usage`` is the
    continuation's own usage once its usage chunk passed (else None).
    """

    __slots__ = ("_rewriter", "_started", "estimated", "exact", "prompt", "sent", "usage")

    def __init__(self, rewriter: AnswerRewriter, *, prompt: int, sent: int,
                 exact: bool = False, estimated: str | None = None) -> None:
        super().__init__()
        self._rewriter = rewriter
        self.prompt, self.sent = prompt, sent
        self.exact = exact
        self.estimated = estimated
        self._started = False  # its first data chunk seen (the role-only one dropped)
        self.usage: dict[str, Any] | None = None

    def _out(self, data: bytes) -> bytes:
        return self._rewriter.chunk(data)

    def _end(self) -> bytes:
        return self._rewriter.flush()

    @property
    def reported_prompt(self) -> int | None:
        prompt = self.usage.get("prompt_tokens") if self.usage is not None else None
        return prompt if isinstance(prompt, int) and prompt >= 0 else None

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


@dataclass(frozen=True, slots=True)
class MessageSoFar:
    """A Messages stream as its client holds it, every block of it text (what the stream's
    scanner says: ``dialects.native.NativeStreamScanner.messages_so_far``)."""

    #: the text of its text blocks, in order
    text: str
    #: the index of its last content block (None: no block started)
    last_block: int | None
    #: whether that block is still open (no ``content_block_stop`` yet)
    open: bool
    #: the usage of its ``message_start`` (the input tokens, the cache figures)
    input_usage: dict[str, Any]


#: the input figures of a Messages usage: the original request's in the spliced stream
_INPUT_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


class MessagesSplice(_Events):
    """A Messages continuation's events made the rest of the client's message (see the module
    docstring): its ``message_start`` and ``ping`` dropped, its content blocks re-numbered
    after the client's (its first text block joins the client's open one: that block's
    ``content_block_start`` dropped), its ``message_delta`` usage the whole answer's.

    ``so_far``: the client's message; ``prompt``: the original prompt's tokens (the gateway's
    count, for the estimate); ``sent``: the output tokens the client had; ``dropped``: the
    whitespace that ended the client's text and was left out of the prefill (Anthropic
    refuses a final assistant turn ending in whitespace), dropped again from the start of the
    continuation's text, which writes it anew. ``usage``: the continuation's own
    ``message_delta`` usage once it passed (else None).
    """

    __slots__ = ("_drop", "_first", "_input", "_join", "_offset", "_start",
                 "_text_block", "prompt", "sent", "usage")

    def __init__(self, so_far: MessageSoFar, *, prompt: int, sent: int,
                 dropped: str = "") -> None:
        super().__init__()
        self.prompt, self.sent = prompt, sent
        self._input = so_far.input_usage
        last = so_far.last_block
        self._join = so_far.open and last is not None
        # the client's index of the continuation's block 0: the open block, or the next one
        self._offset = 0 if last is None else last if self._join else last + 1
        self._first = True  # the continuation's first content block not seen yet
        self._text_block: int | None = None  # its index, when that block is text
        self._drop = dropped
        self._start: dict[str, Any] | None = None  # the continuation's message_start usage
        self.usage: dict[str, Any] | None = None

    @property
    def reported_prompt(self) -> int | None:
        for usage in (self._start, self.usage):
            if usage is None or not isinstance(usage.get("input_tokens"), int):
                continue
            total = 0
            for name in _INPUT_FIELDS:
                value = usage.get(name)
                total += value if isinstance(value, int) and value > 0 else 0
            return total
        return None

    def _event(self, event: bytes) -> bytes:
        """One event as the client gets it (b"": dropped; several, joined by the stream's
        separator)."""
        data = _data_of(event)
        if data is None:
            return event  # a comment, a keep-alive
        try:
            obj = _decode(data)
        except msgspec.DecodeError:
            return event
        if not isinstance(obj, dict):
            return event
        kind = obj.get("type")
        if kind == "content_block_delta":
            return self._delta(obj, event)
        if kind == "content_block_start":
            return self._block_start(obj)
        if kind == "content_block_stop":
            return self._reindexed(obj)
        if kind == "message_delta":
            return self._message_delta(obj)
        if kind == "message_start":
            message = obj.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self._start = usage if isinstance(usage, dict) else {}
            return b""  # the client had its own
        if kind == "ping":
            return b""
        return event  # message_stop, an error (the relay's to see), what is not known

    def _block_start(self, obj: dict[str, Any]) -> bytes:
        block = obj.get("content_block")
        text_block = isinstance(block, dict) and block.get("type") == "text"
        if not self._first:
            return self._reindexed(obj)
        self._first = False
        index = obj.get("index")
        if text_block:
            self._text_block = index if isinstance(index, int) else 0
        if not self._join:
            return self._reindexed(obj)
        if text_block:  # it continues the client's open block: no start of its own
            assert isinstance(block, dict)
            text = block.get("text")
            if isinstance(text, str) and text:
                return self._delta({"type": "content_block_delta", "index": index,
                                    "delta": {"type": "text_delta", "text": text}}, None)
            return b""
        # not text after all: the client's open block ends, the continuation's follow it
        stop = self._named("content_block_stop",
                           {"type": "content_block_stop", "index": self._offset})
        self._offset += 1
        self._join = False
        return stop + (self._sep or b"\n\n") + self._reindexed(obj)

    def _delta(self, obj: dict[str, Any], event: bytes | None) -> bytes:
        drop = self._drop
        if drop and obj.get("index", 0) == self._text_block:
            delta = obj.get("delta")
            text = delta.get("text") if isinstance(delta, dict) else None
            if isinstance(text, str):
                assert isinstance(delta, dict)
                same = 0
                while same < len(text) and same < len(drop) and text[same] == drop[same]:
                    same += 1
                self._drop = drop[same:] if same == len(text) else ""
                if same == len(text):
                    return b""  # all of it the client had
                obj = {**obj, "delta": {**delta, "text": text[same:]}}
                event = None
        if self._offset == 0 and event is not None:
            return event  # as the backend wrote it
        return self._reindexed(obj)

    def _reindexed(self, obj: dict[str, Any]) -> bytes:
        index = obj.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            obj = {**obj, "index": index + self._offset}
        return self._named(str(obj.get("type")), obj)

    def _message_delta(self, obj: dict[str, Any]) -> bytes:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            obj = {**obj, "usage": self._whole_usage(usage)}
        return self._named("message_delta", obj)

    def _whole_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The answer's usage as the client received it: the original request's input
        figures, and the output sent before the break plus the continuation's."""
        whole = dict(usage)
        produced = usage.get("output_tokens")
        whole["output_tokens"] = self.sent + (
            produced if isinstance(produced, int) and produced >= 0 else 0)
        original = self._input
        for name in _INPUT_FIELDS:
            if name in whole:
                whole[name] = original.get(name, 0 if whole[name] is not None else None)
        if "cache_creation" in whole:
            if "cache_creation" in original:
                whole["cache_creation"] = original["cache_creation"]
            else:
                del whole["cache_creation"]
        return whole

    def _named(self, name: str, obj: dict[str, Any]) -> bytes:
        newline = b"\r\n" if self._sep == b"\r\n\r\n" else b"\n"
        return b"event: " + name.encode() + newline + b"data: " + _encode(obj)


def _data_of(event: bytes) -> bytes | None:
    """The data of an SSE event (its ``data:`` lines joined), None when it has none."""
    lines = [line[5:].removeprefix(b" ") for line in event.splitlines()
             if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


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
    releases at the end (None: none is, every one was released here).

    ``output``: the chat scanner of the backend's stream (a translated stream's too), which
    counts the output sent as the engine does (``StreamScanner.output_sent``); without one
    (and for a Messages stream passed through) the text is counted with ``count_text``."""

    __slots__ = ("_api", "_body", "_count", "_ctx", "_forward", "_metrics", "_output",
                 "_prompt", "_rewriter", "_scanner", "_settings", "attempts", "forwarded")

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
        api: str = "chat",
        output: Scanner | None = None,
    ) -> None:
        self._settings = settings
        self._api = api  # what the backend streams: "chat", or "messages" (passed through)
        self.forwarded: Forwarded | None = forwarded
        self._ctx, self._body, self._scanner = ctx, body, scanner
        self._output = output if api == "chat" and isinstance(output, StreamScanner) else None
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
        if isinstance(plan, str):
            log.warning("request %s: stream broken on %s (%s), not continued: %s",
                        ctx.request_id, failed.backend.label, error, plan)
            self._count_outcome(pool, "refused")
            return None
        body, splice = plan
        self.attempts += 1
        self.forwarded = None
        release(failed, ctx, "failed")  # its slot and its health, before the next pick
        try:
            answer = await self._forward(body)
        except GatewayError as exc:
            log.warning("request %s: stream broken on %s (%s), no backend continued it: %s",
                        ctx.request_id, failed.backend.label, error, exc.message)
            self._count_outcome(pool, "failed")
            return None
        if (answer.response.status != 200 or not answer.response.is_event_stream
                or answer.first_chunk is None):  # e.g. an engine refusing the request (4xx)
            log.warning("request %s: stream broken on %s (%s), %s answered %d to its "
                        "continuation", ctx.request_id, failed.backend.label, error,
                        answer.backend.label, answer.response.status)
            release(answer, ctx, "cancelled")  # neither its success nor its failure
            self._count_outcome(pool, "failed")
            return None
        self.forwarded = answer
        drop = getattr(self._scanner, "drop_partial", None)
        if callable(drop):  # what it held of an event the client never got
            drop()
        ctx.continued = True
        if isinstance(splice, Splice) and self._output is not None:
            # its chunks count on from the tokens sent; its usage says what is the gateway's
            self._output.continued(splice.sent, splice.exact, splice.estimated)
        estimate = splice.prompt + splice.sent
        ctx.continuation_prompt += estimate
        self._count_outcome(pool, "continued")
        counted = "the engine's count" if isinstance(splice, Splice) and splice.exact \
            else "counted"
        log.info("request %s: stream broken on %s after %d tokens (%s; %s), continued on %s",
                 ctx.request_id, failed.backend.label, splice.sent, counted, error,
                 answer.backend.label)
        return self._relay(answer, splice, estimate, pool)

    def _plan(self) -> tuple[bytes, Splice | MessagesSplice] | str:
        """The continuation's body and splice, or why this stream is not continued."""
        settings, scanner = self._settings, self._scanner
        if self.attempts >= settings.max_attempts:
            return f"past max_attempts ({settings.max_attempts} continuations)"
        if self._api == "messages":
            return self._messages_plan()
        if getattr(scanner, "partial_sent", False):
            return "the client holds part of an event"
        text = scanner.reply_text()
        if text is None:
            return "not one choice of plain text (tool calls, reasoning, several choices or none)"
        if not text:
            return "no text sent yet"
        output = self._output
        if output is not None and output.finished:
            return "its answer had finished (a finish reason sent)"
        sent, exact = output.output_sent() if output is not None else (self._count(text), False)
        if sent > settings.max_output_tokens:
            return (f"past max_output_tokens ({sent} tokens sent, "
                    f"{settings.max_output_tokens} at most)")
        body = continuation_body(self._body, text, sent)
        if body is None:
            return f"past max_tokens ({sent} tokens sent, nothing left to ask for)"
        first = output.first_prompt if output is not None else None
        prompt = first if first is not None else self._prompt()
        estimated = [name for name, engines in (("prompt_tokens", first is not None),
                                                ("completion_tokens", exact)) if not engines]
        return body, Splice(self._rewriter(), prompt=prompt, sent=sent, exact=exact,
                            estimated=f"{ESTIMATED}:{','.join(estimated)}" if estimated
                            else None)

    def _messages_plan(self) -> tuple[bytes, MessagesSplice] | str:
        """A passed-through Messages stream's continuation: its text as the prefill."""
        state = getattr(self._scanner, "messages_so_far", None)
        so_far = state() if callable(state) else None
        if not isinstance(so_far, MessageSoFar):
            return ("not a plain text message (a block other than text), ended (its "
                    "message_delta sent), or the client holds part of an event")
        text = so_far.text
        sent = self._count(text) if text else 0
        if sent > self._settings.max_output_tokens:
            return (f"past max_output_tokens ({sent} tokens sent, "
                    f"{self._settings.max_output_tokens} at most)")
        prefill = text.rstrip()  # Anthropic refuses a prefill that ends in whitespace
        body = messages_continuation_body(self._body, prefill, sent)
        if body is None:
            return f"past max_tokens ({sent} tokens sent, nothing left to ask for)"
        return body, MessagesSplice(so_far, prompt=self._prompt(), sent=sent,
                                    dropped=text[len(prefill):])

    async def _relay(self, answer: Forwarded, splice: Splice | MessagesSplice, estimate: int,
                     pool: str) -> AsyncIterator[bytes]:
        counted = estimate  # the continuation's prompt tokens, as the record holds them
        try:
            first = answer.first_chunk
            if first:
                yield splice.feed(first)
            async for chunk in answer.response.chunks():
                yield splice.feed(chunk)
            if tail := splice.flush():
                yield tail
            prompt = splice.reported_prompt
            if prompt is not None:  # the backend's figure for it
                self._ctx.continuation_prompt += prompt - estimate
                counted = prompt
        finally:  # once, whether it ended, broke or was left
            if self._metrics is not None:
                self._metrics.continuation_prompt(pool, counted)

    def _count_outcome(self, pool: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.stream_continuation(pool, outcome)
