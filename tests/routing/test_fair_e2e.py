"""Fair queuing end to end: a real gateway process in front of the simulator, two tenants
with their own keys, one backend slot, so the order requests complete in is the order the
pool's queue served them (no timing involved)."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.sim.server import SimServer
from tests.helpers import GatewayProcess, policy

pytestmark = pytest.mark.process

KEYS = {"a": "sk-gw-fair-a-0123456789abcdef0123456789abcdef",
        "b": "sk-gw-fair-b-0123456789abcdef0123456789abcdef"}
ADMIN = "admin-fair-test"
METRICS = "metrics-fair-test"
FLOOD = 8


def _policy(sim_url: str, fair: bool) -> dict[str, Any]:
    data = policy({"chat": [sim_url]})
    pool = data["pools"][0]
    pool["backends"][0]["max_in_flight"] = 1
    pool["fair"] = fair
    pool["fair_headroom"] = 0  # the queue's order alone (the headroom test sets its own)
    data["auth"] = {"keys": [
        {"id": f"key-{t}", "sha256": hashlib.sha256(k.encode()).hexdigest(), "tenant": t}
        for t, k in KEYS.items()]}
    data["plans"] = [{"name": "basic", "weight": 1}]
    data["tenants"] = [{"name": "a", "plan": "basic"}, {"name": "b", "plan": "basic"}]
    # a long start deadline: the pool's completion-rate estimate starts cold, and no request
    # here should be refused for it
    data["classes"] = [{"name": "interactive", "priority": 0, "start_deadline": 120},
                       {"name": "batch", "priority": 10, "start_deadline": 600}]
    return data


def _queued(gw: GatewayProcess) -> int:
    r = httpx.post(gw.url + "/admin/stats", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    return int(r.json()["pools"]["chat"]["queued"])


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _run(gw: GatewayProcess) -> tuple[list[str], int]:
    """A floods the pool with FLOOD requests; once they wait, B sends one. Returns the
    tenants in the order their requests completed, and how many had when B sent its own."""
    done: list[str] = []
    lock = threading.Lock()

    def send(tenant: str) -> None:
        # each of A's holds the one slot at least 400 ms: few finish while B's is on its way
        r = httpx.post(gw.url + "/v1/chat/completions", timeout=120,
                       headers={"Authorization": f"Bearer {KEYS[tenant]}",
                                "x-sim-extra-latency-ms": "400" if tenant == "a" else "0"},
                       json={"model": "chat-model", "max_tokens": 24,
                             "messages": [{"role": "user", "content": "hello there"}]})
        assert r.status_code == 200, r.text
        with lock:
            done.append(tenant)

    threads = [threading.Thread(target=send, args=("a",)) for _ in range(FLOOD)]
    for t in threads:
        t.start()
    _until(lambda: _queued(gw) + len(done) >= FLOOD - 1, "A's flood never queued")
    with lock:
        before = len(done)
    b = threading.Thread(target=send, args=("b",))
    b.start()
    for t in [*threads, b]:
        t.join()
    return done, before


def _headroom_started(gw: GatewayProcess) -> float:
    r = httpx.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {METRICS}"})
    return sum(s.value for f in text_string_to_metric_families(r.text) for s in f.samples
               if s.name == "gateway_pool_headroom_dispatches_total")


def _dispatched(gw: GatewayProcess) -> dict[str, float]:
    r = httpx.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {METRICS}"})
    assert r.status_code == 200
    return {s.labels["tenant"]: s.value
            for f in text_string_to_metric_families(r.text) for s in f.samples
            if s.name == "gateway_tenant_dispatched_tokens_total"}


def test_one_tenant_flood_does_not_hold_back_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With fair queuing B's request, sent after A's flood queued, is served within the next
    two (the one in flight, perhaps one tied with it); with ``fair: false`` it waits for all
    of A's. The per-tenant metrics count both."""
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("GATEWAY_METRICS_TOKEN", METRICS)
    with SimServer("interactive", speedup=4, jitter=0) as sim:
        positions = {}
        for fair in (True, False):
            with GatewayProcess(tmp_path, _policy(sim.url, fair)) as gw:
                order, before = _run(gw)
                positions[fair] = order.index("b") - before  # A's served after B came
                if fair:
                    tokens = _dispatched(gw)
                    assert set(tokens) == {"a", "b"}
                    assert tokens["a"] > FLOOD * tokens["b"] * 0.9  # same request sizes
        assert positions[True] <= 2, positions
        assert positions[False] >= FLOOD - 3, positions  # every A still waiting went first


def test_tenant_below_share_skips_the_flood_on_headroom(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot plus ``fair_headroom: 1``: A holds the slot (each of its requests 3 s long)
    and has one more waiting. B's three requests, sent one after another, each take the
    headroom and complete before A's first: so each gave its slot back as B's (the
    forwarder releases it for the tenant it was acquired for); A's waiter never took the
    headroom. With ``fair_headroom: 0`` B's waits for A's first."""
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("GATEWAY_METRICS_TOKEN", METRICS)
    with SimServer("interactive", speedup=4, jitter=0) as sim:
        for headroom in (1, 0):
            data = _policy(sim.url, True)
            data["pools"][0]["fair_headroom"] = headroom
            with GatewayProcess(tmp_path, data) as gw:
                done: list[str] = []
                lock = threading.Lock()

                def send(tenant: str, gw: GatewayProcess = gw, done: list[str] = done,
                         lock: threading.Lock = lock) -> None:
                    r = httpx.post(gw.url + "/v1/chat/completions", timeout=120, headers={
                        "Authorization": f"Bearer {KEYS[tenant]}",
                        "x-sim-extra-latency-ms": "3000" if tenant == "a" else "0"},
                        json={"model": "chat-model", "max_tokens": 8,
                              "messages": [{"role": "user", "content": "hello there"}]})
                    assert r.status_code == 200, r.text
                    with lock:
                        done.append(tenant)

                flood = [threading.Thread(target=send, args=("a",)) for _ in range(2)]
                for t in flood:
                    t.start()
                _until(lambda gw=gw: _queued(gw) == 1, "A's second never queued")
                for _ in range(3 if headroom else 1):
                    send("b")
                with lock:
                    order = list(done)
                for t in flood:
                    t.join()
                if headroom:
                    assert order == ["b", "b", "b"], order
                else:  # after A's first (and its second, tied with B at the start)
                    assert order[0] == "a" and order[-1] == "b", order
                r = httpx.post(gw.url + "/admin/stats",
                               headers={"Authorization": f"Bearer {ADMIN}"})
                assert r.json()["pools"]["chat"]["in_flight"] == 0
                # read from the pool once a second
                _until(lambda gw=gw, n=3 * headroom: _headroom_started(gw) == n,
                       "headroom dispatches never counted")
