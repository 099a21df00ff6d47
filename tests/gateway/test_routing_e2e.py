"""Routing through real HTTP against simulator backends with fault injection."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, SimProcess, policy, sim_processes
from tests.ports import free_port

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
ADMIN = "admin-test-token"


def _chat(gw: GatewayProcess, model: str = "chat-model", headers: dict[str, str] | None = None,
          **body: Any) -> httpx.Response:
    payload = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
               **body}
    return httpx.post(gw.url + "/v1/chat/completions", json=payload,
                      headers={**AUTH, **(headers or {})}, timeout=20)


@contextmanager
def _sims(n: int, *args: str) -> Iterator[list[SimProcess]]:
    with sim_processes(n, "interactive", "--speedup", "5", "--jitter", "0", *args) as sims:
        yield sims


def _stats(gw: GatewayProcess) -> dict[str, Any]:
    r = httpx.post(gw.url + "/admin/stats", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@contextmanager
def _gateway(tmp: Path, data: dict[str, Any]) -> Iterator[GatewayProcess]:
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        with GatewayProcess(tmp, data) as gw:
            yield gw
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)


def test_backend_killed_under_load_no_client_errors(tmp_path: Path) -> None:
    """SIGKILL one of two backends mid-load: every client request still succeeds."""
    with _sims(2) as sims:
        data = policy({"chat": [sim.url for sim in sims]})
        data["pools"][0]["health"] = {"eject_after": 2, "eject_base": 30}
        with _gateway(tmp_path, data) as gw:
            stop = time.monotonic() + 3.0
            statuses: list[tuple[float, int]] = []

            def client() -> None:
                while time.monotonic() < stop:
                    statuses.append((time.monotonic(), _chat(gw, max_tokens=8).status_code))

            with ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(client) for _ in range(8)]
                time.sleep(1.0)
                killed_at = time.monotonic()
                sims[0].signal(signal.SIGKILL)
                for f in futures:
                    f.result()
            codes = [code for _, code in statuses]
            assert sum(1 for t, _ in statuses if t > killed_at + 0.2) >= 10  # load went on
            assert set(codes) == {200}, {s: codes.count(s) for s in set(codes)}
            backends = _stats(gw)["pools"]["chat"]["backends"]
            assert backends["chat-0"]["ejected"] is True
            assert backends["chat-1"]["ejected"] is False


def test_stall_before_first_token_retried_elsewhere(tmp_path: Path) -> None:
    """A backend that stalls before its first token hits the TTFT timeout; another answers."""
    with _sims(1, "--stall-ms", "3000") as stalled, _sims(1) as healthy:
        data = policy({"chat": [stalled[0].url, healthy[0].url]})
        data["server"]["timeouts"] = {"first_token": 0.5}
        data["routing"] = {"retry": {"backoff_base": 0.01}}
        with _gateway(tmp_path, data) as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
            for _ in range(6):
                t0 = time.monotonic()
                text = "".join(
                    c.choices[0].delta.content or ""
                    for c in client.chat.completions.create(
                        model="chat-model", max_tokens=5, stream=True,
                        messages=[{"role": "user", "content": "x"}])
                    if c.choices
                )
                assert len(text.split()) == 5
                assert time.monotonic() - t0 < 2.5


def test_midstream_disconnect_ends_with_error_event_no_retry(tmp_path: Path) -> None:
    """The backend dies after 3 chunks: the client gets those, an SSE error event, a clean
    end, and no second attempt is made."""
    with (
        SimServer("interactive", speedup=5, jitter=0.0) as a,
        SimServer("interactive", speedup=5, jitter=0.0) as b,
        _gateway(tmp_path, policy({"chat": [a.url, b.url]})) as gw,
    ):
        before = a.stats()["completed"] + b.stats()["completed"]
        body = {"model": "chat-model", "stream": True, "max_tokens": 20,
                "messages": [{"role": "user", "content": "x"}]}
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body,
                          headers={**AUTH, "x-sim-disconnect-after": "3"}) as r:
            assert r.status_code == 200
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert '"error"' in lines[-1] and "[DONE]" not in lines[-1]
        assert sum(1 for ln in lines if '"content":"' in ln) >= 3
        time.sleep(0.2)
        assert a.stats()["completed"] + b.stats()["completed"] == before  # no retry ran


def test_ejection_and_return_passive(tmp_path: Path) -> None:
    """Consecutive failures eject the backend; after the back-off a half-open trial that
    succeeds brings it back."""
    with SimServer("interactive", speedup=5) as sim:
        data = policy({"chat": [sim.url]})
        data["pools"][0]["health"] = {"eject_after": 2, "eject_base": 1.0, "panic_threshold": 0}
        data["routing"] = {"retry": {"max_attempts": 1}}
        with _gateway(tmp_path, data) as gw:
            for _ in range(2):
                assert _chat(gw, headers={"x-sim-error-status": "500"}).status_code == 502
            assert _stats(gw)["pools"]["chat"]["backends"]["chat-0"]["ejected"] is True
            r = _chat(gw)
            assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend_available"
            time.sleep(1.1)
            assert _chat(gw).status_code == 200  # the half-open trial
            assert _stats(gw)["pools"]["chat"]["backends"]["chat-0"]["ejected"] is False


def test_ejection_and_return_active(tmp_path: Path) -> None:
    """Active checks eject a backend that went away and bring it back when it returns."""
    port = free_port()
    sim = SimServer("interactive", speedup=5, port=port).start()
    data = policy({"chat": [sim.url]})
    data["pools"][0]["health"] = {"path": "/health", "interval": 0.1, "timeout": 0.5,
                                  "eject_after": 2, "eject_base": 0.2, "panic_threshold": 0}
    with _gateway(tmp_path, data) as gw:
        try:
            sim.stop()
            deadline = time.monotonic() + 5
            while not _stats(gw)["pools"]["chat"]["backends"]["chat-0"]["ejected"]:
                assert time.monotonic() < deadline, "never ejected"
                time.sleep(0.05)
            sim = SimServer("interactive", speedup=5, port=port).start()
            deadline = time.monotonic() + 5
            while _stats(gw)["pools"]["chat"]["backends"]["chat-0"]["ejected"]:
                assert time.monotonic() < deadline, "never came back"
                time.sleep(0.05)
            assert _chat(gw).status_code == 200
        finally:
            sim.stop()


def test_retry_budget_caps_retries(tmp_path: Path) -> None:
    """Against a pool that fails every request, retries stay within the budget."""
    with _sims(2, "--error-status", "503") as sims:
        data = policy({"chat": [sim.url for sim in sims]})
        data["pools"][0]["health"] = {"eject_after": 1000}
        data["routing"] = {"retry": {"max_attempts": 3, "budget_ratio": 0.2,
                                     "budget_min_per_s": 0.0, "budget_window": 30,
                                     "backoff_base": 0.001}}
        with _gateway(tmp_path, data) as gw:
            statuses = [_chat(gw).status_code for _ in range(50)]
            assert set(statuses) == {502}
            retries = _stats(gw)["retries_in_window"]
            assert retries <= 0.2 * 50 + 1
            assert retries >= 5  # the budget was used, not zero


def test_live_weight_change_under_load(tmp_path: Path) -> None:
    """Reloading new weights under load fails no request and moves traffic."""
    with SimServer("interactive", speedup=5) as a, SimServer("interactive", speedup=5) as b:
        data = policy({"chat": [a.url], "canary": [b.url]}, watch_interval=0)
        data["models"][0]["versions"] = [
            {"backend_model": "v1", "weight": 100, "pool": "chat"},
            {"backend_model": "v2", "weight": 0, "pool": "canary"},
        ]
        with _gateway(tmp_path, data) as gw:
            stop = threading.Event()
            statuses: list[int] = []

            def client() -> None:
                while not stop.is_set():
                    r = _chat(gw, stream=True)
                    statuses.append(r.status_code)

            threads = [threading.Thread(target=client) for _ in range(6)]
            for t in threads:
                t.start()
            time.sleep(0.5)
            served_b_before = b.stats()["completed"]
            data["models"][0]["versions"][0]["weight"] = 0
            data["models"][0]["versions"][1]["weight"] = 100
            gw.config.write_text(yaml.safe_dump(data))
            r = httpx.post(gw.url + "/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status_code == 200 and r.json()["reloaded"] is True
            time.sleep(0.5)
            served_a_mid = a.stats()["completed"]
            time.sleep(0.5)
            stop.set()
            for t in threads:
                t.join()
            assert statuses and set(statuses) == {200}
            assert served_b_before == 0 and b.stats()["completed"] > 0
            assert a.stats()["completed"] - served_a_mid <= 6  # only requests already in flight
            # an invalid reload keeps the old policy
            gw.config.write_text("pools: [oops")
            r = httpx.post(gw.url + "/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status_code == 422 and "invalid YAML" in r.json()["error"]
            assert _chat(gw).status_code == 200
            # SIGHUP reloads too
            gw.config.write_text(yaml.safe_dump(data))
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGHUP)
            time.sleep(0.3)
            assert _stats(gw)["reloads"] == 2


def test_shadow_never_changes_primary(tmp_path: Path) -> None:
    """Every request is mirrored to a failing shadow pool; the primary answers unchanged."""
    with SimServer("interactive", speedup=5, jitter=0.0) as primary, \
            SimServer("interactive", speedup=5, jitter=0.0, error_status=500) as shadow:
        data = policy({"chat": [primary.url], "shadow": [shadow.url]})
        data["models"][0]["shadow"] = {"pool": "shadow", "share": 1.0}
        direct = openai.OpenAI(base_url=primary.url + "/v1", api_key="x")
        expected = direct.chat.completions.create(
            model="sim-model", max_tokens=6, messages=[{"role": "user", "content": "same"}]
        ).choices[0].message.content
        with _gateway(tmp_path, data) as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
            for _ in range(5):
                reply = client.chat.completions.create(
                    model="chat-model", max_tokens=6, messages=[{"role": "user", "content": "same"}]
                )
                assert reply.choices[0].message.content == expected
            time.sleep(0.3)
            shadow_stats = _stats(gw)["shadow"]
            assert shadow_stats["started"] == 5
            assert shadow_stats["by_status"] == {"500": 5}


def test_class_headers_and_batch_pool(tmp_path: Path) -> None:
    """The class decides the pool; the response says which class and pool were chosen."""
    with SimServer("interactive", speedup=5) as i, SimServer("batch", speedup=5) as b:
        data = policy({"chat": [i.url], "batch": [b.url]})
        data["models"] = [{"name": "m", "pool": "chat", "pools": {"batch": "batch"}}]
        data["auth"]["keys"][0]["allow_class_header"] = True
        data["routing"] = {"rules": [{"class": "batch", "min_max_tokens": 1000}]}
        with _gateway(tmp_path, data) as gw:
            r = _chat(gw, model="m")
            assert (r.headers["x-gateway-class"], r.headers["x-gateway-pool"]) == (
                "interactive", "chat")
            r = _chat(gw, model="m", headers={"X-Request-Class": "batch"})
            assert (r.headers["x-gateway-class"], r.headers["x-gateway-pool"]) == ("batch", "batch")
            r = _chat(gw, model="m", max_tokens=1000)
            assert r.headers["x-gateway-class"] == "batch"


def test_fallback_pool_takes_over(tmp_path: Path) -> None:
    """Every backend of the primary pool fails: the request is retried on its fallback pool."""
    with SimServer("interactive", speedup=5, error_status=503) as bad, \
            SimServer("interactive", speedup=5) as good:
        data = policy({"chat": [bad.url], "spare": [good.url]})
        data["pools"][0]["fallback"] = "spare"
        data["routing"] = {"retry": {"backoff_base": 0.001}}
        with _gateway(tmp_path, data) as gw:
            r = _chat(gw)
            assert r.status_code == 200, r.text
            assert r.headers["x-gateway-pool"] == "spare"


def test_policy_file_watch_reload(tmp_path: Path) -> None:
    """Editing the policy file reloads it (no signal, no admin call); a broken edit keeps the
    old policy."""
    with SimServer("interactive", speedup=5) as sim:
        data = policy({"chat": [sim.url]}, watch_interval=0.1)
        with _gateway(tmp_path, data) as gw:
            assert _chat(gw, model="renamed").status_code == 404
            data["models"][0]["name"] = "renamed"
            gw.config.write_text(yaml.safe_dump(data))
            deadline = time.monotonic() + 5
            while _chat(gw, model="renamed").status_code != 200:
                assert time.monotonic() < deadline, "file change not picked up"
                time.sleep(0.1)
            gw.config.write_text("models: [broken")
            deadline = time.monotonic() + 5  # a loaded machine may take a while to notice
            while "rejected, keeping the old policy" not in gw.output():
                assert time.monotonic() < deadline, "broken edit not reported"
                time.sleep(0.1)
            assert _chat(gw, model="renamed").status_code == 200
