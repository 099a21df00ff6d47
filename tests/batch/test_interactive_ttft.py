"""Interactive requests keep their TTFT while a batch runs on the batch pool (p99 within
1.5x of the idle p99)."""

from __future__ import annotations

import io
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.batch.common import (
    ADMIN,
    MODEL,
    SimProcess,
    batch_policy,
    client,
    jsonl,
    wait_status,
)
from tests.helpers import TEST_KEY, GatewayProcess

STREAMS = 4
PER_STREAM = 100  # p99 of 400 samples: the 4th largest, not a single outlier


def _ttfts(url: str) -> list[float]:
    """TTFT (s) of STREAMS x PER_STREAM streamed chats, each stream sequential."""
    body = {"model": MODEL, "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "How are you today?"}]}

    def one_stream(_: int) -> list[float]:
        out = []
        with httpx.Client(headers={"Authorization": f"Bearer {TEST_KEY}"}, timeout=30) as h:
            for _ in range(PER_STREAM):
                start = time.perf_counter()
                with h.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    first = None
                    for chunk in r.iter_bytes():
                        if first is None and b"content" in chunk:
                            first = time.perf_counter() - start
                    assert first is not None
                    out.append(first)
        return out

    with ThreadPoolExecutor(STREAMS) as pool:
        return [t for part in pool.map(one_stream, range(STREAMS)) for t in part]


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def test_interactive_ttft_p99_holds_during_a_batch(tmp_path: Path) -> None:
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        with SimProcess("interactive", "--jitter", "0") as chat, \
                SimProcess("batch", "--jitter", "0") as bulk, \
                GatewayProcess(tmp_path, batch_policy(chat.url, bulk.url,
                                                      tmp_path / "files")) as gw:
            _ttfts(gw.url)  # warm up connections and caches
            idle = _p99(_ttfts(gw.url))
            c = client(gw.url)
            uploaded = c.files.create(file=("in.jsonl", io.BytesIO(jsonl(6000, max_tokens=128))),
                                      purpose="batch")
            batch = c.batches.create(input_file_id=uploaded.id,
                                     endpoint="/v1/chat/completions", completion_window="24h")
            wait_status(c, batch.id, {"in_progress"}, timeout=10)
            time.sleep(0.5)
            busy = _p99(_ttfts(gw.url))
            during = c.batches.retrieve(batch.id)
            assert during.status == "in_progress", "the batch ended before the measurement did"
            assert during.request_counts is not None and during.request_counts.completed > 0
            print(f"interactive TTFT p99: idle {idle * 1000:.1f} ms, during batch"
                  f" {busy * 1000:.1f} ms ({during.request_counts.completed} lines done)")
            assert busy <= 1.5 * idle, (idle, busy)
            c.batches.cancel(batch.id)
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)
