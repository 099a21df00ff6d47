"""The console's edge: a disabled console is the gateway's ordinary 404 (and builds nothing);
an enabled one adds the security headers, ``no-store`` and a request id to every answer,
keeping a header the app set itself."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from gateway.config import parse_policy
from gateway.console import ConsoleEdge, is_console_path
from gateway.console.edge import CSP

if TYPE_CHECKING:
    from gateway.types import Message, Receive, Scope, Send


class Runtime:
    def __init__(self, enabled: bool) -> None:
        self.policy = parse_policy({"console": {"enabled": enabled}})


async def _call(edge: ConsoleEdge, path: str) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "method": "GET", "path": path, "headers": []}
    await edge(scope, receive, send)
    return sent


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"content-type", b"text/plain")]
    if scope["path"].endswith(".js"):
        headers.append((b"cache-control", b"public, max-age=31536000, immutable"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def _headers(messages: list[Message]) -> dict[bytes, bytes]:
    return dict(messages[0]["headers"])


async def test_disabled_console_is_an_unknown_route() -> None:
    built: list[int] = []

    def build() -> Any:
        built.append(1)
        return _app

    edge = ConsoleEdge(lambda: Runtime(False), build)  # type: ignore[arg-type,return-value]
    sent = await _call(edge, "/console/login")
    assert sent[0]["status"] == 404
    assert json.loads(sent[1]["body"])["error"]["code"] == "unknown_url"
    assert not built and "not built" in repr(edge)


@pytest.mark.parametrize(("path", "cache"), [
    pytest.param("/console", b"no-store", id="page"),
    pytest.param("/console/static/chart.js", b"public, max-age=31536000, immutable", id="static"),
])
async def test_enabled_console_answers_carry_the_headers(path: str, cache: bytes) -> None:
    edge = ConsoleEdge(lambda: Runtime(True), lambda: _app)  # type: ignore[arg-type,return-value]
    headers = _headers(await _call(edge, path))
    assert headers[b"content-security-policy"] == CSP.encode()
    assert headers[b"x-frame-options"] == b"DENY"
    assert headers[b"referrer-policy"] == b"no-referrer"
    assert headers[b"cache-control"] == cache
    assert headers[b"x-request-id"]


async def test_paths_next_to_the_console_are_not_its() -> None:
    assert is_console_path("/console") and is_console_path("/console/x")
    assert not is_console_path("/consoles") and not is_console_path("/consolex/a")
    edge = ConsoleEdge(lambda: Runtime(True), lambda: _app)  # type: ignore[arg-type,return-value]
    assert (await _call(edge, "/consoles"))[0]["status"] == 404


def test_csp_forbids_inline_scripts_and_framing() -> None:
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["default-src"] == "'self'" and directives["script-src"] == "'self'"
    assert "unsafe" not in CSP and directives["frame-ancestors"] == "'none'"
