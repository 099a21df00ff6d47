"""The fair-queuing metrics: queue wait and dispatched tokens by pool and tenant, with the
tenant label capped and hidden (``*``) when per-tenant series are off."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.metrics import Metrics


def _samples(m: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body, _ = m.render()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


def _get(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
         **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_wait_and_tokens_by_tenant() -> None:
    m = Metrics()
    m.dispatched("chat", "a", 0.0, 1200)
    m.dispatched("chat", "a", 0.3, 800)
    m.dispatched("chat", "b", 0.004, 100)
    s = _samples(m)
    assert _get(s, "gateway_tenant_dispatched_tokens_total", pool="chat", tenant="a") == 2000
    assert _get(s, "gateway_tenant_dispatched_tokens_total", pool="chat", tenant="b") == 100
    assert _get(s, "gateway_tenant_queue_wait_seconds_count", pool="chat", tenant="a") == 2
    assert _get(s, "gateway_tenant_queue_wait_seconds_bucket", pool="chat", tenant="a",
                le="0.001") == 1
    assert _get(s, "gateway_tenant_queue_wait_seconds_bucket", pool="chat", tenant="b",
                le="0.005") == 1
    assert _get(s, "gateway_tenant_queue_wait_seconds_sum", pool="chat",
                tenant="a") == 0.3


def test_tenant_label_capped_and_hidden() -> None:
    m = Metrics(tenant_cap=1)
    m.dispatched("chat", "a", 0.0, 10)
    m.dispatched("chat", "b", 0.0, 20)
    m.dispatched("chat", "c", 0.0, 30)
    s = _samples(m)
    assert _get(s, "gateway_tenant_dispatched_tokens_total", pool="chat", tenant="other") == 50
    hidden = Metrics(tenant_series=False)
    hidden.dispatched("chat", "a", 0.0, 10)
    hidden.dispatched("chat", "b", 0.0, 20)
    s = _samples(hidden)
    assert _get(s, "gateway_tenant_dispatched_tokens_total", pool="chat", tenant="*") == 30


def test_disabled_counts_nothing() -> None:
    m = Metrics(enabled=False)
    m.dispatched("chat", "a", 0.0, 10)
    assert not any(name.startswith("gateway_tenant_dispatched")
                   for name, _ in _samples(m))


def test_headroom_in_use_and_started() -> None:
    """The pool's headroom: slots in use now (a gauge), requests started on it (a counter,
    added to by what the pool counted since the last report)."""
    m = Metrics()
    m.set_headroom("chat", 2, 3)
    m.set_headroom("chat", 1, 0)
    m.set_headroom("chat", 0, 2)
    s = _samples(m)
    assert _get(s, "gateway_pool_headroom_in_use", pool="chat") == 0
    assert _get(s, "gateway_pool_headroom_dispatches_total", pool="chat") == 5
