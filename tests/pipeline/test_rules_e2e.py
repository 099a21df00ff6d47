"""Rules of one request through real gateway processes: whose id it is, the order of admission
and shadowing, the class header, the model name in the answer, and bounded counting work."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.echo_backend import EchoBackend
from tests.helpers import TEST_KEY, GatewayProcess, policy, wait_usage_records

pytestmark = pytest.mark.process

ADMIN = "admin-rules-test"
AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
OTHER_KEY = "sk-gw-rules-other-tenant-0123456789abcdef0123456789"


def _policy(sim_url: str, limits: dict[str, int]) -> dict[str, Any]:
    import hashlib

    data = policy({"chat": [sim_url]})
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["auth"]["keys"].append({"id": "other", "tenant": "globex",
                                 "sha256": hashlib.sha256(OTHER_KEY.encode()).hexdigest()})
    data["plans"] = [{"name": "p", "limits": limits}]
    data["tenants"] = [{"name": "acme", "plan": "p"}, {"name": "globex", "plan": "p"}]
    return data


def _chat(url: str, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
    body = {"model": "chat-model", "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}], **kw}
    return httpx.post(url + "/v1/chat/completions", json=body,
                      headers={**AUTH, **(headers or {})}, timeout=60)


def _records(gw: GatewayProcess, n: int) -> list[dict[str, Any]]:
    """The ledger's records, once at least ``n`` have landed (or after a generous wait)."""
    return wait_usage_records(gw.url, ADMIN, lambda records: len(records) >= n, within=15)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    if request.param == "redis":
        request.getfixturevalue("gateway_redis")
    return str(request.param)


