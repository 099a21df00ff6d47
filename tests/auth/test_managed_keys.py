"""Managed API keys end to end: CLI and admin API, hashed storage, revocation bound, expiry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.sim.server import SimServer
from tests.helpers import GatewayProcess, policy

pytestmark = pytest.mark.process

SECRET = "test-key-secret-0123456789"
ADMIN = "admin-token-for-tests"
CACHE_TTL = 0.5


def _policy(tmp: Path, sim_url: str) -> dict[str, Any]:
    data = policy({"chat": [sim_url]})
    data["auth"] = {"keys": [], "cache_ttl": CACHE_TTL}
    data["store"] = {"keys_file": str(tmp / "keys.json")}
    data["plans"] = [{"name": "basic"}]
    data["tenants"] = [{"name": "acme", "plan": "basic"}, {"name": "globex", "plan": "basic"}]
    return data


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GATEWAY_KEY_SECRET": SECRET}
    return subprocess.run([sys.executable, "-m", "gateway", "keys", *args, "--config",
                           str(config)] if args[0] != "revoke" else
                          [sys.executable, "-m", "gateway", "keys", "revoke", "--config",
                           str(config), *args[1:]],
                          capture_output=True, text=True, env=env, check=False)


def _chat(gw: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions",
                      json={"model": "chat-model", "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hi"}]},
                      headers={"Authorization": f"Bearer {key}"}, timeout=10)


@pytest.fixture()
def setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    os.environ["GATEWAY_KEY_SECRET"] = SECRET
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        with SimServer("interactive", speedup=5) as sim:
            data = _policy(tmp_path, sim.url)
            config = tmp_path / "policy.yaml"
            config.write_text(yaml.safe_dump(data))
            with GatewayProcess(tmp_path, data) as gw:
                yield gw, gw.config, tmp_path
    finally:
        os.environ.pop("GATEWAY_KEY_SECRET", None)
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)


def test_cli_create_list_revoke_with_bound(setup) -> None:  # type: ignore[no-untyped-def]
    gw, config, tmp = setup
    r = _cli(config, "create", "--tenant", "acme", "--name", "ci")
    assert r.returncode == 0, r.stderr
    created = json.loads(r.stdout)
    key = created["key"]
    assert key.startswith("sk-gw-") and len(key) >= 6 + 12 + 1 + 43  # >= 32 random bytes
    stored = (tmp / "keys.json").read_text()
    assert key not in stored and key.split("_", 1)[1] not in stored  # only the keyed hash
    assert _chat(gw, key).status_code == 200
    listing = _cli(config, "list", "--json")
    rows = json.loads(listing.stdout)
    assert [(x["id"], x["tenant"], x["state"]) for x in rows] == [(created["id"], "acme",
                                                                    "active")]
    assert "digest" not in listing.stdout and key not in listing.stdout
    assert _cli(config, "revoke", created["id"]).returncode == 0
    revoked_at = time.monotonic()
    while _chat(gw, key).status_code == 200:  # works at most until the cache entry expires
        assert time.monotonic() - revoked_at < CACHE_TTL + 0.3, "revocation bound exceeded"
        time.sleep(0.05)
    r = _chat(gw, key)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_expired_and_unknown_look_the_same(setup) -> None:  # type: ignore[no-untyped-def]
    gw, config, _ = setup
    created = json.loads(_cli(config, "create", "--tenant", "acme", "--expires", "1s").stdout)
    assert _chat(gw, created["key"]).status_code == 200
    time.sleep(1.0 + CACHE_TTL + 0.1)
    expired = _chat(gw, created["key"])
    unknown = _chat(gw, "sk-gw-000000000000_" + "A" * 43)
    malformed = _chat(gw, "not-a-key")
    assert expired.status_code == unknown.status_code == malformed.status_code == 401
    assert expired.json() == unknown.json() == malformed.json()


def test_key_own_limit(setup) -> None:  # type: ignore[no-untyped-def]
    """A managed key with its own rpm inside its tenant's plan is held to it."""
    gw, config, _ = setup
    created = json.loads(_cli(config, "create", "--tenant", "acme", "--limit", "rpm=2").stdout)
    assert created["limits"] == {"rpm": 2}
    codes = [_chat(gw, created["key"]).status_code for _ in range(4)]
    assert codes == [200, 200, 429, 429]
    r = _cli(config, "create", "--tenant", "acme", "--limit", "rpm=lots")
    assert r.returncode == 2 and "NAME=NUMBER" in r.stderr


