"""Real traffic for the end-to-end rollout tests: streamed chat requests from a thread, to
one or more gateways, until stopped; and a poller of ``/admin/rollouts``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import httpx

from tests.helpers import TEST_KEY

ADMIN_TOKEN = "rollout-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def progressive_policy(data: dict[str, Any], *, steps: list[float], hold: str,
                       min_requests: int, **gates: Any) -> dict[str, Any]:
    """``data`` (``tests.helpers.policy`` with pools 'stable' and 'canary') with model
    'stable-model' split into a baseline on pool stable and a progressive canary."""
    progressive: dict[str, Any] = {"steps": steps, "hold": hold, "min_requests": min_requests}
    if gates:
        progressive["gates"] = gates
    data["models"] = [{
        "name": "chat-model", "pool": "stable", "sticky": "none",
        "versions": [
            {"name": "v1", "backend_model": "sim-model", "weight": 1, "pool": "stable"},
            {"name": "v2", "backend_model": "sim-model", "weight": 0, "pool": "canary",
             "progressive": progressive}]}]
    return data


class Traffic:
    """``concurrency`` loops of streamed chat completions spread over ``urls``."""

    def __init__(self, urls: list[str], concurrency: int = 8) -> None:
        self.urls = urls
        self.concurrency = concurrency
        self.by_pool: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=10.0) as client:
            await asyncio.gather(*(self._loop(client, i) for i in range(self.concurrency)))

    async def _loop(self, client: httpx.AsyncClient, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            url = self.urls[(i + n) % len(self.urls)]
            n += 1
            try:
                async with client.stream(
                    "POST", url + "/v1/chat/completions",
                    headers={"Authorization": f"Bearer {TEST_KEY}"},
                    json={"model": "chat-model", "stream": True, "max_tokens": 8,
                          "messages": [{"role": "user", "content": f"hello {i} {n}"}]},
                ) as answer:
                    async for _ in answer.aiter_bytes():
                        pass
                    self.statuses[answer.status_code] += 1
                    self.by_pool[answer.headers.get("x-gateway-pool", "")] += 1
            except httpx.HTTPError:
                self.statuses[0] += 1  # a killed replica: the loop goes on to the next
                await asyncio.sleep(0.05)


def rollout(url: str, model: str = "chat-model") -> dict[str, Any]:
    answer = httpx.get(f"{url}/admin/rollouts/{model}", headers=ADMIN, timeout=10)
    answer.raise_for_status()
    body: dict[str, Any] = answer.json()
    return body


def wait_phase(url: str, phases: set[str], timeout: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view = rollout(url)
    while view["phase"] not in phases:
        if time.monotonic() > deadline:
            raise AssertionError(f"rollout still {view['phase']} after {timeout}s: {view}")
        time.sleep(0.2)
        view = rollout(url)
    return view
