"""No spelling of a path opens the admin API (issue 34, point 1), over real sockets, on both
server protocols, with the admin token unset and set.

Each request is written byte for byte on a socket (an HTTP client library would normalise the
very spellings under test). Every admin route the app registers is tried with every spelling
of :mod:`tests.api.path_spellings`: without a valid credential no spelling reaches a handler
(404 with no token configured, 401 with one, 400 for a path that does not canonicalise); with
the token, a spelling of the same path is served exactly as the plain one is.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from gateway.api.admin import is_admin_path
from gateway.app.factory import create_app
from gateway.config import load_policy
from tests.api.path_spellings import SPELLINGS
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

ADMIN = "admin-token-for-spelling-tests"


def _admin_routes(config: Path) -> list[tuple[str, str]]:
    app = create_app(load_policy(str(config)), str(config))
    found = []
    for route in app.routes:
        if is_admin_path(route.path):
            path = re.sub(r"\{[^}]*\}", "some-id", route.path)
            found += [(m, path) for m in sorted(route.methods) if m not in ("OPTIONS", "HEAD")]
    return found


def raw_request(port: int, method: str, target: str, auth: str | None,
                body: bytes = b"") -> tuple[int, Any]:
    """One request written as bytes; (status, decoded JSON body or None)."""
    head = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
            f"Content-Length: {len(body)}", "Content-Type: application/json"]
    if auth is not None:
        head.append(f"Authorization: {auth}")
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    reply = b"".join(chunks)
    status = int(reply.split(b" ", 2)[1])
    payload = reply.partition(b"\r\n\r\n")[2]
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, None


def _sweep(port: int, routes: list[tuple[str, str]], auth: str | None
           ) -> dict[tuple[str, str, str], tuple[int, Any]]:
    seen = {}
    for method, path in routes:
        for name, _, spell in SPELLINGS:
            seen[(method, path, name)] = raw_request(port, method, spell(path), auth,
                                                     b"{not json")
    return seen


def _label(name: str) -> str:
    return next(label for n, label, _ in SPELLINGS if n == name)


@pytest.fixture(params=["native", "uvicorn"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _data(tmp_path: Path, protocol: str) -> dict[str, Any]:
    d = policy({"chat": ["http://127.0.0.1:9"]}, http_protocol=protocol)
    d["store"] = {"keys_file": str(tmp_path / "keys.json")}
    return d


def test_no_spelling_opens_the_admin_api_without_a_token(
        tmp_path: Path, protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_ADMIN_TOKEN", raising=False)
    with GatewayProcess(tmp_path, _data(tmp_path, protocol)) as gw:
        routes = _admin_routes(gw.config)
        assert len(routes) >= 12
        seen = _sweep(gw.port, routes, f"Bearer {TEST_KEY}")
    wrong = {}
    for (method, path, name), (status, body) in seen.items():
        want = 400 if _label(name) == "bad" else 404
        if status != want or (want == 404 and body["error"]["code"] != "unknown_url"):
            wrong[f"{method} {path} [{name}]"] = (status, body)
    assert not wrong, wrong
    assert len(seen) >= 30 * len(routes)


def test_no_spelling_passes_the_admin_gate_without_the_token(
        tmp_path: Path, protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    with GatewayProcess(tmp_path, _data(tmp_path, protocol)) as gw:
        routes = _admin_routes(gw.config)
        refused = {auth: _sweep(gw.port, routes, auth)
                   for auth in (None, "Bearer wrong", ADMIN, f"Bearer {TEST_KEY}")}
        served = _sweep(gw.port, routes, f"Bearer {ADMIN}")
        log = gw.output()
    wrong = {}
    for auth, seen in refused.items():
        for (method, path, name), (status, _) in seen.items():
            want = 400 if _label(name) == "bad" else 401
            if status != want:
                wrong[f"{auth}: {method} {path} [{name}]"] = status
    for (method, path, name), (status, body) in served.items():
        label = _label(name)
        plain = served[(method, path, "plain")][0]
        want = {"bad": 400, "case": 404, "same": plain}[label]
        if status != want:
            wrong[f"token: {method} {path} [{name}]"] = (status, body)
        if label == "bad":
            assert body is None or body["error"]["code"] == "invalid_path", body
    assert not wrong, wrong
    # the handlers were reached: not every plain answer is the gate's or a routing miss
    assert {served[(m, p, "plain")][0] for m, p in routes} - {401, 404}
    # the audit log: one line per admin request, with the client and how it authenticated
    assert re.search(r"admin GET /admin/keys from 127\.0\.0\.1:\d+ auth=none status=401", log)
    assert re.search(r"admin GET /admin/keys from 127\.0\.0\.1:\d+ auth=bad status=401", log)
    assert re.search(r"admin GET /admin/keys from 127\.0\.0\.1:\d+ auth=token status=200", log)
    assert ADMIN not in log


def test_the_audit_route_lists_admin_requests(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    with GatewayProcess(tmp_path, _data(tmp_path, "native")) as gw:
        assert raw_request(gw.port, "GET", "//admin/keys", None)[0] == 401
        assert raw_request(gw.port, "POST", "/admin/stats", f"Bearer {ADMIN}")[0] == 200
        status, entries = raw_request(gw.port, "GET", "/admin/audit?limit=2",
                                      f"Bearer {ADMIN}")
        assert raw_request(gw.port, "GET", "/admin/audit?limit=0", f"Bearer {ADMIN}")[0] == 400
    assert status == 200
    assert [(e["method"], e["path"], e["auth"], e["status"]) for e in entries] == [
        ("POST", "/admin/stats", "token", 200), ("GET", "/admin/keys", "none", 401)]
    assert entries[0]["client"].startswith("127.0.0.1:")


def test_public_routes_read_every_clean_spelling_the_same(
        tmp_path: Path, protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The canonical path serves the proxy's fast routes and the framework's alike."""
    monkeypatch.delenv("GATEWAY_ADMIN_TOKEN", raising=False)
    with GatewayProcess(tmp_path, _data(tmp_path, protocol)) as gw:
        for path in ("/v1/models", "/v1/models/chat-model", "/healthz"):
            for name, label, spell in SPELLINGS:
                if label == "case" or (name != "plain" and spell(path) == path):
                    continue  # another route, or no spelling of this one
                status, body = raw_request(gw.port, "GET", spell(path), f"Bearer {TEST_KEY}")
                assert status == (400 if label == "bad" else 200), (path, name, status, body)
        # a fast (proxied) route: a trailing slash and doubled slashes reach the proxy
        for target in ("/v1/chat/completions/", "//v1//chat/completions"):
            status, body = raw_request(gw.port, "POST", target, f"Bearer {TEST_KEY}",
                                       b'{"model": "nope", "messages": []}')
            assert status in (400, 404) and body["error"]["code"] != "unknown_url", body


def test_the_public_openapi_document_lists_no_admin_route(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point 2: the admin routes appear only when the document is asked for with the token."""
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    with GatewayProcess(tmp_path, _data(tmp_path, "native")) as gw:
        docs = {auth: raw_request(gw.port, "GET", "/openapi.json", auth)
                for auth in (None, f"Bearer {TEST_KEY}", "Bearer wrong", f"Bearer {ADMIN}")}
    for auth, (status, doc) in docs.items():
        assert status == 200, auth
        text = json.dumps(doc)
        if auth == f"Bearer {ADMIN}":
            assert "/admin/keys" in doc["paths"] and "adminToken" in text
        else:
            assert "/v1/chat/completions" in doc["paths"]
            assert "/admin" not in text and "adminToken" not in text, auth
