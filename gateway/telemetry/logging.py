"""JSON-lines logging: structlog set-up, stdlib routing, redaction, and the access line.

:func:`setup_logging` configures structlog (msgspec JSON, ``cache_logger_on_first_use``) and
routes the stdlib root logger (uvicorn, asyncio, our ``logging.getLogger`` users) through the
same processors, so every line on stdout is one JSON object, redacted by
:class:`~gateway.telemetry.redact.Redactor`. Lines go through a
:class:`~gateway.telemetry.writer.LineWriter`, so no request waits on a stdout write.

The access line is the hot path (one per request): :class:`AccessLog` builds a struct and encodes
it directly, skipping the processor chain (~10 µs), and scrubs its one free-text field
(``error``); everything else in it is ids, names from the policy, and numbers. The two fields a
client can fill with anything, ``model`` and ``error`` (which may echo it), are cut to
:data:`FIELD_LIMIT` characters (:func:`clip`); the request id is already bounded (128).
Successful requests can be sampled; failed, rejected and cancelled ones are always logged.

Events (``log = get_logger(__name__)``; then ``log.info("policy_reloaded", version=...)``):
``startup``, ``policy_reloaded``, ``backend_ejected`` / ``backend_recovered``, ``redis_lost`` /
``redis_restored``; snake_case names, facts as keyword fields.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import msgspec
import structlog

from gateway.errors import FIELD_LIMIT, clip
from gateway.telemetry.redact import Redactor
from gateway.telemetry.writer import LineWriter

if TYPE_CHECKING:
    from collections.abc import Mapping

    from structlog.typing import EventDict, WrappedLogger

    from gateway.telemetry.spans import RequestSpan
    from gateway.telemetry.types import ContextView, UsageView

__all__ = ["FIELD_LIMIT", "AccessLog", "LogSettings", "clip", "get_logger", "setup_logging"]

#: the most characters of client-supplied free text an access line keeps per field
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL}
#: loggers that bring their own handlers; made to propagate to our root handler instead
_ADOPTED = ("uvicorn", "uvicorn.error", "uvicorn.access", "litestar")


def _fallback(obj: Any) -> str:
    return repr(obj)


_encode = msgspec.json.Encoder(enc_hook=_fallback).encode


class _AccessLine(msgspec.Struct, omit_defaults=True, gc=False, rename={"cls": "class"}):
    """One access line. A struct rather than a dict: it builds and encodes in about half the
    time, and this runs once per request. Fields without a default are always written (as
    ``null`` when unknown); the rest only when set."""

    #: the wall clock in ns when captured; the ISO 8601 string once rendered
    timestamp: str | int
    level: str
    event: str
    request_id: str
    tenant: str | None
    key_id: str | None
    endpoint: str
    model: str | None
    upstream_model: str | None
    cls: str | None
    pool: str | None
    backend: str | None
    stream: bool
    status: int
    outcome: str
    attempts: int
    ttft_ms: float | None
    duration_ms: float | None
    failovers: int = 0
    trace_id: str | None = None
    span_id: str | None = None
    quota: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_system: int | None = None
    tokens_history: int | None = None
    tokens_new: int | None = None
    tokens_cached: int | None = None
    tokens_estimated: bool = False
    cost_micros: int | None = None
    error: str | None = None
    #: the client's own correlation id (never the request's key: see ``request_id``)
    client_request_id: str | None = None


_encode_lines = msgspec.json.Encoder().encode_lines
_MILLIS = tuple(f".{i:03d}" for i in range(1000))
_MICROS_Z = tuple(f"{i:03d}Z" for i in range(1000))


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSettings:
    """What is logged; :meth:`from_env` reads ``GATEWAY_LOG_*``."""

    level: str = "info"
    #: one line per request
    access: bool = True
    #: share of successful requests that get an access line (errors always do), 0..1
    access_sample: float = 1.0
    #: strings to redact wherever they appear (backend keys, admin token, Redis password)
    secrets: tuple[str, ...] = ()
    #: False writes each line synchronously (tests, debugging)
    buffered: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 secrets: tuple[str, ...] = ()) -> LogSettings:
        env = os.environ if env is None else env
        sample = env.get("GATEWAY_ACCESS_LOG_SAMPLE", "").strip()
        return cls(
            level=env.get("GATEWAY_LOG_LEVEL", "info").strip().lower() or "info",
            access=env.get("GATEWAY_ACCESS_LOG", "on").strip().lower() not in {"off", "0",
                                                                            "false", "no"},
            access_sample=min(1.0, max(0.0, float(sample))) if sample else 1.0,
            secrets=secrets,
        )


def get_logger(name: str | None = None) -> Any:
    """A structlog logger (lazy: safe at import time, configured by :func:`setup_logging`)."""
    # ``logger`` is a parameter name of structlog's wrap_logger: bind as _logger, rename later
    return structlog.get_logger(_logger=name) if name else structlog.get_logger()


def _logger_name(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    name = event.pop("_logger", None)
    if name is not None:
        event["logger"] = name
    return event


def _render_bytes(logger: WrappedLogger, method: str, event: EventDict) -> bytes:
    return _encode(event)


def _render_str(logger: WrappedLogger, method: str, event: EventDict) -> str:
    return _encode(event).decode()


class _Handler(logging.Handler):
    """Hands formatted stdlib records to the line writer."""

    def __init__(self, writer: LineWriter | _Direct) -> None:
        super().__init__()
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.writer.write(self.format(record).encode() + b"\n")
        except Exception:
            self.handleError(record)


class _Direct:
    """Unbuffered writer: each line is written and flushed at once."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def write(self, line: bytes, lines: int = 1) -> None:
        self._stream.write(line)
        self._stream.flush()

    def flush(self) -> None:
        self._stream.flush()

    def drain(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        self._stream.flush()


def setup_logging(settings: LogSettings | None = None, stream: IO[bytes] | None = None
                  ) -> AccessLog:
    """Configure structlog and the stdlib root logger; return the access logger.

    Process-wide (structlog and ``logging`` are): call once per worker, from the app factory.
    ``stream`` defaults to ``sys.stdout.buffer``.
    """
    settings = settings or LogSettings()
    out = stream if stream is not None else sys.stdout.buffer
    writer: LineWriter | _Direct = LineWriter(out) if settings.buffered else _Direct(out)
    redactor = Redactor(settings.secrets)
    level = _LEVELS.get(settings.level, logging.INFO)
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            _logger_name,
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            structlog.processors.format_exc_info,
            redactor,
            _render_bytes,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.BytesLoggerFactory(writer),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    handler = _Handler(writer)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            stamp,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            redactor,
            _render_str,
        ],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler) or h.__class__ is
                logging.StreamHandler]:
        root.removeHandler(old)
        if isinstance(old, _Handler):
            old.writer.close()
    root.addHandler(handler)
    root.setLevel(level)
    for name in _ADOPTED:
        adopted = logging.getLogger(name)
        adopted.handlers.clear()
        adopted.propagate = True
    return AccessLog(settings, writer, redactor)


