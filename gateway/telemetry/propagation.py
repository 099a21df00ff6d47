"""W3C Trace Context on raw ASGI headers: find, parse and format ``traceparent``.

Plain functions over ``list[tuple[bytes, bytes]]``: no OpenTelemetry propagator, no carrier
dicts. A malformed header is ignored (the request starts a new trace), as the spec asks.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["TRACE_HEADERS", "TraceParent", "find_trace_headers", "format_traceparent",
           "parse_traceparent"]

#: header names a propagating hop replaces
TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})

# version 00 is exactly 55 characters; a higher version may append fields after a dash
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


class TraceParent(NamedTuple):
    """A parsed ``traceparent``: ids as integers, ``flags`` bit 0 is *sampled*."""

    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)


def find_trace_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes | None, bytes | None]:
    """The raw ``traceparent`` and ``tracestate`` values (ASGI names are lower-case)."""
    parent = state = None
    for name, value in headers:
        if name == b"traceparent":
            parent = value
        elif name == b"tracestate":
            state = value
    return parent, state


def parse_traceparent(value: bytes | None) -> TraceParent | None:
    """The parent a client sent, or None when absent or malformed."""
    if value is None:
        return None
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest is not None):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceParent(trace_id, span_id, int(flags_hex, 16))


def format_traceparent(trace_id: int, span_id: int, sampled: bool = True) -> bytes:
    """``00-<trace>-<span>-<flags>`` as header bytes."""
    return b"00-%032x-%016x-%s" % (trace_id, span_id, b"01" if sampled else b"00")
