"""The prefill-aware pick end to end: a real gateway process in front of two simulators.

One engine is decoding a long answer (its first token long since streamed), the other has a
request the gateway sent whose first chunk has not come back (the simulator holds its response
with ``x-sim-extra-latency-ms``): equal load, one request each. A newcomer's first token would
wait for the pending prefill on the second engine, not for the decode on the first, so with
``prefill_aware`` (the default) every one of a run of short streamed requests lands on the
decoding engine; with ``prefill_aware: false`` the load tie sends them to both.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
PROBES = 12
ADMIN = "admin-prefill-aware-test"


def _body(max_tokens: int) -> dict[str, Any]:
    return {"model": "chat-model", "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello there"}]}


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _held(gw: GatewayProcess) -> None:
    """A streamed request whose response the simulator holds back for 60 s (ended early by
    the gateway's shutdown)."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(gw.url + "/v1/chat/completions", timeout=90, json=_body(4),
                   headers={**AUTH, "x-sim-extra-latency-ms": "60000"})


def _probe_counts(tmp: Path, sims: list[SimServer], aware: bool) -> tuple[int, int]:
    """Requests of the probe run served by (the decoding engine, the one with the pending
    prefill)."""
    data = policy({"chat": [s.url for s in sims]})
    data["pools"][0]["prefill_aware"] = aware
    # the decoding stream is long on purpose: above the default output bound of a model
    data["models"][0]["max_output_tokens"] = 100_000
    data["server"]["drain_timeout"] = 1  # the held request is cut off at shutdown, not waited
    with GatewayProcess(tmp, data) as gw, httpx.Client(timeout=60) as client, \
            client.stream("POST", gw.url + "/v1/chat/completions", headers=AUTH,
                          json=_body(100_000)) as decoding:
        assert decoding.status_code == 200
        lines = decoding.iter_lines()  # kept: a dropped iterator would close the stream
        for line in lines:
            if '"content":"' in line and '"content":""' not in line:
                break  # its first token is out: it only decodes from now on
        busy = next(s for s in sims if s.engine.num_running == 1)
        other = next(s for s in sims if s is not busy)
        held = threading.Thread(target=_held, args=(gw,), daemon=True)
        held.start()  # least loaded: the engine with nothing in flight takes it
        _until(lambda: _in_flight(gw) == 2, "the held request never got a backend")
        before = {id(s): s.engine.stats.completed for s in sims}
        for _ in range(PROBES):
            r = httpx.post(gw.url + "/v1/chat/completions", headers=AUTH, json=_body(2),
                           timeout=60)
            assert r.status_code == 200, r.text
        served = {id(s): s.engine.stats.completed - before[id(s)] for s in sims}
    held.join(30)
    return served[id(busy)], served[id(other)]


def _in_flight(gw: GatewayProcess) -> int:
    """Requests holding a backend of the pool (``/admin/stats``)."""
    r = httpx.post(gw.url + "/admin/stats", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    return int(r.json()["pools"]["chat"]["in_flight"])


def test_newcomers_avoid_the_engine_with_a_prefill_pending(
        tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    with SimServer("interactive", speedup=1, jitter=0) as a, \
            SimServer("interactive", speedup=1, jitter=0) as b:
        on_busy, on_other = _probe_counts(tmp_path, [a, b], aware=True)
        assert (on_busy, on_other) == (PROBES, 0)
        on_busy, on_other = _probe_counts(tmp_path, [a, b], aware=False)
        assert on_busy + on_other == PROBES
        assert on_other > 0  # a load tie: both engines get some (all on one: p = 2 / 4096)
