"""The utility routes work per call off the event loop and under a per-key limit (issue 34,
point 4): ``/v1/messages/count_tokens``, stored-response reads and ``/v1/usage``.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import yaml

from gateway.accounting import PromptCounter
from gateway.api.count_tokens import CountTokensHandler
from gateway.config import load_policy
from gateway.config.model import CallLimits
from gateway.errors import RateLimited
from gateway.quota.calls import CallLimiter
from gateway.runtime import Runtime
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.process_marker import starts_process

OTHER_KEY = "sk-gw-test-other-0123456789abcdef0123456789abcd"


def test_the_bucket_spends_refills_and_names_its_wait() -> None:
    limiter = CallLimiter(CallLimits(rpm=60, burst=3))
    heads = [dict(limiter.take("k", clock=100.0)) for _ in range(3)]
    assert [h[b"x-ratelimit-remaining-requests"] for h in heads] == [b"2", b"1", b"0"]
    assert heads[0][b"x-ratelimit-limit-requests"] == b"3"
    with pytest.raises(RateLimited) as refused:
        limiter.take("k", clock=100.0)
    assert refused.value.headers["retry-after"] == "1"
    assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"
    limiter.take("other", clock=100.0)  # another key has its own bucket
    limiter.take("k", clock=101.0)  # one call per second comes back
    with pytest.raises(RateLimited):
        limiter.take("k", clock=101.2)
    # a reload carries the buckets over: it does not refill them
    again = CallLimiter(CallLimits(rpm=60, burst=3), limiter)
    with pytest.raises(RateLimited):
        again.take("k", clock=101.3)
    assert CallLimiter(CallLimits(rpm=None)).take("k") == []


def test_the_bucket_forgets_full_buckets_first() -> None:
    import gateway.quota.calls as calls

    limiter = CallLimiter(CallLimits(rpm=60, burst=2))
    old = calls._MAX_KEYS
    calls._MAX_KEYS = 4
    try:
        for k in "abcd":
            limiter.take(k, clock=0.0)
        limiter.take("d", clock=0.0)  # d is empty now; a, b, c have one call left
        limiter.take("e", clock=60.0)  # everybody has refilled by then: all forgotten
        assert set(limiter._buckets) == {"e"}
    finally:
        calls._MAX_KEYS = old


class _ThreadNoting(PromptCounter):
    """A real counter that notes the thread it counts on."""

    threads: list[str]

    def count_chat(self, chat: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        return super().count_chat(chat)


def _runtime(tmp: Path, **limits: Any) -> Runtime:
    data = policy({"chat": ["http://127.0.0.1:9"]}, call_limits=limits)
    config = tmp / "policy.yaml"
    config.write_text(yaml.safe_dump(data))
    return Runtime(load_policy(str(config)))


def _call(handler: CountTokensHandler, body: bytes) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/messages/count_tokens",
             "headers": [(b"x-api-key", TEST_KEY.encode()),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 5000)}
    asyncio.run(handler(scope, receive, send))  # type: ignore[arg-type]
    return sent[0]["status"], msgspec.json.decode(sent[-1]["body"])


def test_a_large_count_runs_on_the_counting_thread(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    counter = _ThreadNoting("o200k_base")
    counter.threads = []
    handler = CountTokensHandler(lambda: runtime, lambda _: counter)
    small = {"model": "chat-model", "messages": [{"role": "user", "content": "hello"}]}
    large = {"model": "chat-model", "messages": [{"role": "user", "content": "x" * 200_000}]}
    assert _call(handler, msgspec.json.encode(small))[0] == 200
    status, answer = _call(handler, msgspec.json.encode(large))
    assert status == 200 and answer["input_tokens"] > 1_000
    loop_thread = threading.current_thread().name
    assert counter.threads[0] == loop_thread  # a small body is counted where it is
    assert counter.threads[1] != loop_thread and counter.threads[1].startswith("gateway-count")


@pytest.fixture(scope="module")
@starts_process
def gw(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("calls")
    data = policy({"chat": ["http://127.0.0.1:9"]}, call_limits={"rpm": 1, "burst": 3})
    data["auth"] = {"keys": [
        {"id": "a", "sha256": hashlib.sha256(TEST_KEY.encode()).hexdigest(), "tenant": "a"},
        {"id": "b", "sha256": hashlib.sha256(OTHER_KEY.encode()).hexdigest(), "tenant": "b"}]}
    with GatewayProcess(tmp, data) as process:
        yield process


def _count(gw: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(gw.url + "/v1/messages/count_tokens", headers={"x-api-key": key},
                      json={"model": "chat-model",
                            "messages": [{"role": "user", "content": "hi"}]}, timeout=30)


def test_the_utility_routes_share_one_per_key_limit(gw: GatewayProcess) -> None:
    first = _count(gw, TEST_KEY)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "3"
    auth = {"Authorization": f"Bearer {TEST_KEY}"}
    stored = httpx.get(gw.url + "/v1/responses/resp_nope", headers=auth, timeout=30)
    assert stored.status_code == 404  # counted, then not found
    usage = httpx.get(gw.url + "/v1/usage", headers=auth, timeout=30)
    assert usage.status_code != 429
    # the bucket of three is spent: each route is refused, in its own API's shape
    refused = _count(gw, TEST_KEY)
    assert refused.status_code == 429
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(refused.headers["retry-after"]) >= 1
    for path in ("/v1/responses/resp_nope", "/v1/responses/resp_nope/input_items",
                 "/v1/usage"):
        again = httpx.get(gw.url + path, headers=auth, timeout=30)
        assert again.status_code == 429, path
        assert again.json()["error"]["code"] == "rate_limit_exceeded"
        assert "retry-after" in again.headers
    # another key is not touched by the first key's calls
    assert _count(gw, OTHER_KEY).status_code == 200
    # a bad key is refused as unauthenticated before it can spend anybody's bucket
    assert _count(gw, "sk-gw-wrong-0123456789abcdef0123456789abcdef0").status_code == 401
