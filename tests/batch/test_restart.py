"""Durability: a gateway killed with SIGKILL mid-batch, restarted on the same Redis and
files_dir, finishes the batch with every line done once and billed once; two worker
processes share one batch without running a line twice."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from gateway.sim.server import SimServer
from tests.batch.common import ADMIN, batch_policy, client, jsonl, records, wait_status
from tests.helpers import GatewayProcess
from tests.redis_servers import RedisProc

pytestmark = pytest.mark.process


@pytest.fixture
def redis(gateway_redis: RedisProc, monkeypatch: pytest.MonkeyPatch) -> RedisProc:
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    return gateway_redis


def _check_exactly_once(url: str, batch_id: str, n: int) -> None:
    c = client(url)
    done = c.batches.retrieve(batch_id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (n, 0)
    assert done.output_file_id is not None
    lines = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in lines) == sorted(f"req-{i}" for i in range(n))
    ours = [r for r in records(url) if r.get("batch_id") == batch_id]
    ids = [r["request_id"] for r in ours]
    assert len(ids) == len(set(ids)) == n, (len(ids), len(set(ids)))
    assert set(ids) == {f"{batch_id}_{i}" for i in range(n)}
    assert all(r["outcome"] == "completed" and r["output"] > 0 for r in ours)


def test_sigkill_mid_batch_resumes_exactly_once(tmp_path: Path, redis: RedisProc) -> None:
    n = 3000
    with SimServer("interactive", speedup=20, jitter=0.0) as chat, \
            SimServer("batch", speedup=10, jitter=0.0) as bulk:
        data = batch_policy(chat.url, bulk.url, tmp_path / "files", lease_seconds=2.0,
                            poll_interval=0.2)
        first = GatewayProcess(tmp_path, data).start()
        try:
            c = client(first.url)
            uploaded = c.files.create(file=("in.jsonl", io.BytesIO(jsonl(n, max_tokens=48))),
                                      purpose="batch")
            batch = c.batches.create(input_file_id=uploaded.id,
                                     endpoint="/v1/chat/completions", completion_window="24h")
            deadline = time.monotonic() + 30
            while True:
                counts = c.batches.retrieve(batch.id).request_counts
                assert counts is not None
                if counts.completed >= n // 4:
                    break
                assert time.monotonic() < deadline, counts
                time.sleep(0.05)
        finally:
            assert first.proc is not None
            first.proc.kill()  # SIGKILL: no drain, no final checkpoint, leases left behind
            first.proc.wait()
            first.stop()
        assert counts.completed < n, "the batch finished before the kill: make it slower"
        served_before = bulk.stats()
        with GatewayProcess(tmp_path, data) as second:
            c = client(second.url)
            assert c.batches.retrieve(batch.id).status == "in_progress"
            wait_status(c, batch.id, {"completed", "failed"}, timeout=60)
            _check_exactly_once(second.url, batch.id, n)
        print(f"killed at {counts.completed}/{n}; sim stats before restart: "
              f"{ {k: v for k, v in served_before.items() if 'total' in k} }")


def test_two_workers_share_a_batch_exactly_once(tmp_path: Path, redis: RedisProc) -> None:
    n = 2000
    with SimServer("interactive", speedup=20, jitter=0.0) as chat, \
            SimServer("batch", speedup=20, jitter=0.0) as bulk:
        data = batch_policy(chat.url, bulk.url, tmp_path / "files", chunk_lines=16)
        data["store"] = {"processes": 2}
        with GatewayProcess(tmp_path, data, workers=2) as gw:
            c = client(gw.url)
            uploaded = c.files.create(file=("in.jsonl", io.BytesIO(jsonl(n, max_tokens=8))),
                                      purpose="batch")
            batch = c.batches.create(input_file_id=uploaded.id,
                                     endpoint="/v1/chat/completions", completion_window="24h")
            wait_status(c, batch.id, {"completed", "failed"}, timeout=60)
            _check_exactly_once(gw.url, batch.id, n)
            backends = {r["backend"] for r in records(gw.url) if r.get("batch_id") == batch.id}
            assert backends == {"batch-0"}
