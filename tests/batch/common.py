"""Shared pieces of the batch tests: policies, input files, a polling helper."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import openai

from tests.helpers import TEST_KEY, policy, usage_records

OTHER_KEY = "sk-gw-other-batchtenant-0123456789abcdef012345"
ADMIN = "admin-batch-test"
MODEL = "m"


def batch_policy(chat_url: str, batch_url: str, files_dir: Path, **batch: Any) -> dict[str, Any]:
    """An interactive pool and a batch pool serving one model; two tenants."""
    data = policy({"chat": [chat_url], "batch": [batch_url]})
    data["models"] = [{"name": MODEL, "pool": "chat", "pools": {"batch": "batch"},
                       "backend_model": "sim-model"}]
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["auth"]["keys"].append({"id": "other", "tenant": "globex",
                                 "sha256": hashlib.sha256(OTHER_KEY.encode()).hexdigest()})
    data["plans"] = [{"name": "p", "limits": {"rpm": 1_000_000}}]
    data["tenants"] = [{"name": "acme", "plan": "p"}, {"name": "globex", "plan": "p"}]
    data["prices"] = {"models": {MODEL: {"input": "1", "output": "2"}}, "batch_factor": "0.5"}
    data["batch"] = {"files_dir": str(files_dir), "lease_seconds": 3.0, "poll_interval": 0.2,
                     **batch}
    data["store"] = {"data_dir": str(files_dir.parent / f"{files_dir.name}-data"),
                     "spool_dir": str(files_dir.parent / f"{files_dir.name}-spool")}
    return data


def jsonl(n: int, *, max_tokens: int = 4, prefix: str = "req") -> bytes:
    """``n`` chat requests, custom ids ``<prefix>-<i>``."""
    return b"".join(
        json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": MODEL, "max_tokens": max_tokens,
                             "messages": [{"role": "user", "content": f"Question {i}?"}]}}
                   ).encode() + b"\n"
        for i in range(n))


def client(url: str, key: str = TEST_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)


def wait_status(c: openai.OpenAI, batch_id: str, statuses: set[str], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = c.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status}: {batch.request_counts}")
        time.sleep(0.2)


def records(url: str) -> list[dict[str, Any]]:
    """Every usage record of the last hour (admin export)."""
    return usage_records(url, ADMIN)
