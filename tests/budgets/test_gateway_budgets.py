"""Done-when of issue 16 point 5, through real gateways: budgets at two levels refuse together
and alert once.

Two gateway processes (two replicas) share one real Redis; tenants ``acme`` and ``beta`` are in
team ``core`` of organization ``bigco`` (Europe/Paris calendar). acme may use 100 tokens a day,
beta 1,000, the team 150. acme runs out first (its own level refuses), then beta runs the team
out (the team's level refuses both). A real HTTP receiver gets every alert exactly once, signed:
50 and 100 % of acme's and of the team's budget (beta stays under half of its own).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.alerts import SIGNATURE_HEADER, verify
from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.redis_servers import RedisProc

pytestmark = pytest.mark.process

EXPECTED = [("team", "core", 50), ("team", "core", 100), ("tenant", "acme", 50),
            ("tenant", "acme", 100)]
BETA_KEY = "sk-gw-test-beta-0123456789abcdef0123456789abcdef"
SECRET = "whsec-e2e-0123456789"


class Hooks:
    """A threaded HTTP receiver that keeps every POST (headers, body)."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.arrived = threading.Condition()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with hooks.arrived:
                    hooks.got.append((dict(self.headers), body))
                    hooks.arrived.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/budget"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def bodies(self) -> list[dict[str, Any]]:
        with self.arrived:
            return [json.loads(body) for _, body in self.got]

    def wait_for(self, predicate: Any, timeout: float = 60.0) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: predicate(self.bodies_unlocked()), timeout), \
                self.bodies_unlocked()

    def bodies_unlocked(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.got]


@pytest.fixture()
def hooks() -> Iterator[Hooks]:
    h = Hooks()
    h.thread.start()
    yield h
    h.server.shutdown()
    h.server.server_close()


def budget_policy(sim_url: str) -> dict[str, Any]:
    data = policy({"chat": [sim_url]})
    data["auth"]["keys"] = [
        {"id": "acme-key", "sha256": hashlib.sha256(TEST_KEY.encode()).hexdigest(),
         "tenant": "acme"},
        {"id": "beta-key", "sha256": hashlib.sha256(BETA_KEY.encode()).hexdigest(),
         "tenant": "beta"},
    ]
    data["plans"] = [{"name": "p", "limits": {"tokens_per_day": 100}},
                     {"name": "big", "limits": {"tokens_per_day": 1000}}]
    data["organizations"] = [{
        "name": "bigco", "timezone": "Europe/Paris",
        "alerts": {"thresholds": [50, 100], "webhook_url_env": "TEST_HOOK_URL",
                   "webhook_secret_env": "TEST_HOOK_SECRET"}}]
    data["teams"] = [{"name": "core", "organization": "bigco",
                      "limits": {"tokens_per_day": 150}}]
    data["tenants"] = [{"name": "acme", "plan": "p", "team": "core"},
                       {"name": "beta", "plan": "big", "team": "core"}]
    data["store"] = {"outage": "closed"}
    return data


def chat(url: str, key: str) -> httpx.Response:
    body = {"model": "chat-model", "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(url + "/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {key}"}, timeout=30)


def until_refused(urls: list[str], key: str) -> httpx.Response:
    """Requests alternating between the replicas until one is refused (at most 40)."""
    for i in range(40):
        r = chat(urls[i % 2], key)
        if r.status_code == 429:
            return r
        assert r.status_code == 200, r.text
    raise AssertionError("never refused")


def test_budgets_at_two_levels_refuse_together_and_alert_once(
        gateway_redis: RedisProc, hooks: Hooks, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_HOOK_URL", hooks.url)
    monkeypatch.setenv("TEST_HOOK_SECRET", SECRET)
    with SimServer("interactive", speedup=20) as sim:
        data = budget_policy(sim.url)
        gws = [GatewayProcess(tmp_path, data).start() for _ in range(2)]
        try:
            urls = [gw.url for gw in gws]
            # acme spends its own 100: its own level refuses
            r = until_refused(urls, TEST_KEY)
            error = r.json()["error"]
            assert error["code"] == "rate_limit_exceeded"
            assert "tokens_per_day of tenant:acme" in error["message"], error
            assert int(r.headers["retry-after"]) >= 1
            # beta spends what the team has left: the team's level refuses beta ...
            r = until_refused(urls, BETA_KEY)
            assert "tokens_per_day of team:core" in r.json()["error"]["message"]
            # ... and acme, whose own budget refuses too (the outer level is named)
            for url in urls:
                for key in (TEST_KEY, BETA_KEY):
                    r = chat(url, key)
                    assert r.status_code == 429
                    assert "tokens_per_day of team:core" in r.json()["error"]["message"]

            hooks.wait_for(lambda bodies: len(bodies) >= len(EXPECTED))
            metrics = [httpx.get(url + "/metrics", timeout=10).text for url in urls]
        finally:
            for gw in gws:
                gw.stop()  # drains queued webhooks: nothing more may arrive after this
    bodies = hooks.bodies()
    keys = [(b["level"], b["subject"], b["threshold"]) for b in bodies]
    assert sorted(keys) == EXPECTED  # once each, across both replicas
    for headers, body in hooks.got:
        assert verify(SECRET.encode(), headers[SIGNATURE_HEADER], body)
    team_full = next(b for b in bodies if b["level"] == "team" and b["threshold"] == 100)
    assert team_full["organization"] == "bigco" and team_full["timezone"] == "Europe/Paris"
    assert team_full["limit"] == 150 and team_full["budget"] == "tokens_per_day"
    fired = sum(float(line.rsplit(" ", 1)[1]) for text in metrics for line in text.splitlines()
                if line.startswith("gateway_budget_alerts_total{"))
    assert fired == len(EXPECTED)
    assert os.environ["TEST_HOOK_SECRET"] not in "".join(gw.output() for gw in gws)