class AccessLog:
    """Writes the one access line of each request; shared by all requests of a worker.

    The proxy's finished requests come in batches (:meth:`line` for each, then :meth:`emit`,
    from :class:`~gateway.telemetry.finished.FinishedRequests`): each line's struct is built
    positionally (keywords cost three times as much), stamped, and the whole batch is encoded
    to JSON by one ``encode_lines`` call and written with one call to the writer. Measured
    through the gateway (``loadtest.overhead.ab``): rendering and writing each line as its
    request ended cost ~9 µs of the event loop per request; batched, ~1 µs plus the capture.
    A direct call (tools, tests) writes its one line at once.
    """

    def __init__(self, settings: LogSettings, writer: LineWriter | _Direct,
                 redactor: Redactor) -> None:
        self.settings = settings
        self.writer = writer
        self._redact = redactor.text
        self._write = writer.write
        self._sample = settings.access_sample
        self._second = -1
        self._prefix = ""
        self.on = settings.access

    def __repr__(self) -> str:
        s = self.settings
        return f"<AccessLog {'on' if s.access else 'off'} sample={s.access_sample}>"

    def close(self) -> None:
        """Write what is buffered and stop the writer thread."""
        self.writer.close()

    def _timestamp(self, ns: int) -> str:
        micros = ns // 1000
        second = micros // 1_000_000
        if second != self._second:  # format the date once a second, not once a line
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        # the fraction from two 1,000-entry tables: a third of the cost of formatting it
        return self._prefix + _MILLIS[micros // 1000 % 1000] + _MICROS_Z[micros % 1000]

    def __call__(self, ctx: ContextView, usage: UsageView | None = None, *,
                 tenant: str | None = None, span: RequestSpan | None = None,
                 quota: str | None = None) -> None:
        """Log one finished request now (call once, after usage is known, on every path).

        ``usage``, ``tenant`` and ``quota`` default to the context's own attributes of those
        names when it has them.
        """
        if self.on:
            line = self.line(ctx, usage, tenant, span, quota, time.time_ns())
            if line is not None:
                self.emit([line])

    def line(self, ctx: ContextView, usage: UsageView | None, tenant: str | None,
             span: RequestSpan | None, quota: str | None, wall_ns: int) -> _AccessLine | None:
        """The request's line (its ``timestamp`` still the wall clock in ns), or None when
        sampled out; :meth:`emit` writes lines. For callers that loop over many requests
        (:class:`~gateway.telemetry.finished.FinishedRequests`); only while ``on``."""
        status = ctx.status
        outcome = ctx.outcome
        ok = outcome == "completed" and status < 400
        if ok and self._sample < 1.0 and random.random() >= self._sample:
            return None
        if usage is None:
            usage = getattr(ctx, "usage", None)
        if tenant is None:
            tenant = getattr(ctx, "tenant", None)
        if quota is None:
            quota = getattr(ctx, "quota", None)
        trace_id = span_id = None
        if span is not None and span.trace_id is not None:
            trace_id, span_id = span.trace_id, span.span_id
        started, first, finished = ctx.started_ns, ctx.first_token_ns, ctx.finished_ns
        error = ctx.error
        if error:  # cut before redacting (megabytes of it), and after: no half secret left
            error = clip(self._redact(clip(error, 4 * FIELD_LIMIT)))
        model = ctx.request_model
        if model is not None and len(model) > FIELD_LIMIT:
            model = clip(model)
        if usage is None:
            t_in = t_out = t_system = t_history = t_new = t_cached = cost = None
            estimated = False
        else:
            t_in, t_out, t_system, t_history = (usage.prompt_total, usage.output, usage.system,
                                                usage.history)
            t_new, t_cached, estimated = usage.new, usage.cached, usage.estimated
            cost = None if usage.cost is None else usage.cost.total
        # positional, in field order: a third of the cost of keywords (it runs per request)
        return _AccessLine(
            wall_ns, "info" if ok else "warning", "access", ctx.request_id, tenant,
            ctx.key_id, ctx.endpoint, model, ctx.upstream_model, ctx.request_class,
            ctx.pool, ctx.backend, ctx.stream, status, outcome, ctx.attempts,
            None if first is None else (first - started) // 1000 / 1000,
            None if finished is None else (finished - started) // 1000 / 1000,
            ctx.failovers, trace_id, span_id, quota, t_in, t_out, t_system, t_history, t_new,
            t_cached, estimated, cost, error or None, ctx.client_request_id,
        )

    def emit(self, rows: list[_AccessLine]) -> None:
        """Stamp, encode and write ``rows`` (one encode, one call to the writer)."""
        stamp = self._timestamp
        for line in rows:
            line.timestamp = stamp(line.timestamp)  # type: ignore[arg-type]
        self._write(_encode_lines(rows), len(rows))
