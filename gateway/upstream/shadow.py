"""Shadow traffic: mirror a share of requests to a shadow pool and compare its answers.

A shadow request runs as its own task, takes a backend only if one is free at once (it never
queues and never retries), and is never billed or counted against quotas. The client never
sees its answer and the primary never waits for it. Its latency, status and output are kept in
``ShadowStats``; for chat and completions requests its answer is also compared with the
primary's (``shadow_compare``): a :class:`Pairing` per mirrored request collects both sides,
whichever ends first, and the second one to end files the comparison.

What the primary's side costs it: :meth:`Pairing.tap` wraps its stream scanner (one deque
append per chunk), and :meth:`Pairing.primary` copies a few numbers and keeps references to
its body and scanner. Reading the primary's text and judging the pair run in a callback after
the request's own task has moved on.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.http.errors import UpstreamError
from gateway.routing.versions import should_shadow
from gateway.upstream.shadow_answer import (
    TEXT_CAP,
    Answer,
    StreamCapture,
    Tap,
    read_body,
    stream_finish_reason,
)
from gateway.upstream.shadow_compare import (
    EXAMPLE_CHARS,
    Comparison,
    ShadowComparisons,
    judge,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.accounting import Scanner
    from gateway.config import Shadow
    from gateway.context import RequestContext
    from gateway.http.base import UpstreamClient, UpstreamResponse
    from gateway.routing.backend import BackendState
    from gateway.routing.router import Router
    from gateway.telemetry import Metrics
    from gateway.types import RawHeaders
    from gateway.upstream.forward import Forwarded

__all__ = ["COMPARED_PATHS", "Mirror", "Pairing", "ShadowStats"]

_encoder = msgspec.json.Encoder()
#: endpoints whose answers are compared (others are mirrored and counted only)
COMPARED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
#: bytes of a whole shadow body read for comparing; a larger one is drained, not compared
_MAX_BODY = 4 * 1024 * 1024


def _ms(end_ns: int | None, start_ns: int) -> float | None:
    return None if end_ns is None else (end_ns - start_ns) / 1e6



@dataclass
class ShadowStats:
    """Counts of shadow requests (per process)."""

    started: int = 0
    skipped: int = 0  # the shadow pool had no free backend, or too many shadows in flight
    by_status: dict[int, int] = field(default_factory=dict)
    errors: int = 0
    in_flight: int = 0


class Pairing:
    """The two sides of one mirrored request's comparison (per request, not shared)."""

    __slots__ = ("_mirror", "_primary", "_primary_body", "_primary_read_done",
                 "_primary_scanner", "_shadow", "_tap", "agree_at", "model", "primary_version",
                 "record_content", "request_id", "started_ns", "tenant", "version")

    def __init__(self, mirror: Mirror, shadow: Shadow, ctx: RequestContext, *,
                 record_content: bool, started_ns: int) -> None:
        self._mirror = mirror
        self.model = ctx.request_model or ""
        self.version = shadow.label
        self.agree_at = shadow.agree_similarity
        self.primary_version, self.request_id, self.tenant = ctx.version, ctx.request_id, \
            ctx.tenant
        self.record_content = record_content
        self.started_ns = started_ns
        self._tap: Tap | None = None
        self._primary: Answer | None = None
        self._primary_body: bytes | None = None
        self._primary_scanner: Scanner | None = None
        self._primary_read_done = False
        self._shadow: Answer | None = None

    def tap(self, scanner: Scanner) -> Scanner:
        """The primary stream's scanner, with its last chunks kept for the finish reason."""
        self._tap = Tap(scanner)
        return self._tap

    def primary(self, ctx: RequestContext, forwarded: Forwarded | None, scanner: Scanner | None,
                body: bytes | None) -> None:
        """The primary's answer is over (called once, on every path): note its facts now,
        read its text later."""
        status = forwarded.response.status if forwarded is not None else None
        stream = forwarded is not None and forwarded.first_chunk_ns is not None
        if stream:
            assert forwarded is not None
            complete = ctx.outcome == "completed"
            first_ns, last_ns = forwarded.first_chunk_ns, ctx.last_chunk_ns
        else:  # a whole body: read by the forward step, its end is its first token
            complete = body is not None
            first_ns = last_ns = ctx.first_token_ns
        ok = status is not None and 200 <= status < 300 and complete
        self._primary = Answer(
            status=status, ok=ok, ttft_ms=_ms(first_ns, self.started_ns),
            duration_ms=_ms(last_ns, self.started_ns),
            output_tokens=ctx.usage.output if ctx.usage is not None and ok else None,
            error=None if ok else _why(status, complete, ctx.error))
        if ok:
            self._primary_body = None if stream else body
            self._primary_scanner = scanner if stream else None
        asyncio.get_running_loop().call_soon(self._primary_read)

    def shadow(self, answer: Answer) -> None:
        """The shadow's answer is over."""
        self._shadow = answer
        if self._primary_read_done:
            self._file()

    def _primary_read(self) -> None:
        """The primary's text and finish reason, off its request's path; files the pair if
        the shadow is done."""
        answer = self._primary
        assert answer is not None
        if self._primary_scanner is not None:
            answer.text = self._primary_scanner.delivered_text()[:TEXT_CAP]
            if self._tap is not None:
                answer.finish_reason = stream_finish_reason(self._tap.tail)
        elif self._primary_body is not None:
            answer.text, answer.finish_reason, _ = read_body(self._primary_body)
        self._primary_body = self._primary_scanner = self._tap = None
        self._primary_read_done = True
        if self._shadow is not None:
            self._file()

    def _file(self) -> None:
        primary, shadow = self._primary, self._shadow
        assert primary is not None and shadow is not None
        outcome, exact, similarity = judge(primary, shadow, self.agree_at)
        texts = None
        if outcome == "disagree" and self.record_content:
            texts = ((primary.text or "")[:EXAMPLE_CHARS], (shadow.text or "")[:EXAMPLE_CHARS])
        primary.text = shadow.text = None  # the store keeps no text but an allowed example's
        comparison = Comparison(
            model=self.model, version=self.version, primary_version=self.primary_version,
            request_id=self.request_id, tenant=self.tenant, at=time.time(), outcome=outcome,
            exact=exact, similarity=similarity, primary=primary, shadow=shadow, texts=texts)
        self._mirror.comparisons.add(comparison)
        self._mirror.metrics.shadow_compared(
            self.model, self.version, outcome, similarity, comparison.ttft_ratio,
            comparison.duration_ratio)


