"""The pool queue's per-tenant bound end to end: a real gateway process in front of the
simulator, two tenants with their own keys, one backend slot and a queue of 4. Tenant A keeps
the slot busy and the queue full (its refused requests come back); every request of tenant B
succeeds meanwhile. Before, B was refused 503 "queue is full" while A's flood filled it."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.helpers import GatewayProcess, policy

pytestmark = pytest.mark.process

KEYS = {"a": "sk-gw-qshare-a-0123456789abcdef0123456789abcdef",
        "b": "sk-gw-qshare-b-0123456789abcdef0123456789abcdef"}
ADMIN = "admin-queue-share-test"
QUEUE = 4
FLOOD = 8  # A's clients: 1 in flight, QUEUE waiting, the rest refused and trying again


def _policy(sim_url: str) -> dict[str, Any]:
    data = policy({"chat": [sim_url]}, drain_timeout=1)
    pool = data["pools"][0]
    pool["backends"][0]["max_in_flight"] = 1
    pool["queue_size"] = QUEUE
    pool["fair_headroom"] = 2  # the default, stated: B below its share may start beside A
    data["auth"] = {"keys": [
        {"id": f"key-{t}", "sha256": hashlib.sha256(k.encode()).hexdigest(), "tenant": t}
        for t, k in KEYS.items()]}
    data["plans"] = [{"name": "basic", "weight": 1}]
    data["tenants"] = [{"name": "a", "plan": "basic"}, {"name": "b", "plan": "basic"}]
    # a long start deadline: nobody here is refused for the (cold) completion-rate estimate
    data["classes"] = [{"name": "interactive", "priority": 0, "start_deadline": 120},
                       {"name": "batch", "priority": 10, "start_deadline": 600}]
    return data


def _post(gw: GatewayProcess, tenant: str, latency_ms: int) -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions", timeout=60,
                      headers={"Authorization": f"Bearer {KEYS[tenant]}",
                               "x-sim-extra-latency-ms": str(latency_ms)},
                      json={"model": "chat-model", "max_tokens": 8,
                            "messages": [{"role": "user", "content": "hello there"}]})


def _queued(gw: GatewayProcess) -> int:
    r = httpx.post(gw.url + "/admin/stats", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    return int(r.json()["pools"]["chat"]["queued"])


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_flooding_tenant_is_refused_alone(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A's clients each hold their request 4 s and send again 0.1 s after a refusal, so the
    slot stays A's and the queue full. B sends three rounds of two requests at once (its
    share of the queue): all six are answered 200, the first of each round on a headroom
    slot, the second waiting in the place of one of A's. A is refused meanwhile, for the
    queue's length and for the places B took."""
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    stop = threading.Event()
    refusals: list[str] = []
    lock = threading.Lock()

    with SimServer("interactive", speedup=4, jitter=0) as sim, \
            GatewayProcess(tmp_path, _policy(sim.url)) as gw:

        def flood() -> None:
            while not stop.is_set():
                try:
                    r = _post(gw, "a", 4000)
                except httpx.HTTPError:  # the gateway went away at the end
                    return
                if r.status_code == 503:
                    with lock:
                        refusals.append(r.json()["error"]["message"])
                    time.sleep(0.1)

        threads = [threading.Thread(target=flood, daemon=True) for _ in range(FLOOD)]
        for t in threads:
            t.start()
        _until(lambda: _queued(gw) == QUEUE and len(refusals) >= FLOOD - 1 - QUEUE,
               "A's flood never filled the queue")

        statuses: list[tuple[int, str]] = []
        for _ in range(3):
            _until(lambda: _queued(gw) == QUEUE, "A's flood stopped filling the queue")
            answers: list[httpx.Response] = []

            def ask(answers: list[httpx.Response] = answers) -> None:
                answers.append(_post(gw, "b", 300))

            pair = [threading.Thread(target=ask) for _ in range(2)]
            for t in pair:
                t.start()
            for t in pair:
                t.join(60)
            statuses += [(r.status_code, r.text) for r in answers]
        stop.set()
        assert [s for s, _ in statuses] == [200] * 6, statuses
        with lock:
            seen = list(refusals)
        assert all("queue is full" in m for m in seen), seen
        assert any("place went to another tenant's" in m for m in seen), seen
    for t in threads:
        t.join(30)
