"""The official client runs a 1,000-line batch end to end; bad files are refused; cancel."""

from __future__ import annotations

import io
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.sim.server import SimServer
from tests.batch.common import (
    ADMIN,
    OTHER_KEY,
    batch_policy,
    client,
    jsonl,
    records,
    wait_status,
)
from tests.helpers import TEST_KEY, GatewayProcess

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("batch")
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        with SimServer("interactive", speedup=20, jitter=0.0) as chat, \
                SimServer("batch", speedup=40, jitter=0.0) as bulk, \
                GatewayProcess(tmp, batch_policy(chat.url, bulk.url, tmp / "files")) as gw:
            yield gw
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)


def test_thousand_lines_complete_with_matching_outputs(gateway: GatewayProcess) -> None:
    """Upload, create, poll to completed, download: one output per custom_id, billed once."""
    c = client(gateway.url)
    uploaded = c.files.create(file=("in.jsonl", io.BytesIO(jsonl(1000))), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    assert c.files.retrieve(uploaded.id).id == uploaded.id
    batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                             completion_window="24h", metadata={"job": "t1"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"job": "t1"}
    started = time.monotonic()
    done = wait_status(c, batch.id, {"completed", "failed", "expired"}, timeout=60)
    elapsed = time.monotonic() - started
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (1000, 1000, 0)
    assert done.output_file_id and done.error_file_id is None
    assert done.completed_at and done.in_progress_at and done.finalizing_at
    lines = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in lines) == sorted(f"req-{i}" for i in range(1000))
    for line in lines:
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["response"]["body"]["choices"][0]["message"]["content"] is not None
    ours = [r for r in records(gateway.url) if r.get("batch_id") == batch.id]
    assert len(ours) == 1000 and len({r["request_id"] for r in ours}) == 1000
    assert all(r["request_class"] == "batch" and r["pool"] == "batch" for r in ours)
    usage = httpx.get(gateway.url + "/v1/usage", params={"group_by": "batch"},
                      headers={"Authorization": f"Bearer {TEST_KEY}"}).json()
    row = next(r for r in usage["data"] if r.get("batch_id") == batch.id)
    assert row["requests"] == 1000
    print(f"1000 lines in {elapsed:.1f}s")


def test_malformed_file_refused_with_line_numbers(gateway: GatewayProcess) -> None:
    c = client(gateway.url)
    good = jsonl(3).splitlines()
    bad = [good[0], b"{not json", good[1], good[1],  # duplicate custom_id on line 4
           json.dumps({"custom_id": "x", "method": "GET", "url": "/v1/chat/completions",
                       "body": {"model": "m", "messages": []}}).encode(),
           json.dumps({"custom_id": "y", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "nope", "messages": [{"role": "user",
                                                                "content": "hi"}]}}).encode()]
    with pytest.raises(openai.BadRequestError) as info:
        c.files.create(file=("bad.jsonl", io.BytesIO(b"\n".join(bad))), purpose="batch")
    message = info.value.message
    assert "line 2: not valid JSON" in message
    assert "line 4: custom_id 'req-1' is a duplicate of line 3" in message
    assert "line 5: 'method' must be POST" in message
    assert "line 6: model 'nope' is not served" in message
    # valid as a file, but not for the batch's endpoint
    ok = c.files.create(file=("ok.jsonl", io.BytesIO(jsonl(2))), purpose="batch")
    with pytest.raises(openai.BadRequestError) as info:
        c.batches.create(input_file_id=ok.id, endpoint="/v1/completions",
                         completion_window="24h")
    assert "line 1: url '/v1/chat/completions' differs from the batch endpoint" in (
        info.value.message)


def test_cancel_stops_new_lines_and_finalizes_counts(gateway: GatewayProcess) -> None:
    c = client(gateway.url)
    uploaded = c.files.create(file=("slow.jsonl", io.BytesIO(jsonl(3000, max_tokens=400))),
                              purpose="batch")
    batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                             completion_window="24h")
    wait_status(c, batch.id, {"in_progress"}, timeout=10)
    time.sleep(0.5)
    cancelling = c.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_status(c, batch.id, {"cancelled"}, timeout=30)
    counts = done.request_counts
    assert counts is not None and counts.total == 3000
    assert 0 < counts.completed < 3000 and counts.failed == 0
    assert done.cancelled_at and done.cancelling_at
    lines = c.files.content(done.output_file_id).text.splitlines() if done.output_file_id else []
    assert len(lines) == counts.completed
    time.sleep(1.0)  # nothing runs after the cancel settled
    ours = [r for r in records(gateway.url) if r.get("batch_id") == batch.id]
    assert len(ours) == counts.completed
    assert c.batches.retrieve(batch.id).request_counts == counts


def test_tenants_cannot_see_each_others_objects(gateway: GatewayProcess) -> None:
    mine, theirs = client(gateway.url), client(gateway.url, OTHER_KEY)
    uploaded = mine.files.create(file=("a.jsonl", io.BytesIO(jsonl(2))), purpose="batch")
    batch = mine.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                completion_window="24h")
    for call in (lambda: theirs.files.retrieve(uploaded.id),
                 lambda: theirs.files.content(uploaded.id),
                 lambda: theirs.files.delete(uploaded.id),
                 lambda: theirs.batches.retrieve(batch.id),
                 lambda: theirs.batches.cancel(batch.id),
                 lambda: theirs.batches.create(input_file_id=uploaded.id,
                                               endpoint="/v1/chat/completions",
                                               completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [b.id for b in theirs.batches.list()]
    assert batch.id in [b.id for b in mine.batches.list()]
    done = wait_status(mine, batch.id, {"completed"}, timeout=20)
    # every id the client sees carries 128 random bits (32 hex digits), the output file's too
    assert re.fullmatch(r"file-[0-9a-f]{32}", uploaded.id), uploaded.id
    assert re.fullmatch(r"batch_[0-9a-f]{32}", batch.id), batch.id
    assert done.output_file_id == f"file-{batch.id.removeprefix('batch_')}-output"
    assert mine.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        mine.files.retrieve(uploaded.id)


def test_list_paginates_newest_first(gateway: GatewayProcess) -> None:
    c = client(gateway.url, OTHER_KEY)
    uploaded = c.files.create(file=("p.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
    ids = [c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                            completion_window="24h").id for _ in range(5)]
    page = c.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    assert [b.id for b in c.batches.list(limit=2)] == ids[::-1]  # auto-pagination
    raw = httpx.get(gateway.url + "/v1/batches", params={"limit": 3, "after": ids[3]},
                    headers={"Authorization": f"Bearer {OTHER_KEY}"}).json()
    assert [b["id"] for b in raw["data"]] == ids[::-1][2:5]
    assert raw["first_id"] == ids[2] and raw["last_id"] == ids[0] and not raw["has_more"]


def test_files_dir_holds_the_files(gateway: GatewayProcess) -> None:
    files_dir = Path(gateway.config.parent / "files")
    assert any(p.suffix == ".jsonl" for p in files_dir.iterdir())
