"""Budget alert webhooks against a real HTTP receiver: signed, retried, bounded, dispatched."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import structlog

from gateway.alerts import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    BudgetAlerts,
    Delivery,
    Outcome,
    WebhookSender,
    sign,
    verify,
)
from gateway.config import Alerts
from gateway.quota.alerts import BudgetAlert
from gateway.telemetry import LogSettings, Metrics, setup_logging
from tests.budgets.receiver import Receiver

SECRET = b"whsec-test-0123456789"


@pytest.fixture()
async def receiver() -> AsyncIterator[Receiver]:
    r = await Receiver().start()
    yield r
    await r.stop()


def outcomes() -> tuple[list[Outcome], WebhookSender]:
    seen: list[Outcome] = []
    return seen, WebhookSender(base_delay=0.01, max_delay=0.05, attempts=4, timeout=10.0,
                               on_outcome=seen.append)


def test_signature_round_trip() -> None:
    body = b'{"a": 1}'
    header = sign(SECRET, 1_700_000_000, body)
    assert header.startswith("t=1700000000,v1=")
    assert verify(SECRET, header, body, now=1_700_000_100)
    assert not verify(SECRET, header, body + b" ", now=1_700_000_100)  # body changed
    assert not verify(b"other", header, body, now=1_700_000_100)  # wrong secret
    assert not verify(SECRET, header, body, now=1_700_000_000 + 301)  # too old: a replay
    assert not verify(SECRET, "garbage", body)


@pytest.mark.parametrize("header", [
    "t=1700000000,v1=é",  # non-ASCII signature: TypeError from compare_digest on str
    "t=1700000000,v1=\u00ff" + "0" * 63,
    "t=\u0661\u0667" + "\u0660" * 8 + ",v1=00",  # non-ASCII digits in the timestamp
    "t=,v1=00",
    "t=1700000000",
    "v1=00",
    "t=x" + "9" * 5000 + ",v1=00",
    "",
    ",,,=,=",
])
def test_verify_is_false_for_any_malformed_header(header: str) -> None:
    assert verify(SECRET, header, b"{}", now=1_700_000_000) is False


async def test_delivery_is_signed(receiver: Receiver) -> None:
    seen, sender = outcomes()
    sender.start()
    try:
        body = b'{"type": "budget.threshold"}'
        assert sender.submit(Delivery(receiver.url, SECRET, body, "d-1"))
        (got,) = await receiver.wait_for(1)
        assert got.body == body
        assert got.headers["Content-Type"] == "application/json"
        assert got.headers[DELIVERY_HEADER] == "d-1"
        assert verify(SECRET, got.headers[SIGNATURE_HEADER], got.body)
        await sender.aclose()
        assert seen == ["delivered"]
    finally:
        await sender.aclose()


async def test_a_failing_receiver_is_retried_then_succeeds(receiver: Receiver) -> None:
    receiver.statuses = [503, 500]
    seen, sender = outcomes()
    sender.start()
    try:
        sender.submit(Delivery(receiver.url, SECRET, b"{}", "d-2"))
        got = await receiver.wait_for(3)
        assert [g.headers[DELIVERY_HEADER] for g in got] == ["d-2"] * 3
        assert all(verify(SECRET, g.headers[SIGNATURE_HEADER], g.body) for g in got)
        await sender.aclose()
        assert seen == ["retried", "retried", "delivered"]
    finally:
        await sender.aclose()


async def test_a_refusing_receiver_is_not_retried(receiver: Receiver) -> None:
    receiver.statuses = [400]
    seen, sender = outcomes()
    sender.start()
    try:
        sender.submit(Delivery(receiver.url, SECRET, b"{}", "d-3"))
        await receiver.wait_for(1)
        await sender.aclose()
        assert seen == ["failed"] and len(receiver.got) == 1
    finally:
        await sender.aclose()


async def test_an_unreachable_receiver_gives_up_after_its_attempts() -> None:
    seen, sender = outcomes()
    sender.start()
    try:
        from tests.ports import free_port

        sender.submit(Delivery(f"http://127.0.0.1:{free_port()}/hook", SECRET, b"{}", "d-4"))
        await sender.aclose(drain=30.0)
        assert seen == ["retried", "retried", "retried", "failed"]
    finally:
        await sender.aclose()


def test_a_full_queue_drops_and_counts() -> None:
    metrics = Metrics()
    sender = WebhookSender(queue_size=2, on_outcome=metrics.budget_webhook)  # never started
    assert sender.submit(Delivery("http://127.0.0.1:9/", SECRET, b"{}", "a"))
    assert sender.submit(Delivery("http://127.0.0.1:9/", SECRET, b"{}", "b"))
    assert not sender.submit(Delivery("http://127.0.0.1:9/", SECRET, b"{}", "c"))
    text = metrics.render()[0].decode()
    assert 'gateway_budget_alert_webhooks_total{outcome="dropped"} 1.0' in text
    assert sender.queued == 2


def alert(**changes: object) -> BudgetAlert:
    fields: dict[str, object] = {
        "level": "team", "subject": "core", "tenant": "acme", "organization": "bigco",
        "timezone": "Europe/Paris", "scope": "team:core", "budget": "cost_per_day",
        "period": "2025-03-30", "threshold": 80, "used": 8_000_000, "limit": 10_000_000,
        "unit": "cost", "trigger": "usage", "at": time.time()}
    fields.update(changes)
    return BudgetAlert(**fields)  # type: ignore[arg-type]


@pytest.fixture
def log_lines() -> Iterator[io.BytesIO]:
    """The gateway's JSON log lines, captured; the logging set-up undone afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buf = io.BytesIO()
    setup_logging(LogSettings(buffered=False), stream=buf)
    yield buf
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


