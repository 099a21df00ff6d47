"""``loadtest probe`` without a key or ``--model`` says what to pass in one line and exits 2
(issue 14, point 24: it printed a 34-line traceback)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import REPO
from tests.ports import free_port

pytestmark = pytest.mark.process


class _Refuses(BaseHTTPRequestHandler):
    """Answers every request 401, as the gateway does without a key."""

    def do_GET(self) -> None:
        body = b'{"error": {"message": "Invalid API key.", "code": "invalid_api_key"}}'
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def refusing_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}  # no OPENAI_API_KEY
    return subprocess.run([sys.executable, "-m", "loadtest", "probe", *args], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def test_no_key_no_model_is_one_line(refusing_url: str) -> None:
    r = _probe("--url", refusing_url)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert "401" in lines[0] and "--api-key" in lines[0] and "/v1/models" in lines[0]


def test_unreachable_url_is_one_line() -> None:
    r = _probe("--url", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "--url" in lines[0] and "--model" in lines[0]