def test_shared_client_id_is_admitted_per_request(store: str, tmp_path: Path) -> None:
    """10 concurrent requests sharing one X-Request-Id on concurrency 1 / rpm 3: each is its own
    admission (at most 3 pass), and every admitted one leaves its own record."""
    with SimServer("interactive", speedup=2, jitter=0.0) as sim, \
            GatewayProcess(tmp_path, _policy(sim.url, {"concurrency": 1, "rpm": 3})) as gw:
        codes: list[int] = []
        ids: list[str] = []
        lock = threading.Lock()

        def client() -> None:
            r = _chat(gw.url, {"X-Request-Id": "same-id"}, max_tokens=20)
            with lock:
                codes.append(r.status_code)
                ids.append(r.headers["x-request-id"])

        threads = [threading.Thread(target=client) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        admitted = codes.count(200)
        assert 1 <= admitted <= 3, codes
        assert codes.count(429) == 10 - admitted
        assert len(set(ids)) == 10 and "same-id" not in ids
        records = _records(gw, admitted)
        assert len(records) == admitted
        assert len({r["request_id"] for r in records}) == admitted


def test_shared_client_id_is_billed_per_request(store: str, tmp_path: Path) -> None:
    """5 requests sharing one id leave 5 records; another tenant's same id does not hide them."""
    with SimServer("interactive", speedup=20, jitter=0.0) as sim, \
            GatewayProcess(tmp_path, _policy(sim.url, {"rpm": 10000})) as gw:
        for _ in range(5):
            assert _chat(gw.url, {"X-Request-Id": "shared"}).status_code == 200
        r = _chat(gw.url, {"X-Request-Id": "shared", "Authorization": f"Bearer {OTHER_KEY}"})
        assert r.status_code == 200
        records = _records(gw, 6)
        assert len(records) == 6
        assert sorted(r["tenant"] for r in records) == ["acme"] * 5 + ["globex"]
        assert len({r["request_id"] for r in records}) == 6


def test_refused_request_is_not_shadowed(tmp_path: Path) -> None:
    """Admission comes before shadowing: a 429 never reaches the shadow pool."""
    with SimServer("interactive", speedup=20, jitter=0.0) as sim, EchoBackend() as shadow:
        data = _policy(sim.url, {"rpm": 1})
        data["pools"].append({"name": "shadow", "class": "interactive",
                              "backends": [{"name": "echo", "url": shadow.url}]})
        data["models"][0]["shadow"] = {"pool": "shadow", "share": 1.0}
        with GatewayProcess(tmp_path, data) as gw:
            assert _chat(gw.url).status_code == 200
            deadline = time.monotonic() + 10
            while not shadow.requests and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(shadow.requests) == 1  # the admitted request was mirrored
            for _ in range(3):
                assert _chat(gw.url).status_code == 429
            time.sleep(0.5)  # a mirrored request would have arrived by now
            assert len(shadow.requests) == 1


def test_unknown_class_header_is_400_naming_the_classes(tmp_path: Path) -> None:
    with SimServer("interactive", speedup=20) as sim, \
            GatewayProcess(tmp_path, policy({"chat": [sim.url]})) as gw:
        r = _chat(gw.url, {"X-Request-Class": "bulk"})
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["param"] == "x-request-class"
        assert "batch" in error["message"] and "interactive" in error["message"]
        assert _chat(gw.url, {"X-Request-Class": "interactive"}).status_code == 200


def test_stream_and_body_carry_the_public_model_name(tmp_path: Path) -> None:
    """The simulator answers as 'sim-model'; every chunk and body says 'chat-model'."""
    with SimServer("interactive", speedup=20) as sim, \
            GatewayProcess(tmp_path, policy({"chat": [sim.url]})) as gw:
        r = _chat(gw.url, max_tokens=12)
        assert r.json()["model"] == "chat-model"
        with httpx.stream("POST", gw.url + "/v1/chat/completions", headers=AUTH, timeout=30,
                          json={"model": "chat-model", "max_tokens": 12, "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]}) as s:
            text = s.read().decode()
        events = [json.loads(line[6:]) for line in text.splitlines()
                  if line.startswith("data: {")]
        assert len(events) >= 3
        assert {e["model"] for e in events} == {"chat-model"}
        assert "sim-model" not in text


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_key_at_its_limit_is_refused_before_counting(tmp_path: Path) -> None:
    """A 4 MiB prompt without spaces (seconds of tokenizer work) from a key already at its rpm
    limit is refused without being counted: the gateway spends a small fraction of the work."""
    huge = "a" * (4 << 20)
    with SimServer("interactive", speedup=20) as sim, \
            GatewayProcess(tmp_path, _policy(sim.url, {"rpm": 1})) as gw:
        assert _chat(gw.url).status_code == 200
        assert gw.proc is not None
        before = _cpu_seconds(gw.proc.pid)
        r = httpx.post(gw.url + "/v1/chat/completions", headers=AUTH, timeout=120,
                       json={"model": "chat-model", "max_tokens": 3,
                             "messages": [{"role": "user", "content": huge}]})
        spent = _cpu_seconds(gw.proc.pid) - before
        assert r.status_code == 429, r.text
        # counting this prompt costs ~2-4 s of CPU here; reading and parsing it ~0.05 s
        assert spent < 1.0, spent


def test_large_prompt_is_counted_off_the_loop(tmp_path: Path) -> None:
    """An admitted large prompt (reserved on its byte bound, counted on the counting thread
    after the response) leaves one record whose split matches the backend's prompt tokens."""
    huge = "a" * (1 << 20)
    with SimServer("interactive", speedup=50) as sim:
        data = _policy(sim.url, {"rpm": 10000, "tpm": 100_000_000})
        os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
        try:
            with GatewayProcess(tmp_path, data) as gw:
                r = httpx.post(gw.url + "/v1/chat/completions", headers=AUTH, timeout=120,
                               json={"model": "chat-model", "max_tokens": 3,
                                     "messages": [{"role": "user", "content": huge}]})
                assert r.status_code == 200, r.text
                reported = r.json()["usage"]["prompt_tokens"]
                records = _records(gw, 1)
                assert len(records) == 1
                record = records[0]
                assert record["request_id"] == r.headers["x-request-id"]
                assert record["prompt_total"] == reported
                assert record["system"] + record["history"] + record["new"] == reported
                assert not record["estimated"]
        finally:
            os.environ.pop("GATEWAY_ADMIN_TOKEN", None)


def test_ratelimit_headers_from_the_tightest_scope(store: str, tmp_path: Path) -> None:
    """x-ratelimit-* on 200s and 429s: the key's rpm 2 is tighter than the plan's rpm 5; the
    plan's tpm is the only token limit."""
    with SimServer("interactive", speedup=20, jitter=0.0) as sim:
        data = _policy(sim.url, {"rpm": 5, "tpm": 100_000})
        data["auth"]["keys"][0]["limits"] = {"rpm": 2}
        with GatewayProcess(tmp_path, data) as gw:
            first, second, third = (_chat(gw.url) for _ in range(3))
            assert (first.status_code, second.status_code, third.status_code) == (200, 200, 429)
            for r in (first, second, third):
                assert r.headers["x-ratelimit-limit-requests"] == "2"
                assert r.headers["x-ratelimit-limit-tokens"] == "100000"
            assert first.headers["x-ratelimit-remaining-requests"] == "1"
            assert second.headers["x-ratelimit-remaining-requests"] == "0"
            assert third.headers["x-ratelimit-remaining-requests"] == "0"
            assert third.headers["x-ratelimit-reset-requests"] not in ("", "0s")
            tokens = [int(r.headers["x-ratelimit-remaining-tokens"]) for r in (first, second)]
            assert 100_000 > tokens[0] > tokens[1] > 0
            # a plan without rpm or tpm sends none
        data = _policy(sim.url, {"concurrency": 10})
        with GatewayProcess(tmp_path, data) as gw:
            r = _chat(gw.url)
            assert r.status_code == 200
            assert not [h for h in r.headers if h.startswith("x-ratelimit")]