async def test_the_sink_logs_counts_and_posts(receiver: Receiver, log_lines: io.BytesIO) -> None:
    metrics = Metrics()
    sender = WebhookSender(base_delay=0.01, on_outcome=metrics.budget_webhook)
    env = {"HOOK_URL": receiver.url, "HOOK_SECRET": SECRET.decode()}
    org_alerts = Alerts(webhook_url_env="HOOK_URL", webhook_secret_env="HOOK_SECRET")
    sink = BudgetAlerts(lambda org: org_alerts if org == "bigco" else Alerts(), sender,
                        metrics=metrics, currency=lambda: "EUR", env=env)
    sink.start()
    try:
        sink([alert(), alert(organization=None, level="tenant", subject="solo",
                             tenant="solo", unit="tokens", budget="tokens_per_day")])
        (got,) = await receiver.wait_for(1)  # the second has no webhook configured
        body = json.loads(got.body)
        assert verify(SECRET, got.headers[SIGNATURE_HEADER], got.body)
        assert {k: body[k] for k in ("type", "level", "subject", "organization", "tenant",
                                     "budget", "period", "threshold", "used", "limit", "unit",
                                     "currency", "trigger", "timezone")} == {
            "type": "budget.threshold", "level": "team", "subject": "core",
            "organization": "bigco", "tenant": "acme", "budget": "cost_per_day",
            "period": "2025-03-30", "threshold": 80, "used": 8_000_000, "limit": 10_000_000,
            "unit": "cost", "currency": "EUR", "trigger": "usage", "timezone": "Europe/Paris"}
        assert got.headers[DELIVERY_HEADER] == body["id"] == alert().id
        await sink.aclose()
        text = metrics.render()[0].decode()
        assert 'gateway_budget_alerts_total{level="team",threshold="80"} 1.0' in text
        assert 'gateway_budget_alerts_total{level="tenant",threshold="80"} 1.0' in text
        assert 'gateway_budget_alert_webhooks_total{outcome="delivered"} 1.0' in text
        events = [json.loads(line) for line in log_lines.getvalue().splitlines()]
        alerts = [e for e in events if e["event"] == "budget_alert"]
        solo = alert(organization=None, tenant="solo", budget="tokens_per_day").id
        assert [(e["level"], e["logger"], e["budget_level"], e["subject"], e["threshold"],
                 e["id"]) for e in alerts] == [
            ("warning", "gateway.budgets", "team", "core", 80, body["id"]),
            ("warning", "gateway.budgets", "tenant", "solo", 80, solo)]
        assert SECRET.decode() not in log_lines.getvalue().decode()
        assert receiver.url not in log_lines.getvalue().decode()
    finally:
        await sink.aclose()


async def test_the_sink_never_waits_for_the_receiver() -> None:
    """A receiver that accepts and never answers: the sink returns at once, the delivery
    stays queued or in flight, and closing the app does not hang on it."""
    hung: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hung.append(writer)
        await asyncio.Event().wait()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sender = WebhookSender(timeout=30.0)
    env = {"U": f"http://127.0.0.1:{port}/", "S": "secret"}
    sink = BudgetAlerts(lambda org: Alerts(webhook_url_env="U", webhook_secret_env="S"),
                        sender, env=env)
    sink.start()
    try:
        sink([alert()])  # a plain call: nothing to await
        async with asyncio.timeout(30.0):
            while not hung:
                await asyncio.sleep(0.01)
    finally:
        await sink.aclose()  # drains for 2 s, then cancels the hung attempt
        server.close()
        for w in hung:
            w.close()
