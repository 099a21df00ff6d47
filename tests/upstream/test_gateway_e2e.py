"""Points 4 and 10 through a real gateway process and a hostile backend (both clients).

A malformed backend answer must give a 502 whose text names the failure's kind, never the
backend's key or internal URL (aiohttp's exception repr carried both); a chunked non-stream
answer that breaks mid-body must be a 502, not an empty or truncated 200.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

BACKEND_KEY = "sk-backend-topsecret-0123456789abcdef"
CHAT = {"model": "chat-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class _RawBackend:
    """Answers every request with ``answer`` then closes (a thread, plain sockets)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    conn.sendall(self.answer)
                except OSError:
                    pass


@pytest.fixture(params=["native", "aiohttp"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _gateway(tmp: Path, url: str, kind: str) -> Iterator[GatewayProcess]:
    data = policy({"chat": [url]}, upstream_client=kind)
    data["pools"][0]["backends"][0]["api_key_env"] = "TEST_BACKEND_KEY"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEST_BACKEND_KEY", BACKEND_KEY)
        with GatewayProcess(tmp, data) as gw:
            yield gw


def _post(gw: GatewayProcess) -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions", content=json.dumps(CHAT),
                      headers={"Authorization": f"Bearer {TEST_KEY}",
                               "Content-Type": "application/json"}, timeout=30)


def test_malformed_answer_502_names_kind_not_key(tmp_path: Path, kind: str) -> None:
    backend = _RawBackend(b"HTTP/1.1 200 OK\r\nbad header line\r\n\r\n")
    for gw in _gateway(tmp_path, backend.url, kind):
        r = _post(gw)
        assert r.status_code == 502, r.text
        message = r.json()["error"]["message"]
        assert "sent an invalid HTTP response" in message
        for leak in (BACKEND_KEY, "Bearer", "authorization", "127.0.0.1", backend.url):
            assert leak.lower() not in r.text.lower()


def test_chunked_json_broken_mid_body_is_502(tmp_path: Path, kind: str) -> None:
    backend = _RawBackend(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                          b"transfer-encoding: chunked\r\n\r\n10\r\n{\"id\": \"chat")
    for gw in _gateway(tmp_path, backend.url, kind):
        r = _post(gw)
        assert r.status_code == 502, (r.status_code, r.content)
        assert r.json()["error"]["code"] == "backend_error"
