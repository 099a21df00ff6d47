"""The admin gate: every ``/admin`` route is 404 without a configured token and 401 with a bad
one, before its parameters or body are looked at (issue 14, point 14).

The routes come from the app's own route table, so a route added later is covered without
touching this file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.admin import is_admin_path
from gateway.app.factory import create_app
from gateway.config import load_policy
from tests.helpers import GatewayProcess, policy

pytestmark = pytest.mark.process

ADMIN = "admin-token-for-gate-tests"
#: parameters no admin handler accepts as valid: wrong types, missing required ones
BAD_QUERY = {"start_ms": "not-a-number", "end_ms": "[]", "day": "", "group_by": "nope"}


def _admin_routes(config: Path) -> list[tuple[str, str]]:
    """(method, concrete path) of every admin route the app registers."""
    app = create_app(load_policy(str(config)), str(config))
    found = []
    for route in app.routes:
        if not is_admin_path(route.path):
            continue
        path = re.sub(r"\{[^}]*\}", "some-id", route.path)
        found += [(m, path) for m in sorted(route.methods) if m not in ("OPTIONS", "HEAD")]
    return found


def _calls(gw: GatewayProcess, routes: list[tuple[str, str]],
           headers: dict[str, str]) -> dict[str, tuple[int, Any]]:
    """Each route with bad parameters and a bad body, plus a wrong method on each path."""
    seen = {}
    for method, path in routes:
        for m in (method, "DELETE"):
            r = httpx.request(m, gw.url + path, params=BAD_QUERY, content=b"{not json",
                              headers={"content-type": "application/json", **headers},
                              timeout=30)
            seen[f"{m} {path}"] = (r.status_code, r.json())
    return seen


@pytest.fixture()
def data(tmp_path: Path) -> dict[str, Any]:
    d = policy({"chat": ["http://127.0.0.1:9"]})
    d["store"] = {"keys_file": str(tmp_path / "keys.json")}
    return d


def test_admin_routes_are_404_without_a_token(tmp_path: Path, data: dict[str, Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With GATEWAY_ADMIN_TOKEN unset, every admin route (and a wrong method on it) answers
    the unknown-route 404, never the 400 or 405 that would name its parameters."""
    monkeypatch.delenv("GATEWAY_ADMIN_TOKEN", raising=False)
    with GatewayProcess(tmp_path, data) as gw:
        routes = _admin_routes(gw.config)
        assert {p for _, p in routes} >= {"/admin/reload", "/admin/usage/export",
                                          "/admin/usage/reconcile", "/admin/keys"}
        seen = _calls(gw, routes, {"Authorization": "Bearer guess"})
        assert {k: v[0] for k, v in seen.items()} == dict.fromkeys(seen, 404)
        assert all(v[1]["error"]["code"] == "unknown_url" for v in seen.values())
        assert all("start_ms" not in str(v[1]) and "param" not in str(v[1]["error"]["param"])
                   for v in seen.values())


def test_admin_routes_are_401_with_a_bad_token(tmp_path: Path, data: dict[str, Any],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With a token configured, a missing or wrong credential gets 401 on every admin route,
    whatever its parameters; the right one reaches the handler (which then validates)."""
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    with GatewayProcess(tmp_path, data) as gw:
        routes = _admin_routes(gw.config)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN}):
            seen = _calls(gw, routes, headers)
            assert {k: v[0] for k, v in seen.items()} == dict.fromkeys(seen, 401), headers
        ok = httpx.get(gw.url + "/admin/usage/export", params={"start_ms": "x", "end_ms": 1},
                       headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
        assert ok.status_code == 400  # past the gate, the parameters are checked
        assert os.environ["GATEWAY_ADMIN_TOKEN"] == ADMIN
