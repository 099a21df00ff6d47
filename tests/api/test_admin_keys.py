"""A key's name and limits are stored as given, through the CLI and through ``/admin/keys``
(issue 14, point 19: the limits loop once overwrote ``name`` with the last limit's name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import REPO, GatewayProcess, policy

pytestmark = pytest.mark.process

SECRET = "test-key-secret-0123456789"
ADMIN = "admin-token-for-key-tests"


def _policy(tmp: Path) -> dict[str, Any]:
    data = policy({"chat": ["http://127.0.0.1:9"]})
    data["store"] = {"keys_file": str(tmp / "keys.json")}
    data["plans"] = [{"name": "basic"}]
    data["tenants"] = [{"name": "acme", "plan": "basic"}]
    return data


def _stored(tmp: Path) -> list[dict[str, Any]]:
    text = (tmp / "keys.json").read_text()
    data = json.loads(text)
    return list(data.values()) if isinstance(data, dict) else list(data)


def test_cli_create_keeps_name_and_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setenv("GATEWAY_KEY_SECRET", SECRET)
    gw = GatewayProcess(tmp_path, _policy(tmp_path))  # writes the policy file; not started
    r = subprocess.run(
        [sys.executable, "-m", "gateway", "keys", "create", "--config", str(gw.config),
         "--tenant", "acme", "--name", "ci", "--limit", "rpm=5", "--limit", "tpm=1000"],
        capture_output=True, text=True, cwd=REPO, env=dict(os.environ), check=False,
        timeout=120)
    assert r.returncode == 0, r.stderr
    created = json.loads(r.stdout)
    assert created["name"] == "ci"
    assert created["limits"] == {"rpm": 5, "tpm": 1000}
    listing = subprocess.run(
        [sys.executable, "-m", "gateway", "keys", "list", "--config", str(gw.config), "--json"],
        capture_output=True, text=True, cwd=REPO, env=dict(os.environ), check=True, timeout=120)
    assert [(k["name"], k["limits"]) for k in json.loads(listing.stdout)] == [
        ("ci", {"rpm": 5, "tpm": 1000})]


def test_admin_create_keeps_name_and_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    monkeypatch.setenv("GATEWAY_KEY_SECRET", SECRET)
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with GatewayProcess(tmp_path, _policy(tmp_path)) as gw:
        r = httpx.post(gw.url + "/admin/keys", headers=admin, timeout=30, json={
            "tenant": "acme", "name": "ci", "limits": {"rpm": 5, "tpm": 1000}})
        assert r.status_code == 201, r.text
        assert (r.json()["name"], r.json()["limits"]) == ("ci", {"rpm": 5, "tpm": 1000})
        listed = httpx.get(gw.url + "/admin/keys", headers=admin, timeout=30).json()
        assert [(k["name"], k["limits"]) for k in listed] == [("ci", {"rpm": 5, "tpm": 1000})]
        bad = httpx.post(gw.url + "/admin/keys", headers=admin, timeout=30, json={
            "tenant": "acme", "name": "ci", "limits": {"rpm": True}})
        assert bad.status_code == 400 and "rpm" in bad.json()["error"]["message"]
        # fields of the wrong type or a deeply nested body are 400s naming the problem, not 500s
        for field, value in (("expires", [None, None]), ("default_class", 3), ("name", {})):
            r = httpx.post(gw.url + "/admin/keys", headers=admin, timeout=30,
                           json={"tenant": "acme", field: value})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == field
        deep = b'{"tenant": "acme", "limits": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        r = httpx.post(gw.url + "/admin/keys", headers={**admin, "content-type":
                       "application/json"}, content=deep, timeout=30)
        assert r.status_code == 400 and "nests deeper" in r.json()["error"]["message"]
        assert "unexpected error" not in gw.output()
