"""A batch stops when the key that created it is revoked: no new line runs or bills."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.sim.server import SimServer
from tests.batch.common import batch_policy, client, jsonl, records, wait_status
from tests.helpers import GatewayProcess

pytestmark = pytest.mark.process

SECRET = "batch-key-secret-0123456789"
ADMIN = "admin-batch-test"


def test_revoked_keys_batch_is_cancelled(tmp_path: Path) -> None:
    os.environ["GATEWAY_KEY_SECRET"] = SECRET
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        with SimServer("interactive", speedup=20) as chat, \
                SimServer("batch", speedup=2, jitter=0.0) as bulk:
            data = batch_policy(chat.url, bulk.url, tmp_path / "files", max_in_flight=2)
            data["auth"] = {"keys": [], "cache_ttl": 0.3}
            data["store"] = {"keys_file": str(tmp_path / "keys.json")}
            (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
            with GatewayProcess(tmp_path, data) as gw:
                admin = {"Authorization": f"Bearer {ADMIN}"}
                made = httpx.post(gw.url + "/admin/keys", json={"tenant": "acme"},
                                  headers=admin).json()
                c = client(gw.url, made["key"])
                upload = c.files.create(file=("in.jsonl", io.BytesIO(
                    jsonl(400, max_tokens=40))), purpose="batch")
                batch = c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                         completion_window="24h")
                wait_status(c, batch.id, {"in_progress"}, 30)
                deadline = time.monotonic() + 30
                while not records(gw.url) and time.monotonic() < deadline:
                    time.sleep(0.1)  # some lines have run
                r = httpx.post(gw.url + f"/admin/keys/{made['id']}/revoke", headers=admin)
                assert r.status_code == 200
                # the key no longer reads its batch; the admin's view is the ledger
                deadline = time.monotonic() + 60
                while True:
                    before = len(records(gw.url))
                    time.sleep(2.0)  # the key cache (0.3 s) and lines in flight (2) drain
                    after = len(records(gw.url))
                    if after == before or time.monotonic() > deadline:
                        break
                assert after == before, "lines kept running after the key was revoked"
                assert 0 < after < 400
                assert "revoked or expired; cancelling the batch" in gw.output()
    finally:
        os.environ.pop("GATEWAY_KEY_SECRET", None)
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)
