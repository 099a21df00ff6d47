"""``GATEWAY_METRICS_TOKEN`` protects ``/metrics``, and per-tenant series (spend) are exported
only behind it (issue 14, point 25)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, TEST_KEY_SHA, GatewayProcess, policy

pytestmark = pytest.mark.process

TOKEN = "metrics-token-for-tests"


def _policy(sim_url: str) -> dict[str, Any]:
    data = policy({"chat": [sim_url]})
    data["auth"] = {"keys": [{"id": "test", "sha256": TEST_KEY_SHA, "tenant": "acme"}]}
    data["plans"] = [{"name": "basic"}]
    data["tenants"] = [{"name": "acme", "plan": "basic"}]
    data["prices"] = {"currency": "USD",
                      "models": {"chat-model": {"input": "1", "output": "2"}}}
    return data


def _spend_tenants(text: str) -> set[str]:
    return {s.labels["tenant"] for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "gateway_spend_total"}


def _one_request(gw: GatewayProcess) -> None:
    r = httpx.post(gw.url + "/v1/chat/completions", timeout=60,
                   headers={"Authorization": f"Bearer {TEST_KEY}"},
                   json={"model": "chat-model", "max_tokens": 2,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("workers", [1, 2])
def test_token_required_and_tenants_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          workers: int) -> None:
    monkeypatch.setenv("GATEWAY_METRICS_TOKEN", TOKEN)
    with SimServer("interactive", speedup=20) as sim, \
            GatewayProcess(tmp_path, _policy(sim.url), workers=workers) as gw:
        _one_request(gw)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = httpx.get(gw.url + "/metrics", headers=headers, timeout=60)
            assert r.status_code == 401, headers
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert "gateway_" not in r.text
        r = httpx.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=60)
        assert r.status_code == 200
        assert _spend_tenants(r.text) == {"acme"}
        assert TOKEN not in gw.output()


def test_open_metrics_hide_tenants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a token /metrics stays open (as before) but sums spend over tenants."""
    monkeypatch.delenv("GATEWAY_METRICS_TOKEN", raising=False)
    with SimServer("interactive", speedup=20) as sim, \
            GatewayProcess(tmp_path, _policy(sim.url)) as gw:
        _one_request(gw)
        r = httpx.get(gw.url + "/metrics", timeout=60)
        assert r.status_code == 200
        assert _spend_tenants(r.text) == {"*"}
        assert "acme" not in r.text
