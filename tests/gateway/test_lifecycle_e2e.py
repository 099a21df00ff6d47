"""Client disconnects, graceful shutdown and readiness, through real processes and sockets."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}


def _wait(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_client_disconnect_frees_backend_slot(gateway: GatewayProcess, sim: SimServer) -> None:
    """Closing a stream mid-way cancels the upstream request: the simulator's slot is freed."""
    before = sim.stats()["cancelled"]
    body = {
        "model": "chat-model",
        "stream": True,
        "max_tokens": 4000,
        "messages": [{"role": "user", "content": "long story"}],
    }
    with httpx.stream(
        "POST", gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=10
    ) as r:
        assert r.status_code == 200
        for seen, _ in enumerate(r.iter_raw(), 1):
            if seen >= 3:
                break
        assert sim.stats()["running"] >= 1
    # the stream had thousands of tokens left; the backend must see the cancel at once
    assert _wait(lambda: sim.stats()["running"] == 0, 3.0), sim.stats()
    assert sim.stats()["cancelled"] == before + 1


def test_client_disconnect_while_waiting_for_backend(
    gateway: GatewayProcess, sim: SimServer
) -> None:
    """A client that leaves before any byte came back also cancels the upstream request."""
    before = sim.stats()["cancelled"]
    # non-streaming, ~4 s of generation: nothing reaches the client before it gives up
    body = {
        "model": "chat-model",
        "max_tokens": 3000,
        "messages": [{"role": "user", "content": "slow"}],
    }
    with contextlib.suppress(httpx.TimeoutException):
        httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=0.5)
    assert _wait(lambda: sim.stats()["cancelled"] == before + 1, 3.0), sim.stats()
    assert sim.stats()["running"] == 0


def test_sigterm_drains_inflight_stream(tmp_path: Path) -> None:
    """SIGTERM: readiness goes off, new connections are refused, the open stream completes."""
    with SimServer("interactive", speedup=1, jitter=0.0) as sim:
        gw = GatewayProcess(tmp_path, policy({"chat": [sim.url]})).start()
        try:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
            stream = client.chat.completions.create(
                model="chat-model",
                max_tokens=150,
                stream=True,
                messages=[{"role": "user", "content": "drain me"}],
            )
            tokens = 0
            it = iter(stream)
            for chunk in it:  # wait for the first token, then stop the server
                if chunk.choices and chunk.choices[0].delta.content:
                    tokens += 1
                    break
            gw.sigterm()
            time.sleep(0.3)
            refused = False
            try:
                httpx.get(gw.url + "/healthz", timeout=1)
            except httpx.ConnectError:
                refused = True
            finish = None
            for chunk in it:
                if chunk.choices and chunk.choices[0].delta.content:
                    tokens += 1
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            assert tokens == 150 and finish == "length"
            assert refused
            assert gw.proc is not None
            assert gw.proc.wait(timeout=10) == 0
        finally:
            gw.stop()


def test_readiness_follows_backends(tmp_path: Path) -> None:
    """/readyz is 200 while every pool has a reachable backend, 503 once one pool has none."""
    with SimServer("interactive", speedup=5) as a:
        b = SimServer("batch", speedup=5).start()
        data = policy({"chat": [a.url], "batch": [b.url]}, ready_check_interval=0.1)
        with GatewayProcess(tmp_path, data) as gw:
            r = httpx.get(gw.url + "/readyz")
            assert r.status_code == 200 and r.json()["pools"] == {"chat": True, "batch": True}
            b.stop()
            time.sleep(0.2)
            r = httpx.get(gw.url + "/readyz")
            assert r.status_code == 503 and r.json()["pools"]["batch"] is False
            assert httpx.get(gw.url + "/healthz").status_code == 200


def test_concurrent_streams_all_complete(gateway: GatewayProcess) -> None:
    """Many concurrent streams through one worker each get every token, in order."""
    errors: list[BaseException] = []
    counts: list[int] = []

    def one(i: int) -> None:
        try:
            client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TEST_KEY, max_retries=0)
            n = sum(
                1
                for c in client.chat.completions.create(
                    model="chat-model",
                    max_tokens=30,
                    stream=True,
                    messages=[{"role": "user", "content": f"user {i}"}],
                )
                for ch in c.choices
                if ch.delta.content
            )
            counts.append(n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert counts == [30] * 40
