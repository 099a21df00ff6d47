"""A continuation counts the tokens already sent as the engine does (issue 38): its limit is
the original limit less those tokens, it is refused only when nothing is left (one log line
with the reason), and the spliced usage is what the client received, its figures the
engines' where the stream said them, else marked ``estimated`` (``Continuer`` with a real
chat scanner and stand-ins for the backends)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.accounting.split import PromptSplit
from gateway.accounting.sse import StreamScanner
from gateway.accounting.tokens import account
from gateway.config.model import Continuation
from gateway.context import RequestContext
from gateway.errors import BackendFailure
from gateway.http.errors import UpstreamStreamError
from gateway.upstream.continuation import Continuer
from gateway.upstream.rename import AnswerRewriter

HEAD = {"id": "chatcmpl-e", "object": "chat.completion.chunk", "model": "engine-model"}
GATEWAY_PROMPT = 17  # the gateway's count of the prompt (the engine prefills 35)
ENGINE_PROMPT = 35


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    return _event({**HEAD, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                   **extra})


def _timings(predicted: int, prompt: int = 1, cached: int = 34) -> dict[str, Any]:
    return {"cache_n": cached, "prompt_n": prompt, "predicted_n": predicted}


class _Stub:
    """What the continuer touches of a backend, its pool and its answer."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def _forwarded(label: str, chunks: list[bytes] | None = None) -> Any:
    async def stream() -> AsyncIterator[bytes]:
        for chunk in (chunks or [])[1:]:
            yield chunk

    pool = _Stub(name="cont", config=_Stub(health=None), release=lambda backend, tenant: None)
    backend = _Stub(label=label, on_failure=lambda health, now: None, on_success=lambda: None)
    response = _Stub(status=200, is_event_stream=True, close=lambda: None, chunks=stream)
    return _Stub(pool=pool, backend=backend, response=response, first_chunk_ns=None,
                 first_chunk=(chunks or [b""])[0])


def _continuer(scanner: StreamScanner, max_tokens: int, *, max_output: int = 4096,
               output: bool = True) -> tuple[Continuer, list[bytes]]:
    """A continuer of a stream read by ``scanner``; the bodies it sends go to the list."""
    body = json.dumps({"model": "engine-model", "stream": True, "max_tokens": max_tokens,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "Tell me a story."}]}).encode()
    args: dict[str, Any] = {"router": None, "upstream": None, "route": None, "path": "/",
                            "headers": [], "timeouts": None, "span": None, "metrics": None}
    continuer = Continuer(
        Continuation(enabled=True, max_output_tokens=max_output), _forwarded("killed"),
        ctx=RequestContext(request_id="req-1", endpoint="chat"), body=body, scanner=scanner,
        rewriter=lambda: AnswerRewriter(None), count_text=lambda text: 1000,
        prompt_tokens=lambda: GATEWAY_PROMPT, output=scanner if output else None, **args)
    sent: list[bytes] = []

    async def forward(continuation: bytes) -> Any:
        sent.append(continuation)
        produced = json.loads(continuation)["max_tokens"]
        words = [_chunk({"content": f" w{i}"}, timings=_timings(i + 1, 40, 0))
                 for i in range(produced)]
        return _forwarded("spare", [
            _chunk({"role": "assistant", "content": None}), *words, _chunk({}, "length"),
            _event({**HEAD, "choices": [], "usage": {
                "prompt_tokens": 40 + produced, "completion_tokens": produced,
                "total_tokens": 40 + 2 * produced}, "timings": _timings(produced, 40, 0)}),
            b"data: [DONE]\n\n"])

    continuer._forward = forward
    return continuer, sent


async def _resumed(continuer: Continuer, scanner: StreamScanner) -> bytes | None:
    """The continuation relayed into the client's stream, through its scanner (as the relay
    does); None: not continued."""
    source = await continuer.resume(UpstreamStreamError("the engine died"))
    if source is None:
        return None
    out = b""
    async for piece in source:
        out += scanner.feed(piece)
    return out + scanner.flush()


def _first(scanner: StreamScanner, tokens: int, *, timed: bool) -> None:
    """The killed engine's chunks: the role, then ``tokens`` tokens in ``tokens - 1`` chunks
    (its last chunk two tokens: one ended inside a UTF-8 character)."""
    scanner.feed(_chunk({"role": "assistant", "content": None}))
    for n in range(1, tokens):
        predicted = n + 1 if n == tokens - 1 else n
        extra = {"timings": _timings(predicted)} if timed else {}
        scanner.feed(_chunk({"content": f" t{n}"}, **extra))


