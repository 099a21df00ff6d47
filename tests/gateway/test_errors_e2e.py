"""Every error case answers OpenAI-shaped JSON with the right status, never a traceback."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.ports import free_port

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
CHAT = {"model": "chat-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _error(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers.get("x-request-id")
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in r.text
    return body["error"]  # type: ignore[no-any-return]


def _post(
    gw: GatewayProcess,
    content: bytes | None = None,
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
    **kw: object,
) -> httpx.Response:
    h = {**AUTH, "Content-Type": "application/json", **(headers or {})}
    if content is None:
        content = json.dumps(kw.get("body", CHAT)).encode()
    return httpx.post(gw.url + path, content=content, headers=h, timeout=10)


@pytest.mark.parametrize(
    ("content", "param", "needle"),
    [
        pytest.param(b"{not json", None, "not valid JSON", id="invalid-json"),
        pytest.param(b"", None, "empty", id="empty-body"),
        pytest.param(b"[1,2]", None, "JSON object", id="not-an-object"),
        pytest.param(b'{"messages": []}', "model", "'model' is a required", id="missing-model"),
        pytest.param(b'{"model": 5, "messages": []}', "model", "must be a string", id="model-type"),
        pytest.param(
            b'{"model": "chat-model"}',
            "messages",
            "'messages' is a required",
            id="missing-messages",
        ),
        pytest.param(
            b'{"model": "chat-model", "messages": "hi"}',
            "messages",
            "must be an array",
            id="messages-type",
        ),
        pytest.param(
            b'{"model": "chat-model", "messages": [{"content": "x"}]}',
            "messages[0].role",
            "role",
            id="missing-role",
        ),
        pytest.param(
            b'{"model": "chat-model", "messages": [{"role": "user"}], "stream": "yes"}',
            "stream",
            "boolean",
            id="stream-type",
        ),
        pytest.param(
            b'{"model": "chat-model", "messages": [{"role": "user"}], "max_tokens": -1}',
            "max_tokens",
            "positive integer",
            id="max-tokens",
        ),
    ],
)
def test_bad_request_400(
    gateway: GatewayProcess, content: bytes, param: str | None, needle: str
) -> None:
    """Invalid JSON, wrong types and missing fields are 400 and name the field."""
    err = _error(_post(gateway, content), 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert needle in str(err["message"])


def test_completions_and_embeddings_required_fields(gateway: GatewayProcess) -> None:
    """Each endpoint checks its own input field."""
    err = _error(_post(gateway, b'{"model": "chat-model"}', "/v1/completions"), 400)
    assert err["param"] == "prompt"
    err = _error(_post(gateway, b'{"model": "chat-model", "input": 3}', "/v1/embeddings"), 400)
    assert err["param"] == "input"
    err = _error(
        _post(gateway, b'{"model": "chat-model", "input": "x", "stream": true}', "/v1/embeddings"),
        400,
    )
    assert err["param"] == "stream"


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"Authorization": ""}, id="missing"),
        pytest.param({"Authorization": "Basic abc"}, id="malformed"),
        pytest.param({"Authorization": "Bearer sk-gw-unknown"}, id="unknown"),
    ],
)
def test_bad_key_401(gateway: GatewayProcess, headers: dict[str, str]) -> None:
    """Missing, malformed and unknown keys all get the same 401 invalid_api_key."""
    err = _error(_post(gateway, headers=headers), 401)
    assert err["code"] == "invalid_api_key"
    assert err["message"] == "Invalid API key. Pass a valid key as 'Authorization: Bearer <key>'."


def test_unknown_model_404(gateway: GatewayProcess) -> None:
    err = _error(_post(gateway, body={**CHAT, "model": "gpt-nope"}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"


def test_unknown_route_404_and_method_405(gateway: GatewayProcess) -> None:
    err = _error(httpx.get(gateway.url + "/v1/nothing", headers=AUTH), 404)
    assert err["code"] == "unknown_url"
    r = httpx.get(gateway.url + "/v1/chat/completions", headers=AUTH)
    err = _error(r, 405)
    assert r.headers["allow"] == "POST"
    _error(httpx.delete(gateway.url + "/v1/models", headers=AUTH), 405)
    _error(httpx.post(gateway.url + "/healthz"), 405)


def test_body_over_limit_413(gateway: GatewayProcess) -> None:
    """The fixture's limit is 64 KiB: a larger body is refused without being read whole."""
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 70_000}]}
    err = _error(_post(gateway, body=big), 413)
    assert "limit" in str(err["message"])

    # chunked upload (no Content-Length) is bounded too
    def gen():  # type: ignore[no-untyped-def]
        yield json.dumps(big).encode()

    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=gen(),
        headers={**AUTH, "Content-Type": "application/json"},
        timeout=10,
    )
    _error(r, 413)


def test_backend_failure_502(gateway: GatewayProcess) -> None:
    err = _error(_post(gateway, headers={"x-sim-error-status": "500"}), 502)
    assert err["code"] == "backend_error"
    assert "500" in str(err["message"])


def test_backend_rate_limit_relayed(gateway: GatewayProcess) -> None:
    """A backend's 429 and its Retry-After reach the client."""
    r = _post(gateway, headers={"x-sim-retry-after": "1"})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    # the backend asked for a second: until then the gateway answers 429 itself, at once
    t0 = time.monotonic()
    r = _post(gateway)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert time.monotonic() - t0 < 0.5
    time.sleep(1.1)
    assert _post(gateway).status_code == 200


def test_upstream_timeout_504(gateway: GatewayProcess) -> None:
    """The fixture's first_token timeout is 2 s; the backend waits 4 s before answering."""
    t0 = time.monotonic()
    err = _error(_post(gateway, headers={"x-sim-extra-latency-ms": "4000"}), 504)
    assert err["code"] == "upstream_timeout"
    assert time.monotonic() - t0 < 3.5


def test_backend_unreachable_502(tmp_path: Path) -> None:
    with GatewayProcess(tmp_path, policy({"chat": [f"http://127.0.0.1:{free_port()}"]})) as gw:
        err = _error(_post(gw), 502)
        assert "cannot connect" in str(err["message"])
        assert "127.0.0.1" not in str(err["message"])  # internal addresses stay internal
        assert httpx.get(gw.url + "/readyz").status_code == 503


def test_no_backend_available_503(tmp_path: Path) -> None:
    """max_in_flight 1 held by a long stream: with no queue room the next request gets 503 at
    once; with a queue, one that cannot start before its deadline gets 503 by the deadline."""
    with SimServer("interactive", speedup=1, jitter=0.0) as sim:
        data = policy({"chat": [sim.url]})
        data["pools"][0]["backends"][0]["max_in_flight"] = 1
        data["classes"] = [{"name": "interactive", "start_deadline": 0.5},
                           {"name": "batch", "priority": 10}]
        for queue_size, max_wait in ((0, 0.3), (8, 1.0)):
            data["pools"][0]["queue_size"] = queue_size
            with GatewayProcess(tmp_path, data) as gw:
                opened = threading.Event()

                def hold(url: str = gw.url, opened: threading.Event = opened) -> None:
                    body = {**CHAT, "max_tokens": 400, "stream": True}
                    with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                                      headers=AUTH, timeout=20) as r:
                        for _ in r.iter_raw():
                            opened.set()

                t = threading.Thread(target=hold)
                t.start()
                assert opened.wait(5)
                t0 = time.monotonic()
                r = _post(gw)
                err = _error(r, 503)
                assert time.monotonic() - t0 < max_wait
                assert err["code"] == "no_backend_available"
                assert int(r.headers["retry-after"]) >= 1
                t.join(20)
