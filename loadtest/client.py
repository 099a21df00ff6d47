"""One streamed chat completion, timed: :class:`Target`, :class:`RequestSpec`, :class:`Client`.

The client must never be the bottleneck of a measurement, so the hot path is small: request bodies
are built before the run (:func:`build_body` returns bytes), timestamps are ``perf_counter_ns``,
and the SSE stream is scanned as bytes. Only two kinds of event are JSON-decoded: the one carrying
a ``finish_reason`` and the usage event. A content event is recognised by a non-empty
``"content":"`` string; each counts as one chunk (one token on engines that stream per token).
Text is kept only when asked (``keep_text``), for probes and multi-turn replays.

Error kinds (``Result.error``): ``http_<status>``, ``connect``, ``timeout``, ``disconnected``
(the connection closed mid-stream), ``stream_error`` (an in-stream error event), ``truncated``
(the stream ended without a finish reason or ``[DONE]``), ``bad_utf8``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

__all__ = [
    "Client",
    "RequestSpec",
    "Result",
    "Target",
    "base_url",
    "build_body",
    "list_models",
    "synth_prompt",
]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode

# Common English words that are one token each (with their leading space) in cl100k/o200k.
_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we their been has when who will "
    "more no if out so said what up its about into than them can only other new some could "
    "time these two may then do first any my now such like our over man me even most made "
    "after also did many"
)
_WORDS = _WORD_TEXT.split()


def synth_prompt(tokens: int, tag: str = "") -> str:
    """A prompt of about ``tokens`` tokens: ``tag`` then common words, ~1 token each.

    A distinct ``tag`` per request (e.g. its number) defeats prefix caching between requests.
    """
    n = max(1, tokens - (len(tag.split()) * 3 if tag else 0))
    words = (_WORDS * (n // len(_WORDS) + 1))[:n]
    body = " ".join(words)
    return f"{tag} {body}" if tag else body


def base_url(url: str) -> str:
    """``http://h:p`` from ``http://h:p``, ``http://h:p/`` or ``http://h:p/v1``."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """An OpenAI-compatible endpoint and the model to ask for."""

    url: str
    model: str
    api_key: str | None = None
    label: str = ""

    @property
    def chat_url(self) -> str:
        return base_url(self.url) + "/v1/chat/completions"

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if extra:
            h.update(extra)
        return h


