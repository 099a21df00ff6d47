"""Quotas through real gateway processes sharing one real Redis: exact, and honest when down."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.redis_servers import RedisProc

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}


def _policy(sim_url: str, limits: dict[str, int], outage: str = "closed",
            processes: int = 1) -> dict[str, Any]:
    data = policy({"chat": [sim_url]})
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["plans"] = [{"name": "p", "limits": limits}]
    data["tenants"] = [{"name": "acme", "plan": "p"}]
    data["store"] = {"outage": outage, "processes": processes}
    return data


def _chat(url: str, **kw: Any) -> httpx.Response:
    body = {"model": "chat-model", "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}], **kw}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=20)


def test_rpm_exact_across_three_gateways(gateway_redis: RedisProc, tmp_path: Path) -> None:
    """3 gateway processes, 24 concurrent clients, rpm 40: exactly 40 admitted in the window."""
    with SimServer("interactive", speedup=20) as sim:
        data = _policy(sim.url, {"rpm": 40})
        gws = [GatewayProcess(tmp_path, data).start() for _ in range(3)]
        try:
            codes: list[int] = []
            lock = threading.Lock()

            def client(i: int) -> None:
                url = gws[i % 3].url
                for _ in range(5):
                    code = _chat(url).status_code
                    with lock:
                        codes.append(code)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(codes) == 120
            assert codes.count(200) == 40, {c: codes.count(c) for c in set(codes)}
            assert codes.count(429) == 80
            r = _chat(gws[1].url)
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert "rpm" in r.json()["error"]["message"]
        finally:
            for gw in gws:
                gw.stop()


def test_concurrency_exact_across_gateways(gateway_redis: RedisProc, tmp_path: Path) -> None:
    """concurrency 4 over 2 gateways: never more than 4 streams in flight at the engine."""
    with SimServer("interactive", speedup=2) as sim:
        data = _policy(sim.url, {"concurrency": 4})
        gws = [GatewayProcess(tmp_path, data).start() for _ in range(2)]
        try:
            peak = 0
            stop = threading.Event()

            def watch() -> None:
                nonlocal peak
                while not stop.is_set():
                    peak = max(peak, sim.stats()["running"] + sim.stats()["waiting"])
                    time.sleep(0.005)

            watcher = threading.Thread(target=watch)
            watcher.start()
            codes: list[int] = []

            def client(i: int) -> None:
                codes.append(_chat(gws[i % 2].url, max_tokens=60).status_code)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            stop.set()
            watcher.join()
            assert codes.count(200) >= 4 and peak <= 4, (peak, codes)
            assert set(codes) <= {200, 429}
        finally:
            for gw in gws:
                gw.stop()


def test_redis_down_fail_closed_and_open(gateway_redis: RedisProc, tmp_path: Path) -> None:
    """Redis killed: fail-closed answers 503 fast; fail-open serves on local limits."""
    with SimServer("interactive", speedup=20) as sim:
        closed = GatewayProcess(tmp_path, _policy(sim.url, {"rpm": 1000}, "closed")).start()
        opened = GatewayProcess(tmp_path, _policy(sim.url, {"rpm": 1000}, "open")).start()
        try:
            assert _chat(closed.url).status_code == 200
            assert _chat(opened.url).status_code == 200
            gateway_redis.kill()
            t0 = time.monotonic()
            r = _chat(closed.url)
            assert r.status_code == 503 and r.json()["error"]["code"] == "quota_unavailable"
            assert time.monotonic() - t0 < 1.0
            assert _chat(opened.url).status_code == 200
        finally:
            closed.stop()
            opened.stop()


def test_workers_on_one_port_exact_quota_ledger_metrics(gateway_redis: RedisProc,
                                                        tmp_path: Path) -> None:
    """`gateway serve --workers 3`: one port, one tenant; quota, ledger and metrics all exact."""
    os.environ["GATEWAY_ADMIN_TOKEN"] = "adm"
    try:
        with SimServer("interactive", speedup=20) as sim:
            gw = GatewayProcess(tmp_path, _policy(sim.url, {"rpm": 30}), workers=3).start()
            try:
                codes: list[int] = []
                lock = threading.Lock()

                def client() -> None:
                    for _ in range(5):
                        code = _chat(gw.url).status_code
                        with lock:
                            codes.append(code)

                threads = [threading.Thread(target=client) for _ in range(12)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert codes.count(200) == 30 and codes.count(429) == 30
                time.sleep(1.5)  # each worker flushes its metrics once a second
                text = httpx.get(gw.url + "/metrics").text
                ok = sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                         if ln.startswith("gateway_requests_total{") and 'status="200"' in ln)
                assert ok == 30, [ln for ln in text.splitlines() if "requests_total" in ln]
                usage = httpx.get(gw.url + "/admin/usage", params={"tenant": "acme"},
                                  headers={"Authorization": "Bearer adm"}).json()
                assert sum(r["requests"] for r in usage["data"]) == 30
                assert sum(r["output"] for r in usage["data"]) == 30 * 3
            finally:
                gw.stop()
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)


def test_cost_budget_through_gateway(gateway_redis: RedisProc, tmp_path: Path) -> None:
    """A tenant's daily spend budget: requests are admitted while their estimated cost fits,
    the real cost is settled, then 429 names cost_per_day."""
    with SimServer("interactive", speedup=20) as sim:
        data = _policy(sim.url, {})
        # 1 USD per 1k output tokens (1,000 per million), input free: 10 output tokens cost
        # 10,000 micro-units; a 0.05 USD budget holds 5 of them
        data["prices"] = {"models": {"chat-model": {"input": "0", "output": "1000"}}}
        data["plans"][0]["limits"] = {"cost_per_day": "0.05"}
        with GatewayProcess(tmp_path, data) as gw:
            codes = [_chat(gw.url, max_tokens=10).status_code for _ in range(7)]
            assert codes == [200] * 5 + [429] * 2, codes
            r = _chat(gw.url, max_tokens=10)
            assert "cost_per_day" in r.json()["error"]["message"]
            assert int(r.headers["retry-after"]) >= 1


def _hammer(url: str, n: int, codes: list[int]) -> None:
    for _ in range(n):
        codes.append(_chat(url).status_code)  # list.append is atomic under the GIL


def test_tpm_and_budget_exact_across_three_gateways(gateway_redis: RedisProc,
                                                    tmp_path: Path) -> None:
    """tpm and a daily token budget across 3 gateway processes: the admitted tokens never pass
    the limit (estimates equal the real usage here, so there is no overshoot to allow for)."""
    with SimServer("interactive", speedup=20) as sim:
        # each request: 8 prompt tokens ("hi" chat) + 3 output = 11 tokens
        per_request = 11
        for limits, admitted in (({"tpm": 10 * per_request}, 10),
                                 ({"tokens_per_day": 7 * per_request}, 7)):
            data = _policy(sim.url, limits)
            data["tenants"][0]["name"] = "acme"
            gws = [GatewayProcess(tmp_path, data).start() for _ in range(3)]
            try:
                probe = httpx.post(gws[0].url + "/v1/chat/completions", headers=AUTH, json={
                    "model": "chat-model", "max_tokens": 3,
                    "messages": [{"role": "user", "content": "hi"}]}, timeout=20)
                assert probe.status_code == 200
                assert probe.json()["usage"]["total_tokens"] == per_request
                codes: list[int] = []
                urls = [g.url for g in gws]
                threads = [threading.Thread(target=_hammer, args=(urls[i % 3], 3, codes))
                           for i in range(12)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                # the probe used one request's worth
                assert codes.count(200) == admitted - 1, (limits, codes)
                assert codes.count(429) == 36 - (admitted - 1)
            finally:
                for gw in gws:
                    gw.stop()
            gateway_redis.cli("FLUSHALL")


def test_settles_free_every_slot_and_reach_redis_before_exit(gateway_redis: RedisProc,
                                                             tmp_path: Path) -> None:
    """Settles run in the background after each response: back-to-back requests on one
    connection never find their own slots still taken, and after a graceful stop every lease
    is released and every request's real tokens (not its estimate) are in Redis."""
    import asyncio

    from gateway.quota.redis import RedisQuotaStore

    with SimServer("interactive", speedup=50) as sim:
        data = _policy(sim.url, {"concurrency": 1, "tpm": 10**9})
        gw = GatewayProcess(tmp_path, data).start()
        try:
            used = 0
            with httpx.Client(headers=AUTH, timeout=20) as client:  # one keep-alive connection
                for i in range(12):
                    r = client.post(gw.url + "/v1/chat/completions", json={
                        "model": "chat-model", "max_tokens": 200,
                        "messages": [{"role": "user", "content": "hi"}]})
                    assert r.status_code == 200, (i, r.text)
                    used += r.json()["usage"]["total_tokens"]
        finally:
            assert gw.stop() == 0

    async def read() -> tuple[int, int]:
        store = RedisQuotaStore.from_url(gateway_redis.url, timeout=30.0, connect_timeout=30.0)
        try:
            usage = await store.usage("acme", "tenant")
            return usage.in_flight, usage.tokens
        finally:
            await store.aclose()

    in_flight, tokens = asyncio.run(read())
    assert in_flight == 0
    assert tokens == used  # the window holds what the responses reported
