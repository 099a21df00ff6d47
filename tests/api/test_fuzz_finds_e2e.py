"""Requests schemathesis found answering 500, each now a 400 naming its parameter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
ADMIN = "admin-fuzz-finds"


@pytest.fixture(scope="module")
def gw(sim: SimServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp: Path = tmp_path_factory.mktemp("finds")
    data = policy({"chat": [sim.url]})
    data["batch"] = {"files_dir": str(tmp / "files")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
        proc = GatewayProcess(tmp, data).start()
    yield proc
    proc.stop()


@pytest.mark.parametrize("window", [{}, [], 24, None])
def test_batch_with_a_non_string_window_is_400(gw: GatewayProcess, window: object) -> None:
    r = httpx.post(gw.url + "/v1/batches", headers=AUTH, timeout=30, json={
        "input_file_id": "file-x", "endpoint": "/v1/embeddings", "completion_window": window})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "completion_window"


@pytest.mark.parametrize("day", ["", "yesterday", "2024-13-01"])
def test_reconcile_with_a_bad_day_is_400(gw: GatewayProcess, day: str) -> None:
    r = httpx.get(gw.url + "/admin/usage/reconcile", timeout=30,
                  headers={"Authorization": f"Bearer {ADMIN}"},
                  params={"tenant": "t", "day": day})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "day"