def build_body(
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    *,
    ignore_eos: bool = False,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """The JSON body of a streamed chat completion that asks for usage in the stream.

    ``ignore_eos`` adds the vLLM/SGLang extension that makes the engine generate exactly
    ``max_tokens`` (hosted APIs may reject the unknown field).
    """
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
    return _encode(body)


@dataclass(slots=True, kw_only=True)
class RequestSpec:
    """One request ready to send: the URL, headers and body are built before the run."""

    url: str
    headers: dict[str, str]
    body: bytes
    max_tokens: int
    klass: str = "interactive"


@dataclass(slots=True)
class Result:
    """What one request did; times are ``perf_counter_ns`` stamps (0 when it never happened)."""

    start_ns: int
    klass: str = "interactive"
    first_ns: int = 0
    end_ns: int = 0
    chunks: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    status: int = 0
    error: str | None = None
    detail: str = ""
    text: str | None = None
    tag: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        """Tokens generated: usage when the server sent it, else content chunks."""
        return self.completion_tokens if self.completion_tokens is not None else self.chunks

    @property
    def ttft_s(self) -> float | None:
        return (self.first_ns - self.start_ns) / 1e9 if self.first_ns else None

    @property
    def e2e_s(self) -> float | None:
        return (self.end_ns - self.start_ns) / 1e9 if self.end_ns else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None with fewer than 2 tokens)."""
        n = self.output_tokens
        if not self.first_ns or not self.end_ns or n < 2:
            return None
        return (self.end_ns - self.first_ns) / 1e9 / (n - 1)


def _is_content(ev: bytes) -> bool:
    i = ev.find(b'"content":')
    if i < 0:
        return False
    j = i + 10
    if ev[j : j + 1] == b" ":
        j += 1
    return ev[j : j + 1] == b'"' and ev[j + 1 : j + 2] != b'"'


def _content_text(obj: Any) -> str:
    try:
        delta = obj["choices"][0].get("delta") or {}
        return str(delta.get("content") or "")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""


class _Stream:
    """Per-request SSE scanner; not shared between requests."""

    __slots__ = ("buf", "done", "keep_text", "parts", "res")

    def __init__(self, res: Result, keep_text: bool) -> None:
        self.res = res
        self.buf = b""
        self.done = False
        self.keep_text = keep_text
        self.parts: list[str] = []

    def feed(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = buf[start:nl]
            start = nl + 1
            if line.startswith(b"data: "):
                self.event(line[6:].rstrip(b"\r"))
        self.buf = buf[start:]

    def event(self, ev: bytes) -> None:
        res = self.res
        if ev == b"[DONE]":
            self.done = True
            return
        content = _is_content(ev)
        if content:
            if not res.first_ns:
                res.first_ns = time.perf_counter_ns()
            res.chunks += 1
        special = b'"finish_reason":"' in ev or b'"usage":{' in ev or ev.startswith(b'{"error"')
        if not (special or (content and self.keep_text)):
            return
        try:
            obj = _decode(ev)
        except (msgspec.DecodeError, UnicodeDecodeError):
            res.error, res.detail = "bad_utf8", "undecodable event"
            return
        if content and self.keep_text:
            self.parts.append(_content_text(obj))
        if not isinstance(obj, dict):
            return
        if "error" in obj and res.error is None:
            err = obj["error"]
            res.error = "stream_error"
            res.detail = str(err.get("message") if isinstance(err, dict) else err)[:200]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            res.completion_tokens = usage.get("completion_tokens")
            res.prompt_tokens = usage.get("prompt_tokens")
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict) and choice.get("finish_reason"):
                res.finish_reason = str(choice["finish_reason"])


class Client:
    """One aiohttp session sized to the run's concurrency; sends :class:`RequestSpec`s.

    Open with ``async with Client(limit) as client`` (one per process and event loop);
    :meth:`send` never raises for request failures, it returns a :class:`Result` with ``error``.
    """

    def __init__(self, limit: int, *, timeout: float = 300.0) -> None:
        self.limit = max(1, limit)
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        state = "open" if self._session is not None else "closed"
        return f"<Client {state} limit={self.limit} timeout={self.timeout}s>"

    async def __aenter__(self) -> Client:
        connector = aiohttp.TCPConnector(
            limit=self.limit, limit_per_host=self.limit, ttl_dns_cache=None, force_close=False
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=("User-Agent",),
            auto_decompress=False,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Client is not open; use 'async with Client(...)'")
        return self._session

    async def send(self, spec: RequestSpec, *, keep_text: bool = False) -> Result:
        """Send one request and read its stream to the end (or the timeout)."""
        res = Result(time.perf_counter_ns(), klass=spec.klass)
        try:
            async with asyncio.timeout(self.timeout):
                await self._exchange(spec, res, keep_text)
        except TimeoutError:
            res.error, res.detail = "timeout", f"no complete answer within {self.timeout:g}s"
        except aiohttp.ClientConnectorError as exc:
            res.error, res.detail = "connect", str(exc)[:200]
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            res.error, res.detail = "disconnected", str(exc)[:200]
        except aiohttp.ClientError as exc:
            res.error, res.detail = "disconnected", f"{type(exc).__name__}: {exc}"[:200]
        res.end_ns = res.end_ns or time.perf_counter_ns()
        return res

    async def _exchange(self, spec: RequestSpec, res: Result, keep_text: bool) -> None:
        async with self.session.post(spec.url, data=spec.body, headers=spec.headers) as resp:
            res.status = resp.status
            if resp.status != 200:
                res.error = f"http_{resp.status}"
                res.detail = (await resp.read())[:300].decode("utf-8", "replace")
                return
            stream = _Stream(res, keep_text)
            async for data in resp.content.iter_any():
                stream.feed(data)
            res.end_ns = time.perf_counter_ns()
            if stream.parts:
                res.text = "".join(stream.parts)
            elif keep_text:
                res.text = ""
            if res.error is None and not (stream.done or res.finish_reason):
                res.error, res.detail = "truncated", "stream ended without finish_reason or [DONE]"


async def list_models(url: str, api_key: str | None) -> list[str]:
    """The model ids ``GET /v1/models`` lists (for a default ``--model``)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(base_url(url) + "/v1/models", headers=headers) as resp,
    ):
        resp.raise_for_status()
        data = await resp.json()
    return [str(m["id"]) for m in data.get("data", []) if isinstance(m, dict) and "id" in m]
