"""Telemetry: request tracing (OpenTelemetry), Prometheus metrics, JSON-lines logs.

Independent objects, each made once per worker by the app factory and passed in:

* :class:`RequestTracing` - ``start(headers, ctx)`` per request returns a span (a shared no-op
  unless sampled); see :mod:`gateway.telemetry.tracing`.
* :class:`Metrics` - ``observe_request(ctx, usage)`` per request, ``render()`` for ``/metrics``.
* :class:`AccessLog` from :func:`setup_logging` - ``access_log(ctx, usage)`` per request;
  :func:`get_logger` for events.
* :class:`FinishedRequests` - the proxy's one call per finished request; hands requests to the
  metrics and the access log in batches (``Metrics.observe_one``, ``AccessLog.line`` / ``emit``).

Telemetry reads the request context and usage (:mod:`gateway.telemetry.types`) and knows no
business rule. The OpenTelemetry SDK is imported only when tracing is on.
"""

from __future__ import annotations

from gateway.telemetry.finished import FinishedRequests
from gateway.telemetry.logging import AccessLog, LogSettings, get_logger, setup_logging
from gateway.telemetry.metrics import Metrics, mark_process_dead
from gateway.telemetry.redact import Redactor
from gateway.telemetry.spans import NOOP_SPAN, AttemptSpan, RequestSpan
from gateway.telemetry.tracing import RequestTracing, TracingSettings

__all__ = [
    "NOOP_SPAN",
    "AccessLog",
    "AttemptSpan",
    "FinishedRequests",
    "LogSettings",
    "Metrics",
    "Redactor",
    "RequestSpan",
    "RequestTracing",
    "TracingSettings",
    "get_logger",
    "mark_process_dead",
    "setup_logging",
]
