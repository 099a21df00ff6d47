"""Three gateway replicas and one real redis-server: one decision for all of them, sampled
all along, and the rollout goes on when the deciding replica is killed."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.helpers import GatewayProcess, policy
from tests.redis_servers import RedisProc
from tests.rollouts.traffic import ADMIN_TOKEN, Traffic, progressive_policy, rollout

pytestmark = pytest.mark.process

STEPS = [10.0, 20.0, 30.0, 40.0, 50.0, 100.0]


@pytest.fixture()
def redis(gateway_redis: RedisProc, monkeypatch: pytest.MonkeyPatch) -> RedisProc:
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN_TOKEN)
    return gateway_redis


class Sampler:
    """Asks every live replica for the rollout, round after round, from a thread."""

    def __init__(self, gateways: list[GatewayProcess]) -> None:
        self.gateways = gateways
        self.dead: set[str] = set()
        self.rounds: list[list[dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            live = [gw for gw in self.gateways if gw.url not in self.dead]
            try:
                views = [rollout(gw.url) for gw in live]
            except httpx.HTTPError:
                if any(gw.url in self.dead for gw in live):
                    continue  # the round met the replica killed meanwhile: take the next
                raise
            self.rounds.append(views)
            time.sleep(0.1)


def _the_leader(gws: list[GatewayProcess], deadline: float) -> GatewayProcess:
    """The one replica that says it holds the lease. Each says so as of its last tick, so
    just after a lease changes hands two may (or none): ask again until one does."""
    while True:
        leaders = [gw for gw in gws if rollout(gw.url)["leader"]]
        if len(leaders) == 1:
            return leaders[0]
        assert time.monotonic() < deadline, [rollout(gw.url) for gw in gws]
        time.sleep(0.1)


def test_three_replicas_agree_and_survive_the_deciders_death(
        redis: RedisProc, tmp_path: Path) -> None:
    with SimServer("interactive", speedup=20, jitter=0.0, stall_ms=10) as stable, \
            SimServer("interactive", speedup=20, jitter=0.0, stall_ms=10) as canary:
        data = progressive_policy(policy({"stable": [stable.url], "canary": [canary.url]}),
                                  steps=STEPS, hold="1.5s", min_requests=20)
        gws = [GatewayProcess(tmp_path, data).start() for _ in range(3)]
        try:
            with Traffic([gw.url for gw in gws], concurrency=9), Sampler(gws) as sampler:
                deadline = time.monotonic() + 90
                while rollout(gws[0].url)["step"] < 2:
                    assert time.monotonic() < deadline, rollout(gws[0].url)
                    time.sleep(0.1)
                decider = _the_leader(gws, deadline)
                killed_at = time.time()
                sampler.dead.add(decider.url)
                assert decider.proc is not None
                decider.proc.kill()  # SIGKILL: no resign, its lease has to run out
                survivors = [gw for gw in gws if gw is not decider]
                while rollout(survivors[0].url)["phase"] != "promoted":
                    assert time.monotonic() < deadline, rollout(survivors[0].url)
                    time.sleep(0.1)
                _the_leader(survivors, deadline)  # a survivor took the lease
                while len(sampler.rounds) < 10:  # enough views to check, however slow the box
                    assert time.monotonic() < deadline, len(sampler.rounds)
                    time.sleep(0.1)
            final = [rollout(gw.url) for gw in survivors]
        finally:
            for gw in gws:
                gw.stop()
    history = final[0]["history"]
    reasons = [e["reason"] for e in history]
    assert reasons == ["started", *["advanced"] * (len(STEPS) - 2), "promoted"], reasons
    assert any(e["at"] > killed_at for e in history)  # decided after the kill
    by_revision: dict[int, tuple[str, int]] = {}
    for views in sampler.rounds:
        # every replica reads one shared state: within a round they differ only when a
        # transition fell between two of its calls (then by one revision)
        revisions = {v["revision"] for v in views}
        assert max(revisions) - min(revisions) <= 1, views
        for v in views:
            seen = by_revision.setdefault(v["revision"], (v["phase"], v["step"]))
            assert seen == (v["phase"], v["step"]), (v, seen)  # no split brain
            # and each routes by it, at most one tick behind
            assert v["revision"] - v["routing"]["revision"] <= 1, v
    assert len(sampler.rounds) >= 10  # a round is 3 HTTP calls: slow on a loaded box
    assert os.environ["GATEWAY_REDIS_URL"] == redis.url
