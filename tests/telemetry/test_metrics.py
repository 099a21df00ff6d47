"""Metrics: exact counts after known observations, bounded tenants, several processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.metrics import Metrics, mark_process_dead
from tests.telemetry.fakes import FakeContext, FakeUsage, finished

REPO = Path(__file__).resolve().parents[2]


def samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: bytes, name: str, **labels: str) -> float:
    return samples(text)[(name, frozenset(labels.items()))]


ROUTE = {"model": "chat-model", "pool": "gpu-a", "class": "interactive", "api": "chat"}
POOL_ROUTE = {"model": "chat-model", "pool": "gpu-a", "class": "interactive"}  # queue wait


@pytest.fixture
def rendered() -> bytes:
    """Four requests: two good streams, one quota rejection, one retried with a failover."""
    m = Metrics()
    m.observe_request(finished(ttft_ms=150, tpot_ms=20), FakeUsage())
    m.observe_request(finished(ttft_ms=600, tpot_ms=40), FakeUsage(), queue_wait_s=0.02)
    rejected = FakeContext(status=429, outcome="rejected", pool=None, backend=None, attempts=0,
                           stream=False, finished_ns=FakeContext().started_ns + 1_000_000)
    m.observe_request(rejected)
    m.quota_rejected("rpm")
    m.observe_request(finished(attempts=3, failovers=1, status=200), FakeUsage(cost=None))
    m.shadow(200)
    m.shadow("error")
    m.ejection("gpu-a", "b2")
    m.set_inflight("gpu-a", "b1", 5)
    m.set_queue_depth("gpu-a", 2)
    m.set_redis_up(True)
    body, content_type = m.render()
    assert content_type.startswith("text/plain")
    return body


def test_request_counts(rendered: bytes) -> None:
    assert value(rendered, "gateway_requests_total", **ROUTE, status="200") == 3
    assert value(rendered, "gateway_requests_total", model="chat-model", pool="", api="chat",
                 **{"class": "interactive"}, status="429") == 1


def test_series_name_the_client_api() -> None:
    """The same model answered through three APIs: three series, each counted apart."""
    m = Metrics()
    for endpoint, n in [("/v1/chat/completions", 2), ("/v1/messages", 3), ("/v1/responses", 1)]:
        for _ in range(n):
            m.observe_request(finished(endpoint=endpoint), FakeUsage())
    body, _ = m.render()
    for api, n in [("chat", 2), ("messages", 3), ("responses", 1)]:
        assert value(body, "gateway_requests_total", **{**ROUTE, "api": api}, status="200") == n
        assert value(body, "gateway_ttft_seconds_count", **{**ROUTE, "api": api}) == n
        assert value(body, "gateway_tokens_total", **{**ROUTE, "api": api}, kind="output") \
            == 31 * n


def test_latency_histograms(rendered: bytes) -> None:
    """TTFT and TPOT land in the right buckets; the rejected non-stream adds no TTFT."""
    assert value(rendered, "gateway_ttft_seconds_count", **ROUTE) == 3
    assert value(rendered, "gateway_ttft_seconds_bucket", **ROUTE, le="0.2") == 2
    assert value(rendered, "gateway_ttft_seconds_bucket", **ROUTE, le="0.5") == 2
    assert value(rendered, "gateway_ttft_seconds_bucket", **ROUTE, le="0.75") == 3
    assert value(rendered, "gateway_tpot_seconds_bucket", **ROUTE, le="0.025") == 2
    assert value(rendered, "gateway_tpot_seconds_count", **ROUTE) == 3
    assert value(rendered, "gateway_tpot_seconds_sum", **ROUTE) == pytest.approx(0.08)
    assert value(rendered, "gateway_request_duration_seconds_count", **ROUTE) == 3
    assert value(rendered, "gateway_queue_wait_seconds_count", **POOL_ROUTE) == 1


def test_token_retry_and_spend_counts(rendered: bytes) -> None:
    for kind, n in [("input", 105), ("system", 30), ("history", 60), ("new", 15),
                    ("cached", 24), ("output", 93)]:
        assert value(rendered, "gateway_tokens_total", **ROUTE, kind=kind) == n, kind
    assert value(rendered, "gateway_retries_total", **ROUTE) == 2
    assert value(rendered, "gateway_failovers_total", **ROUTE) == 1
    assert value(rendered, "gateway_spend_total", tenant="", model="chat-model") == 5.0


def test_other_counters_and_gauges(rendered: bytes) -> None:
    assert value(rendered, "gateway_quota_rejections_total", limit="rpm") == 1
    assert value(rendered, "gateway_shadow_requests_total", status="200") == 1
    assert value(rendered, "gateway_shadow_requests_total", status="error") == 1
    assert value(rendered, "gateway_ejections_total", pool="gpu-a", backend="b2") == 1
    assert value(rendered, "gateway_backend_healthy", pool="gpu-a", backend="b2") == 0
    assert value(rendered, "gateway_inflight", pool="gpu-a", backend="b1") == 5
    assert value(rendered, "gateway_queue_depth", pool="gpu-a") == 2
    assert value(rendered, "gateway_redis_up") == 1


def test_tenant_label_is_capped() -> None:
    """Past tenant_cap distinct tenants, the rest are counted as 'other'."""
    m = Metrics(tenant_label=True, tenant_cap=2)
    for tenant in ("a", "b", "c", "d", "a"):
        m.observe_request(finished(), FakeUsage(), tenant=tenant)
    body, _ = m.render()
    counts = {t: value(body, "gateway_requests_total", **ROUTE, status="200", tenant=t)
              for t in ("a", "b", "other")}
    assert counts == {"a": 2, "b": 1, "other": 2}
    assert value(body, "gateway_spend_total", tenant="other", model="chat-model") == 5.0
    assert repr(m) == "<Metrics on single [label sets: 3 | tenants: 2]>"


def test_disabled_records_nothing() -> None:
    m = Metrics(enabled=False)
    m.observe_request(finished(), FakeUsage())
    m.quota_rejected("rpm")
    m.set_inflight("p", "b", 1)
    assert b"gateway_requests_total{" not in m.render()[0]


WRITER = """
import sys
from gateway.telemetry.metrics import Metrics
from tests.telemetry.fakes import FakeUsage, finished
m = Metrics()
for _ in range(int(sys.argv[1])):
    m.observe_request(finished(), FakeUsage())
