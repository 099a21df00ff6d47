"""What a gateway does with hostile backend answers: Retry-After values, and error bodies that
echo the backend's own API key. A real ``gateway serve`` in front of a scripted backend."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from gateway.config.model import Backend
from gateway.routing.backend import BackendState
from gateway.upstream.forward import parse_retry_after
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.process_marker import starts_process

PATIENCE = 30.0
BACKEND_KEY = "sk-backend-0123456789abcdefSECRET"
CHAT = {"model": "chat-model", "messages": [{"role": "user", "content": "hi"}]}


class Scripted(BaseHTTPRequestHandler):
    """Answers with whatever ``Scripted.answer`` says: (status, extra headers, body or None to
    echo the request's headers as JSON)."""

    protocol_version = "HTTP/1.1"
    answer: tuple[int, dict[str, str], bytes | None] = (200, {}, None)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        status, headers, body = Scripted.answer
        if body is None:
            echo = {"error": {"message": "echo", "headers": dict(self.headers)}}
            body = json.dumps(echo).encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


OK = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "sim-model",
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": "ok"}}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                           "total_tokens": 2}}).encode()


@pytest.fixture(scope="module")
@starts_process
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    backend = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    data = policy({"chat": [f"http://127.0.0.1:{backend.server_port}"]})
    data["pools"][0]["backends"][0]["api_key_env"] = "H2_TEST_BACKEND_KEY"
    data["routing"] = {"retry": {"max_attempts": 1, "retry_after_max": 2}}
    tmp: Path = tmp_path_factory.mktemp("forward")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("H2_TEST_BACKEND_KEY", BACKEND_KEY)
        gw = GatewayProcess(tmp, data).start()
    try:
        yield gw
    finally:
        gw.stop()
        backend.shutdown()


def chat(gw: GatewayProcess) -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=PATIENCE,
                      headers={"authorization": f"Bearer {TEST_KEY}"})


def served_again(gw: GatewayProcess) -> list[int]:
    """Statuses until the backend serves again (it must, within PATIENCE); never a 500."""
    Scripted.answer = (200, {}, OK)
    seen: list[int] = []
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        status = chat(gw).status_code
        seen.append(status)
        assert status < 500 or status in (502, 503), seen
        if status == 200:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"never served again: {seen}")


@pytest.mark.parametrize("value", ["inf", "nan", "-5", "1e12", "garbage", "99999999999999",
                                   "Fri, 31 Dec 9999 23:59:59 GMT"])
def test_hostile_retry_after_neither_breaks_nor_sidelines(
    gateway: GatewayProcess, value: str
) -> None:
    """``Retry-After: inf`` made that request 500 and every later one too; ``1e12`` sidelined
    the backend for ~31,700 years. Now: a 429 with a finite hint, and the backend is back
    within ``retry_after_max`` (2 s here)."""
    Scripted.answer = (429, {"retry-after": value}, b'{"error": {"message": "slow down"}}')
    first = chat(gateway)
    assert first.status_code == 429
    hint = first.headers.get("retry-after")
    assert hint is None or 1 <= int(hint) <= 2
    served_again(gateway)


def test_5xx_body_is_not_copied_into_the_502(gateway: GatewayProcess) -> None:
    """A 500 that echoes the request's headers (the backend's key among them): the 502 names
    the backend and its status, and carries no byte of the body."""
    Scripted.answer = (501, {}, None)
    r = chat(gateway)
    assert r.status_code == 502
    assert "chat-0" in r.json()["error"]["message"]
    assert BACKEND_KEY not in r.text and "echo" not in r.text
    assert BACKEND_KEY not in gateway.output()  # the log has the excerpt, redacted


def test_4xx_body_is_relayed_without_the_backend_key(gateway: GatewayProcess) -> None:
    """A 400 is relayed (it tells the client what was wrong), minus the backend's key."""
    Scripted.answer = (400, {}, None)
    r = chat(gateway)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "echo"
    assert BACKEND_KEY not in r.text
    assert "[REDACTED]" in r.text


@pytest.mark.parametrize(("value", "seconds"), [
    pytest.param(b"5", 5.0, id="delta"),
    pytest.param(b" 7 ", 7.0, id="spaces"),
    pytest.param(b"0", 0.0, id="zero"),
    pytest.param(b"inf", None, id="inf"),
    pytest.param(b"nan", None, id="nan"),
    pytest.param(b"-1", None, id="negative"),
    pytest.param(b"1e12", None, id="exponent"),
    pytest.param(b"1.5", None, id="fraction"),
    pytest.param(b"soon", None, id="garbage"),
    pytest.param(b"", None, id="empty"),
    pytest.param(b"\xff\xfe", None, id="bytes"),
    pytest.param(b"Wed, 21 Oct 2015 07:28:00 GMT", 0.0, id="past-date"),
    pytest.param(b"Wed, 21 Oct 2015 07:28:30 GMT", 30.0, id="date"),
])
def test_parse_retry_after(value: bytes, seconds: float | None) -> None:
    """RFC 9110: delta-seconds (digits only) or an HTTP-date; anything else is no value."""
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert parse_retry_after(value, now) == seconds


def test_backend_wait_is_capped_and_ignores_nonsense() -> None:
    """``on_retry_after`` clamps too: it is where the wait is spent."""
    state = BackendState(Backend(name="b", url="http://127.0.0.1:9"), "b")
    state.on_retry_after(float("inf"), 100.0, cap=60.0)
    assert state.not_before == 160.0
    state.on_retry_after(float("nan"), 200.0, cap=60.0)
    state.on_retry_after(-3.0, 200.0, cap=60.0)
    assert state.not_before == 160.0
    state.on_retry_after(1e12, 0.0)
    assert state.not_before == 60.0
