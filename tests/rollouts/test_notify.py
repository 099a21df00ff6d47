"""Each transition posts one signed webhook (the budget alerts' sender), to a real HTTP
receiver."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gateway.alerts.webhook import EVENT_HEADER, SIGNATURE_HEADER, WebhookSender, verify
from gateway.rollouts import MemoryRolloutStore, Rollouts
from tests.rollouts.synthetic import Clock, policy

SECRET = "rollout-webhook-secret"


@pytest.fixture()
def receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    got: list[tuple[dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((dict(self.headers), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", got
    server.shutdown()


def test_every_transition_posts_a_signed_webhook(
        receiver: tuple[str, list[tuple[dict[str, str], bytes]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, got = receiver
    monkeypatch.setenv("ROLLOUT_HOOK", url)
    monkeypatch.setenv("ROLLOUT_HOOK_SECRET", SECRET)

    async def go() -> None:
        rollouts = Rollouts(MemoryRolloutStore(), clock=Clock(), interval=1.0,
                            webhooks=WebhookSender(base_delay=0.05))
        rollouts.configure(policy([10.0, 100.0], webhook_url_env="ROLLOUT_HOOK",
                                  webhook_secret_env="ROLLOUT_HOOK_SECRET"))
        await rollouts.tick()  # started
        await rollouts.act("m", "abort", "test")
        await rollouts.aclose()  # drains the queue

    asyncio.run(go())
    assert len(got) == 2
    bodies = sorted((json.loads(body) for _, body in got), key=lambda b: b["revision"])
    assert [b["transition"]["reason"] for b in bodies] == ["started", "operator:abort"]
    assert bodies[1]["share"] == 0.0
    for headers, body in got:
        assert headers[EVENT_HEADER] == "rollout.transition"
        assert verify(SECRET.encode(), headers[SIGNATURE_HEADER], body)
