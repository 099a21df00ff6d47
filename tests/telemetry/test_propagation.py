"""traceparent parsing and formatting (W3C Trace Context)."""

from __future__ import annotations

import pytest

from gateway.telemetry.propagation import (
    TraceParent,
    find_trace_headers,
    format_traceparent,
    parse_traceparent,
)

GOOD = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_parse_good() -> None:
    parent = parse_traceparent(GOOD)
    assert parent == TraceParent(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1)
    assert parent.sampled


@pytest.mark.parametrize("value", [
    pytest.param(None, id="absent"),
    pytest.param(b"", id="empty"),
    pytest.param(GOOD.upper(), id="upper-case"),
    pytest.param(b"00-00000000000000000000000000000000-b7ad6b7169203331-01", id="zero-trace"),
    pytest.param(b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", id="zero-span"),
    pytest.param(b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", id="version-ff"),
    pytest.param(GOOD + b"-extra", id="v00-with-extra"),
    pytest.param(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01", id="short-span"),
])
def test_parse_rejects(value: bytes | None) -> None:
    assert parse_traceparent(value) is None


def test_future_version_may_extend() -> None:
    assert parse_traceparent(b"01" + GOOD[2:] + b"-what-ever") is not None


def test_find_and_format() -> None:
    headers = [(b"host", b"x"), (b"traceparent", GOOD), (b"tracestate", b"a=b")]
    assert find_trace_headers(headers) == (GOOD, b"a=b")
    assert format_traceparent(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331) == GOOD
