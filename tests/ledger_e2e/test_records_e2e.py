"""Usage records through the gateway: one per admitted request, exact against the simulator."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy, usage_records, wait_usage_records

pytestmark = pytest.mark.process

ADMIN = "admin-ledger-test"
AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
OTHER_KEY = "sk-gw-other-tenant-key-0123456789abcdef0123456789"


def _policy(sim_url: str) -> dict[str, Any]:
    import hashlib

    data = policy({"chat": [sim_url]})
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["auth"]["keys"].append({"id": "other", "tenant": "globex",
                                 "sha256": hashlib.sha256(OTHER_KEY.encode()).hexdigest()})
    data["plans"] = [{"name": "p", "limits": {"rpm": 10000}}]
    data["tenants"] = [{"name": "acme", "plan": "p"}, {"name": "globex", "plan": "p"}]
    data["prices"] = {"models": {"chat-model": {"input": "1.5", "output": "6"}}}
    return data


def _records(gw: GatewayProcess) -> list[dict[str, Any]]:
    return usage_records(gw.url, ADMIN)


def _wait_records(gw: GatewayProcess, n: int) -> list[dict[str, Any]]:
    return wait_usage_records(gw.url, ADMIN, lambda records: len(records) >= n, within=5)


@pytest.fixture(params=["sqlite", "postgresql+redis"])
def setup(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          ) -> Iterator[tuple[GatewayProcess, SimServer]]:
    """The embedded gateway (SQLite ledger, quotas in the process), and the production one
    (PostgreSQL ledger of record, quotas in Redis)."""
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    if request.param == "postgresql+redis":
        request.getfixturevalue("gateway_redis")
        monkeypatch.setenv("GATEWAY_LEDGER_URL", request.getfixturevalue("postgres_url"))
        migrate(os.environ["GATEWAY_LEDGER_URL"])
    with SimServer("interactive", speedup=10, jitter=0.0) as sim, \
            GatewayProcess(tmp_path, _policy(sim.url)) as gw:
        yield gw, sim


def migrate(url: str) -> None:
    """``gateway db migrate`` for a database a test made (a gateway refuses an empty one)."""
    out = subprocess.run([sys.executable, "-m", "gateway", "db", "migrate", "--url", url],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "applied migrations 1, 2" in out.stdout


def test_one_record_per_request_reconciles_with_simulator(setup) -> None:  # type: ignore[no-untyped-def]
    """Every kind of request leaves one record; tokens equal what the simulator counted."""
    gw, sim = setup
    before = sim.stats()
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    reply = client.chat.completions.create(model="chat-model", messages=history, max_tokens=7)
    history += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": "And then?"}]
    client.chat.completions.create(model="chat-model", messages=history, max_tokens=5)
    for usage in (True, False):
        opts = {"include_usage": True} if usage else None
        list(client.chat.completions.create(model="chat-model", messages=history, max_tokens=9,
                                            stream=True, stream_options=opts))
    client.completions.create(model="chat-model", prompt="Once upon", max_tokens=4)
    records = _wait_records(gw, 5)
    assert len(records) == 5 and len({r["request_id"] for r in records}) == 5
    after = sim.stats()
    assert sum(r["output"] for r in records) == (
        after["generated_tokens_total"] - before["generated_tokens_total"]) == 7 + 5 + 9 + 9 + 4
    assert sum(r["prompt_total"] for r in records) == (
        after["prompt_tokens_total"] - before["prompt_tokens_total"])
    assert not any(r["estimated"] for r in records)
    for r in records:
        assert r["system"] + r["history"] + r["new"] + r["tools"] == r["prompt_total"]
        assert r["tenant"] == "acme" and r["key_id"] == "test" and r["outcome"] == "completed"
        assert r["cost_micros"] > 0
        assert r["delivered"] is True and r["sent_output"] == r["output"]  # read to the end
    second = [r for r in records if r["history"] > 0]
    assert len(second) == 3  # the follow-up turns re-send the first exchange as history
    # totals by the tenant's own key; reconcile is clean
    usage = httpx.get(gw.url + "/v1/usage", headers=AUTH).json()
    assert sum(row["requests"] for row in usage["data"]) == 5
    assert sum(row["output"] for row in usage["data"]) == 34
    day = time.strftime("%Y-%m-%d", time.gmtime())
    rec = httpx.get(gw.url + "/admin/usage/reconcile", params={"tenant": "acme", "day": day},
                    headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert rec["consistent"] is True


def test_tenant_isolation(setup) -> None:  # type: ignore[no-untyped-def]
    gw, _ = setup
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
    client.chat.completions.create(model="chat-model", max_tokens=3,
                                   messages=[{"role": "user", "content": "a"}])
    _wait_records(gw, 1)
    other = httpx.get(gw.url + "/v1/usage", headers={"Authorization": f"Bearer {OTHER_KEY}"})
    assert other.status_code == 200 and other.json()["tenant"] == "globex"
    assert other.json()["data"] == []
    mine = httpx.get(gw.url + "/v1/usage", headers=AUTH, params={"tenant": "globex"}).json()
    assert mine["tenant"] == "acme" and sum(r["requests"] for r in mine["data"]) == 1
    assert httpx.get(gw.url + "/v1/usage").status_code == 401


def test_disconnect_and_retries_leave_one_record_each(setup) -> None:  # type: ignore[no-untyped-def]
    """A client that leaves mid-stream -> one estimated, cancelled record; a failed request
    after admission -> one failed record."""
    gw, _ = setup
    body = {"model": "chat-model", "stream": True, "max_tokens": 3000,
            "messages": [{"role": "user", "content": "long"}]}
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=AUTH) as r:
        for i, _ in enumerate(r.iter_raw()):
            if i >= 5:
                break
    r = httpx.post(gw.url + "/v1/chat/completions", headers={**AUTH, "x-sim-error-status": "500"},
                   json={"model": "chat-model", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 502
    records = _wait_records(gw, 2)
    assert len(records) == 2
    cancelled = next(r for r in records if r["outcome"] == "cancelled")
    assert cancelled["estimated"] is True and 0 < cancelled["output"] < 3000
    # it was cut: not delivered, and the output it was sent is what it is billed for
    assert cancelled["delivered"] is False
    assert cancelled["sent_output"] == cancelled["output"]
    failed = next(r for r in records if r["outcome"] == "failed")
    assert failed["status"] == 502 and failed["attempts"] >= 1
    # failed before any output: its prompt is counted, but it costs nothing (bill_failed off)
    assert failed["prompt_total"] > 0 and failed["cost_micros"] == 0
    assert cancelled["cost_micros"] > 0  # it did get output


@pytest.mark.parametrize("bill_failed", [False, True])
def test_failed_requests_cost_nothing_unless_billed(tmp_path: Path, bill_failed: bool) -> None:
    """prices.bill_failed decides whether a request that failed before any output is charged;
    its tokens are on the record either way."""
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        with SimServer("interactive", speedup=10) as sim:
            data = _policy(sim.url)
            data["prices"]["bill_failed"] = bill_failed
            with GatewayProcess(tmp_path, data) as gw:
                r = httpx.post(gw.url + "/v1/chat/completions",
                               headers={**AUTH, "x-sim-error-status": "500"},
                               json={"model": "chat-model",
                                     "messages": [{"role": "user", "content": "x " * 50}]})
                assert r.status_code == 502
                (record,) = _wait_records(gw, 1)
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)
    assert record["outcome"] == "failed" and record["prompt_total"] > 50
    assert (record["cost_micros"] > 0) is bill_failed
    assert record["cost_micros"] == sum(record[f"cost_{k}"] for k in (
        "system", "history", "new", "tools", "output", "reasoning"))


def test_usage_export_cli(tmp_path: Path) -> None:
    """`gateway usage export` reads the embedded ledger's journal after the gateway stopped."""
    with SimServer("interactive", speedup=10) as sim:
        data = _policy(sim.url)
        gw = GatewayProcess(tmp_path, data).start()
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
        for _ in range(3):
            client.chat.completions.create(model="chat-model", max_tokens=2,
                                           messages=[{"role": "user", "content": "a"}])
        gw.stop()  # SIGTERM: the ledger drains to the journal
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "usage", "export", "--config", str(gw.config),
         "--from", "2000-01-01", "--to", "2100-01-01", "--format", "csv"],
        capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("request_id") and len(lines) == 4


def test_retried_request_leaves_one_record_with_attempts(tmp_path: Path) -> None:
    """The first backend answers 503, the second serves: one record, attempts = 2."""
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        with SimServer("interactive", speedup=10, error_status=503) as bad, \
                SimServer("interactive", speedup=10) as good:
            data = _policy(bad.url)
            data["pools"][0]["backends"].append({"name": "good", "url": good.url})
            data["pools"][0]["strategy"] = "round_robin"
            data["routing"] = {"retry": {"backoff_base": 0.001}}
            with GatewayProcess(tmp_path, data) as gw:
                for _ in range(4):
                    r = httpx.post(gw.url + "/v1/chat/completions", headers=AUTH, json={
                        "model": "chat-model", "max_tokens": 2,
                        "messages": [{"role": "user", "content": "x"}]})
                    assert r.status_code == 200
                records = _wait_records(gw, 4)
                assert len(records) == 4
                assert len({r["request_id"] for r in records}) == 4  # one record per request
                retried = [r for r in records if r["attempts"] == 2]
                assert retried and all(r["backend"] == "good" for r in retried)
                assert all(r["attempts"] in (1, 2) for r in records)
                assert all(r["outcome"] == "completed" and r["output"] == 2 for r in records)
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)