@pytest.mark.parametrize(("max_tokens", "continued"), [(6, True), (5, False)])
async def test_the_engines_count_refuses_only_at_the_limit(
        max_tokens: int, continued: bool, caplog: pytest.LogCaptureFixture) -> None:
    """5 engine tokens sent (4 chunks; the gateway's tokenizer would say 1000): with 6 asked
    for, the continuation asks for 1; with 5, nothing is left: refused, with a log line."""
    scanner = StreamScanner(strip_usage=False)
    _first(scanner, 5, timed=True)
    continuer, sent = _continuer(scanner, max_tokens)
    with caplog.at_level(logging.INFO, logger="gateway.upstream"):
        out = await _resumed(continuer, scanner)
    if not continued:
        assert out is None and not sent
        [line] = [r for r in caplog.records if "not continued" in r.getMessage()]
        assert line.levelno == logging.WARNING
        assert "req-1" in line.getMessage() and "killed" in line.getMessage()
        assert "past max_tokens (5 tokens sent" in line.getMessage()
        return
    assert out is not None
    assert json.loads(sent[0])["max_tokens"] == 1
    assert any("after 5 tokens (the engine's count" in r.getMessage() for r in caplog.records)
    usage = scanner.usage
    assert usage is not None
    # the whole answer: the first engine's prompt, the 5 tokens sent plus the 1 continued
    assert (usage.prompt_tokens, usage.completion_tokens, usage.estimated) == (
        ENGINE_PROMPT, 6, None)
    record = account(PromptSplit(new=GATEWAY_PROMPT), usage)
    assert (record.prompt_total, record.output, record.estimated) == (ENGINE_PROMPT, 6, False)
    assert b'"prompt_tokens":35,"completion_tokens":6,"total_tokens":41' in out


async def test_a_chunk_count_never_refuses_a_stream_with_room_left(
        caplog: pytest.LogCaptureFixture) -> None:
    """No engine count in the chunks: 4 chunks count 4 tokens (the engine sent 5), so a limit
    of 5 still leaves 1 to ask for; the usage's figures are then the gateway's, and say so."""
    scanner = StreamScanner(strip_usage=False)
    _first(scanner, 5, timed=False)
    continuer, sent = _continuer(scanner, 5)
    out = await _resumed(continuer, scanner)
    assert out is not None and json.loads(sent[0])["max_tokens"] == 1
    usage = scanner.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (GATEWAY_PROMPT, 5)
    assert usage.estimated == "continued:prompt_tokens,completion_tokens"
    record = account(PromptSplit(new=GATEWAY_PROMPT), usage)
    assert record.estimated and record.estimate_reason == usage.estimated


async def test_the_first_engines_prompt_without_its_running_count() -> None:
    """A usage on every chunk (vLLM's ``continuous_usage_stats``) gives both figures."""
    scanner = StreamScanner(strip_usage=False)
    scanner.feed(_chunk({"role": "assistant", "content": ""}))
    for n in (1, 2):
        scanner.feed(_chunk({"content": f" t{n}"}, usage={
            "prompt_tokens": 21, "completion_tokens": n, "total_tokens": 21 + n}))
    continuer, sent = _continuer(scanner, 4)
    assert await _resumed(continuer, scanner) is not None
    assert json.loads(sent[0])["max_tokens"] == 2
    assert scanner.usage is not None
    assert (scanner.usage.prompt_tokens, scanner.usage.completion_tokens) == (21, 4)
    assert scanner.usage.estimated is None


@pytest.mark.parametrize(("case", "reason"), [
    ("max_output", "past max_output_tokens (5 tokens sent, 4 at most)"),
    ("finished", "its answer had finished"),
    ("tools", "not one choice of plain text"),
    ("empty", "no text sent yet"),
    ("partial", "the client holds part of an event"),
])
async def test_every_refusal_says_why(case: str, reason: str,
                                      caplog: pytest.LogCaptureFixture) -> None:
    scanner = StreamScanner(strip_usage=False)
    if case == "tools":
        scanner.feed(_chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}))
    elif case == "partial":
        scanner.feed(_chunk({"content": " a"}) + b'data: {"choi')
    elif case == "empty":
        scanner.feed(_chunk({"role": "assistant", "content": ""}))
    else:
        _first(scanner, 5, timed=True)
    if case == "finished":
        scanner.feed(_chunk({}, "stop"))
    continuer, sent = _continuer(scanner, 100, max_output=4)
    with caplog.at_level(logging.INFO, logger="gateway.upstream"):
        assert await _resumed(continuer, scanner) is None
    assert not sent
    [line] = [r.getMessage() for r in caplog.records if "not continued" in r.getMessage()]
    assert reason in line and "the engine died" in line


async def test_past_max_attempts_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    scanner = StreamScanner(strip_usage=False)
    _first(scanner, 3, timed=True)
    continuer, _ = _continuer(scanner, 100)
    continuer.attempts = 1
    with caplog.at_level(logging.INFO, logger="gateway.upstream"):
        assert await _resumed(continuer, scanner) is None
    assert any("past max_attempts (1 continuations)" in r.getMessage()
               for r in caplog.records)


async def test_without_the_chat_scanner_the_text_is_counted() -> None:
    """No chat scanner to count with (``output`` None): the gateway's count of the text, as
    before (here 1000 tokens: past the limit)."""
    scanner = StreamScanner(strip_usage=False)
    _first(scanner, 3, timed=True)
    continuer, sent = _continuer(scanner, 100, output=False)
    assert await _resumed(continuer, scanner) is None and not sent


async def test_no_backend_to_continue_on_says_so(caplog: pytest.LogCaptureFixture) -> None:
    scanner = StreamScanner(strip_usage=False)
    _first(scanner, 3, timed=True)
    continuer, _ = _continuer(scanner, 100)

    async def nobody(body: bytes) -> Any:
        raise BackendFailure("no backend of pool 'cont' is available")

    continuer._forward = nobody
    with caplog.at_level(logging.INFO, logger="gateway.upstream"):
        assert await _resumed(continuer, scanner) is None
    [line] = [r for r in caplog.records if "no backend continued it" in r.getMessage()]
    assert line.levelno == logging.WARNING and "req-1" in line.getMessage()