m.set_inflight("gpu-a", "b1", int(sys.argv[2]))
m.set_backend_health("gpu-a", "b1", sys.argv[3] == "1")
m.quota_rejected("rpm")
m.flush()
"""
RENDER = "import sys; from gateway.telemetry.metrics import Metrics; " \
         "sys.stdout.buffer.write(Metrics().render()[0])"


@pytest.mark.process
def test_multiprocess_mode_merges_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """Two worker processes write; any process renders the sum; a dead worker's live gauges go."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, n, inflight, healthy], env=env,
                              cwd=REPO)
             for n, inflight, healthy in (("7", "3", "1"), ("5", "4", "0"))]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    body = subprocess.run([sys.executable, "-c", RENDER], env=env, cwd=REPO, check=True,
                          capture_output=True).stdout
    assert value(body, "gateway_requests_total", **ROUTE, status="200") == 12
    assert value(body, "gateway_tokens_total", **ROUTE, kind="output") == 12 * 31
    assert value(body, "gateway_ttft_seconds_count", **ROUTE) == 12
    assert value(body, "gateway_quota_rejections_total", limit="rpm") == 2
    assert value(body, "gateway_inflight", pool="gpu-a", backend="b1") == 7  # livesum
    assert value(body, "gateway_backend_healthy", pool="gpu-a", backend="b1") == 0  # livemin

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    mark_process_dead(procs[1].pid)
    body = subprocess.run([sys.executable, "-c", RENDER], env=env, cwd=REPO, check=True,
                          capture_output=True).stdout
    assert value(body, "gateway_inflight", pool="gpu-a", backend="b1") == 3
    assert value(body, "gateway_backend_healthy", pool="gpu-a", backend="b1") == 1
    assert value(body, "gateway_requests_total", **ROUTE, status="200") == 12  # counters stay


def test_counts_reach_prometheus_after_the_interval() -> None:
    """Observations gather locally; a call past flush_interval moves them into the children
    (what other workers read in multiprocess mode), without waiting for a render."""
    m = Metrics(flush_interval=3600)
    m.observe_request(finished(), FakeUsage())
    child = m.requests.labels("chat-model", "gpu-a", "interactive", "chat", "200")
    assert child._value.get() == 0
    m.flush_interval, m._next_flush = 0.0, 0.0
    m.observe_request(finished(), FakeUsage())
    assert child._value.get() == 2


def test_reads_tenant_and_usage_from_the_context() -> None:
    """A context that carries tenant and usage needs no extra arguments."""
    m = Metrics(tenant_label=True)
    ctx = finished()
    ctx.tenant, ctx.usage = "acme", FakeUsage()  # type: ignore[attr-defined]
    m.observe_request(ctx)
    body = m.render()[0]
    assert value(body, "gateway_tokens_total", **ROUTE, kind="output", tenant="acme") == 31


def test_no_zero_series_with_empty_labels() -> None:
    """A request refused before it had a model, pool or class (a 401) is counted once, and
    leaves no all-zero token, retry, failover, TTFT or TPOT series with empty labels
    (issue 14, point 23)."""
    m = Metrics()
    refused = FakeContext(status=401, request_model=None, pool=None, request_class=None,
                          backend=None, attempts=0, stream=False,
                          finished_ns=FakeContext().started_ns + 1_000_000)
    m.observe_request(refused)
    m.observe_request(finished(), FakeUsage())  # a normal one beside it
    body, _ = m.render()
    empty_zero = [(name, dict(labels)) for (name, labels), v in samples(body).items()
                  if v == 0 and any(val == "" for _, val in labels)]
    assert empty_zero == []
    assert value(body, "gateway_requests_total", model="", pool="", status="401", api="chat",
                 **{"class": ""}) == 1
    names = {name for (name, labels), _ in samples(body).items()
             if dict(labels).get("model") == ""}
    assert names == {"gateway_requests_total", "gateway_request_duration_seconds_bucket",
                     "gateway_request_duration_seconds_count",
                     "gateway_request_duration_seconds_sum"}


def test_ledger_state() -> None:
    """What waits, what spooled and the worst commit lag reach /metrics as set."""
    m = Metrics()
    m.set_ledger(7, 2, {"stored": 100, "duplicate": 3, "spooled": 5, "replayed": 5}, 12.5,
                 journaled=4, journal_failed=True)
    body, _ = m.render()
    assert value(body, "gateway_ledger_journal_records") == 4
    assert value(body, "gateway_ledger_journal_failed") == 1
    assert value(body, "gateway_ledger_pending") == 7
    assert value(body, "gateway_ledger_spool_segments") == 2
    assert value(body, "gateway_ledger_records", outcome="stored") == 100
    assert value(body, "gateway_ledger_records", outcome="duplicate") == 3
    assert value(body, "gateway_ledger_commit_lag_seconds") == pytest.approx(0.0125)
    off = Metrics(enabled=False)
    off.set_ledger(1, 1, {"stored": 1}, 1.0)  # a no-op when metrics are off