def test_cli_refuses_unknown_tenant_and_bad_expiry(setup) -> None:  # type: ignore[no-untyped-def]
    _, config, _ = setup
    r = _cli(config, "create", "--tenant", "nobody")
    assert r.returncode == 2 and "unknown tenant" in r.stderr
    r = _cli(config, "create", "--tenant", "acme", "--expires", "soon")
    assert r.returncode == 2 and "duration" in r.stderr


def test_admin_api(setup) -> None:  # type: ignore[no-untyped-def]
    gw, _, _ = setup
    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert httpx.post(gw.url + "/admin/keys", json={"tenant": "globex"}).status_code == 401
    r = httpx.post(gw.url + "/admin/keys", json={"tenant": "globex", "name": "api"},
                   headers=admin)
    assert r.status_code == 201, r.text
    key, key_id = r.json()["key"], r.json()["id"]
    assert _chat(gw, key).status_code == 200
    listed = httpx.get(gw.url + "/admin/keys", params={"tenant": "globex"}, headers=admin).json()
    assert [k["id"] for k in listed] == [key_id]
    r = httpx.post(gw.url + f"/admin/keys/{key_id}/revoke", headers=admin)
    assert r.status_code == 200 and r.json()["state"] == "revoked"
    time.sleep(CACHE_TTL + 0.1)
    assert _chat(gw, key).status_code == 401
    bad = httpx.post(gw.url + "/admin/keys", json={"tenant": 3}, headers=admin)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tenant"
    assert "admin: key" in gw.output()  # every admin action is logged


def test_admin_disabled_without_token(tmp_path: Path) -> None:
    with (
        SimServer("interactive", speedup=5) as sim,
        GatewayProcess(tmp_path, policy({"chat": [sim.url]})) as gw,
    ):
        r = httpx.post(gw.url + "/admin/reload", headers={"Authorization": "Bearer x"})
        assert r.status_code == 404


def test_managed_key_accepted_on_every_route(setup) -> None:  # type: ignore[no-untyped-def]
    """One authentication path: a managed key works on /v1/models as on the proxy routes,
    and a bad key gets the same 401 on each."""
    gw, _, _ = setup
    admin = {"Authorization": f"Bearer {ADMIN}"}
    key = httpx.post(gw.url + "/admin/keys", json={"tenant": "acme", "name": "m"},
                     headers=admin).json()["key"]
    auth = {"Authorization": f"Bearer {key}"}
    assert _chat(gw, key).status_code == 200
    listed = httpx.get(gw.url + "/v1/models", headers=auth)
    assert listed.status_code == 200, listed.text
    assert [m["id"] for m in listed.json()["data"]] == ["chat-model"]
    assert httpx.get(gw.url + "/v1/models/chat-model", headers=auth).status_code == 200
    assert httpx.get(gw.url + "/v1/batches", headers=auth).status_code == 200
    assert httpx.get(gw.url + "/v1/usage", headers=auth).status_code == 200
    bad = {"Authorization": "Bearer sk-gw-not-a-key"}
    messages = {r.json()["error"]["message"] for r in (
        httpx.get(gw.url + "/v1/models", headers=bad),
        httpx.get(gw.url + "/v1/batches", headers=bad),
        httpx.get(gw.url + "/v1/usage", headers=bad),
        httpx.post(gw.url + "/v1/chat/completions", headers=bad, json={}),
    )}
    assert len(messages) == 1
