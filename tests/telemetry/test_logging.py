"""JSON-lines logs: the access line, stdlib routing, sampling, and a secret scan."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import structlog

from gateway.telemetry.logging import AccessLog, LogSettings, get_logger, setup_logging
from tests.telemetry.fakes import FakeUsage, finished

SECRETS = [
    "sk-proj-AbCdEf0123456789xyz",
    "tok_live_0123456789abcdef",
    "hunter2-redis-password",
    "Please summarise my medical record",
]


@dataclass
class FakeSpan:
    trace_id: str | None = "0af7651916cd43dd8448eb211c80319c"
    span_id: str | None = "b7ad6b7169203331"


@pytest.fixture
def out() -> Iterator[io.BytesIO]:
    """A captured stdout; logging set-up undone after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buf = io.BytesIO()
    yield buf
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


def lines(buf: io.BytesIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def make(buf: io.BytesIO, **kw: Any) -> AccessLog:
    return setup_logging(LogSettings(buffered=False, **kw), stream=buf)


def test_access_line_fields(out: io.BytesIO) -> None:
    """One JSON object per request with ids, route, status, timings, tokens and cost."""
    access = make(out)
    access(finished(ttft_ms=150), FakeUsage(), tenant="acme", span=FakeSpan())
    (line,) = lines(out)
    assert line["event"] == "access" and line["level"] == "info"
    assert line["timestamp"].endswith("Z") and "T" in line["timestamp"]
    assert {k: line[k] for k in ("request_id", "tenant", "key_id", "model", "class", "pool",
                                 "backend", "status", "attempts", "trace_id", "span_id")} == {
        "request_id": "req-1", "tenant": "acme", "key_id": "key-1", "model": "chat-model",
        "class": "interactive", "pool": "gpu-a", "backend": "b1", "status": 200, "attempts": 1,
        "trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}
    assert line["ttft_ms"] == 150.0
    assert (line["tokens_in"], line["tokens_out"], line["tokens_history"],
            line["tokens_cached"], line["cost_micros"]) == (35, 31, 20, 8, 2_500_000)


def test_unsampled_span_adds_no_trace_ids(out: io.BytesIO) -> None:
    make(out)(finished(), None, span=FakeSpan(None, None))
    (line,) = lines(out)
    assert "trace_id" not in line and "tokens_in" not in line


def test_sampling_keeps_every_failure(out: io.BytesIO) -> None:
    """With access_sample=0 successes are dropped; errors, rejections, cancels are kept."""
    access = make(out, access_sample=0.0)
    for _ in range(50):
        access(finished(), FakeUsage())
    access(finished(status=502, outcome="failed"))
    access(finished(status=429, outcome="rejected"))
    access(finished(status=200, outcome="cancelled"))
    assert [(x["status"], x["outcome"], x["level"]) for x in lines(out)] == [
        (502, "failed", "warning"), (429, "rejected", "warning"), (200, "cancelled", "warning")]


def test_access_off(out: io.BytesIO) -> None:
    access = make(out, access=False)
    access(finished(status=500, outcome="failed"))
    assert out.getvalue() == b""


def test_events_and_stdlib_records_are_json(out: io.BytesIO) -> None:
    """structlog events and stdlib records (with args, exceptions) both come out as JSON."""
    make(out)
    get_logger("gateway.app.state").info("policy_reloaded", version=3)
    logging.getLogger("uvicorn.error").warning("worker %s started", 42)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("gateway.proxy").exception("unexpected error in request %s", "r1")
    get_logger().debug("hidden")  # below the configured level
    reload, started, failed = lines(out)
    assert reload == {"event": "policy_reloaded", "version": 3, "logger": "gateway.app.state",
                      "level": "info", "timestamp": reload["timestamp"]}
    assert (started["event"], started["logger"], started["level"]) == (
        "worker 42 started", "uvicorn.error", "warning")
    assert failed["level"] == "error" and "RuntimeError: boom" in failed["exception"]


def test_secret_scan(out: io.BytesIO) -> None:
    """Keys, Authorization values, configured secrets and prompt text never reach a log line."""
    key, token, password, prompt = SECRETS
    access = make(out, secrets=(password,))
    log = get_logger("gateway.test")
    access(finished(status=401, outcome="rejected",
                    error=f"bad key {key}; Authorization: Bearer {token}"), None)
    log.warning("upstream_failed", detail=f"api-key={token} url=redis://:{password}@r:6379",
                headers={"Authorization": f"Bearer {token}", "api-key": key, "x-ok": "1"},
                raw_headers=[(b"authorization", f"Bearer {token}".encode())],
                prompt=prompt, messages=[{"role": "user", "content": prompt}],
                nested={"deep": {"list": [f"key {key}"]}})
    logging.getLogger("httpx").info("sending %s with key %s", "req", key)
    try:
        raise ValueError(f"cannot parse {key}")
    except ValueError:
        logging.getLogger("lib").exception("failed with Authorization=Bearer %s", token)
    text = out.getvalue().decode()
    for secret in SECRETS:
        assert secret not in text, secret
    parsed = lines(out)
    assert len(parsed) == 4
    assert parsed[1]["headers"] == {"Authorization": "[REDACTED]", "api-key": "[REDACTED]",
                                    "x-ok": "1"}
    assert parsed[1]["prompt"] == parsed[1]["messages"] == "[REDACTED]"
    assert "[REDACTED]" in parsed[0]["error"] and "[REDACTED]" in parsed[3]["exception"]


def test_buffered_writer_flushes_in_order(out: io.BytesIO) -> None:
    """The default writer queues lines and writes them, in order, by the time it is closed."""
    access = setup_logging(LogSettings(), stream=out)
    for i in range(1000):
        access(finished(request_id=f"r{i}"), None)
    access.close()
    assert [x["request_id"] for x in lines(out)] == [f"r{i}" for i in range(1000)]


def test_reads_tenant_usage_quota_from_the_context(out: io.BytesIO) -> None:
    ctx = finished()
    ctx.tenant, ctx.usage, ctx.quota = "acme", FakeUsage(), "admitted"  # type: ignore[attr-defined]
    make(out)(ctx)
    (line,) = lines(out)
    assert (line["tenant"], line["tokens_out"], line["quota"]) == ("acme", 31, "admitted")


@pytest.mark.parametrize("ns", [0, 999, 1_000, 1_764_500_000_123_456_789, 1_764_500_059_999_999_999,
                                1_764_500_060_000_001_000])
def test_access_timestamp_is_iso_utc_to_the_microsecond(ns: int) -> None:
    import datetime as dt

    access = AccessLog(LogSettings(buffered=False), _NullWriter(), _NoRedact())  # type: ignore[arg-type]
    whole = dt.datetime.fromtimestamp(ns // 10**9, dt.UTC)
    expected = whole.strftime("%Y-%m-%dT%H:%M:%S") + f".{ns // 1000 % 10**6:06d}Z"
    assert access._timestamp(ns) == expected
    assert access._timestamp(ns) == expected  # the cached second gives the same


class _NullWriter:
    def write(self, data: bytes, lines: int = 1) -> None:
        pass


class _NoRedact:
    def text(self, value: str) -> str:
        return value