def _why(status: int | None, complete: bool, error: str | None) -> str:
    """A few words on why an answer is not compared (the gateway's own words)."""
    if status is None:
        return "no answer"
    if not 200 <= status < 300:
        return f"status {status}"
    return "incomplete" if not complete else (error or "failed")


class Mirror:
    """The process's shadow traffic: its stats, its comparisons and the tasks in flight (kept
    referenced)."""

    def __init__(self, upstream: UpstreamClient, metrics: Metrics,
                 comparisons: ShadowComparisons | None = None) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.stats = ShadowStats()
        #: shadow answers compared with the primary's, read by the admin report and rollouts
        self.comparisons = comparisons if comparisons is not None else ShadowComparisons()
        self.tasks: set[asyncio.Task[Any]] = set()

    def start(
        self,
        router: Router,
        shadow: Shadow,
        endpoint: str,
        payload: dict[str, Any],
        headers: RawHeaders,
        ctx: RequestContext | None = None,
        record_content: bool = False,
        cache_fields: Callable[[str, bytes], bytes] | None = None,
    ) -> Pairing | None:
        """Maybe mirror this request; returns at once. With ``ctx``, ``shadow.compare`` and a
        compared endpoint, returns the pairing the caller gives the primary's answer to (see
        :class:`Pairing`). ``cache_fields(pool, body)`` sets the tenant's prompt-cache fields
        for the shadow pool's engines (``cache_isolation.py``), as for the primary's."""
        if not should_shadow(shadow.share):
            return None
        stats = self.stats
        if stats.in_flight >= shadow.max_in_flight:
            stats.skipped += 1
            return None
        pool = router.pools[shadow.pool]
        backend = pool.try_pick(time.monotonic())
        if backend is None:
            stats.skipped += 1
            return None
        started_ns = time.perf_counter_ns()
        mirrored = dict(payload)
        mirrored["model"] = shadow.backend_model or mirrored["model"]
        if mirrored.get("stream"):  # its usage, for the output-token ratio
            options = mirrored.get("stream_options")
            mirrored["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                          "include_usage": True}
        body = _encoder.encode(mirrored)
        if cache_fields is not None:
            body = cache_fields(shadow.pool, body)
        pairing = None
        if ctx is not None and shadow.compare and endpoint in COMPARED_PATHS:
            pairing = Pairing(self, shadow, ctx, record_content=record_content,
                              started_ns=started_ns)
        task = asyncio.get_running_loop().create_task(
            self._run(pool.release, backend, endpoint, body, headers, pairing, started_ns)
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return pairing

    async def _run(
        self,
        release: Callable[[BackendState], None],
        backend: BackendState,
        endpoint: str,
        body: bytes,
        headers: RawHeaders,
        pairing: Pairing | None,
        started_ns: int,
    ) -> None:
        stats = self.stats
        stats.started += 1
        stats.in_flight += 1
        status: int | str = "error"
        reader = _Reader(started_ns)
        try:
            send_headers = list(headers)
            if backend.auth_header:
                send_headers.append((b"authorization", backend.auth_header))
            response = await self.upstream.post(backend.urls[endpoint], body, send_headers)
            try:
                reader.status = response.status
                await reader.read(response)
            finally:
                response.close()
            status = response.status
            stats.by_status[status] = stats.by_status.get(status, 0) + 1
        except UpstreamError as exc:
            stats.errors += 1
            reader.error = type(exc).__name__
        finally:
            stats.in_flight -= 1
            release(backend)
            self.metrics.shadow(status)
            if pairing is not None:
                pairing.shadow(reader.answer())


class _Reader:
    """Reads one shadow answer into an :class:`Answer` (per shadow request)."""

    __slots__ = ("body", "capture", "complete", "error", "first_ns", "last_ns", "started_ns",
                 "status")

    def __init__(self, started_ns: int) -> None:
        self.started_ns = started_ns
        self.status: int | None = None
        self.capture: StreamCapture | None = None
        self.body: list[bytes] | None = []
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.complete = False
        self.error: str | None = None

    async def read(self, response: UpstreamResponse) -> int:
        """Read the answer to its end; returns its size in bytes."""
        size = 0
        self.capture = StreamCapture() if response.is_stream else None
        async for chunk in response.chunks():
            if self.first_ns is None:
                self.first_ns = time.perf_counter_ns()
            size += len(chunk)
            if self.capture is not None:
                self.capture.feed(chunk)
            elif self.body is not None:
                self.body.append(chunk)
                if size > _MAX_BODY:
                    self.body, self.error = None, "body too large to compare"
        self.last_ns = time.perf_counter_ns()
        if self.capture is None:  # a whole body: its end is its first token
            self.first_ns = self.last_ns
        self.complete = True
        return size

    def answer(self) -> Answer:
        status = self.status
        ok = (status is not None and 200 <= status < 300 and self.complete
              and self.error is None)
        answer = Answer(status=status, ok=ok, ttft_ms=_ms(self.first_ns, self.started_ns),
                        duration_ms=_ms(self.last_ns, self.started_ns),
                        error=None if ok else (self.error or _why(status, self.complete, None)))
        if not ok:
            return answer
        if self.capture is not None:
            answer.text = self.capture.text()
            answer.finish_reason = self.capture.finish_reason
            answer.output_tokens = self.capture.output_tokens
        elif self.body is not None:
            answer.text, answer.finish_reason, answer.output_tokens = read_body(
                b"".join(self.body))
        return answer
