"""Under ``gateway serve --workers 2`` a reload reaches every worker (issue 14, point 17).

One admin reload (or a SIGHUP to one worker) is answered by one worker; the others reload
because it asks them to, and the answer counts them. An invalid policy is refused with its
one-line reason, never a traceback, however the reload was asked for.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

ADMIN = "admin-token-for-worker-tests"
AUTH = {"Authorization": f"Bearer {TEST_KEY}"}


def _model_lists(gw: GatewayProcess, n: int = 20) -> list[list[str]]:
    """What ``GET /v1/models`` lists on ``n`` fresh connections (spread over the workers)."""
    seen = []
    for _ in range(n):
        with httpx.Client(timeout=30) as client:  # a new connection each time
            r = client.get(gw.url + "/v1/models", headers=AUTH)
            assert r.status_code == 200, r.text
            seen.append(sorted(m["id"] for m in r.json()["data"]))
    return seen


def _with_new_model(data: dict[str, Any]) -> dict[str, Any]:
    new = yaml.safe_load(yaml.safe_dump(data))
    new["models"].append({"name": "new-model", "pool": "chat", "backend_model": "sim-model"})
    return new


def _wait_for(gw: GatewayProcess, text: str, count: int = 1, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while (out := gw.output()).count(text) < count:
        assert time.monotonic() < deadline, f"{text!r} x{count} not logged:\n{out}"
        time.sleep(0.1)
    return out


@pytest.fixture()
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[tuple[GatewayProcess, dict[str, Any], Path]]:
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    shared = tmp_path / "workers"
    monkeypatch.setenv("GATEWAY_WORKERS_DIR", str(shared))
    data = policy({"chat": ["http://127.0.0.1:9"]}, watch_interval=0)  # no file watching
    with GatewayProcess(tmp_path, data, workers=2) as gw:
        deadline = time.monotonic() + 60
        while len(list(shared.glob("*.sock"))) < 2:  # both workers up
            assert time.monotonic() < deadline, gw.output()
            time.sleep(0.1)
        yield gw, data, shared


def test_admin_reload_reaches_every_worker(served: tuple[GatewayProcess, dict[str, Any], Path]
                                           ) -> None:
    gw, data, _ = served
    assert {tuple(m) for m in _model_lists(gw, 6)} == {("chat-model",)}
    gw.config.write_text(yaml.safe_dump(_with_new_model(data)))
    r = httpx.post(gw.url + "/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["reloaded"] is True and r.json()["workers"] == 2
    assert _model_lists(gw) == [["chat-model", "new-model"]] * 20


def test_sighup_to_one_worker_reloads_all(served: tuple[GatewayProcess, dict[str, Any], Path]
                                          ) -> None:
    gw, data, shared = served
    gw.config.write_text(yaml.safe_dump(_with_new_model(data)))
    worker = int(sorted(shared.glob("*.sock"))[0].stem)
    os.kill(worker, signal.SIGHUP)
    _wait_for(gw, "policy reloaded by a sibling worker")
    assert _model_lists(gw) == [["chat-model", "new-model"]] * 20


def test_invalid_policy_by_sighup_logs_one_line(
        served: tuple[GatewayProcess, dict[str, Any], Path]) -> None:
    """SIGHUP to a worker, and to the server itself (uvicorn then restarts its workers):
    the reason in one line as ``gateway check`` words it, no traceback, the old policy kept."""
    gw, data, shared = served
    bad = yaml.safe_load(yaml.safe_dump(data))
    bad["pools"][0]["backends"][0]["max_in_flight"] = "many"
    gw.config.write_text(yaml.safe_dump(bad))
    reason = "$.pools[0].backends[0].max_in_flight: Expected `int`, got `str`"
    os.kill(int(sorted(shared.glob("*.sock"))[0].stem), signal.SIGHUP)
    _wait_for(gw, reason)
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGHUP)
    out = _wait_for(gw, reason, count=2)
    assert "Traceback" not in out, out
    assert f"gateway: invalid policy: {gw.config}: {reason}" in out or \
        f"rejected, keeping the old policy: {gw.config}: {reason}" in out
    assert {tuple(m) for m in _model_lists(gw, 6)} == {("chat-model",)}
