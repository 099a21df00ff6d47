"""A backend answering hostile usage, through a real gateway process (issue 34, point 7).

``prompt_tokens: 1e30`` (and ``10**30``, ``"12"``, ``true``, ``null``, ``-1``, ``10**12`` for a
prompt of a few tokens, more output than ``max_tokens``, a cache figure of ``10**12``), whole
and streamed, in chat and through a Messages client: every request still leaves its usage
record in the ledger (SQLite, and PostgreSQL), marked ``estimated`` with the reason, holding
the gateway's own counts; the quota is settled with those counts (the next request sees them
in ``x-ratelimit-remaining-tokens``: before the fix the ``10**30`` spent the quota and every
later request was a 429); the client of a translated answer is not shown a figure refused on
reading; and ``gateway_backend_usage_rejected_total`` counts each answer per backend and reason.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.accounting import PromptCounter
from tests.helpers import TEST_KEY, GatewayProcess, policy, wait_usage_records
from tests.ports import free_port

pytestmark = pytest.mark.process

ADMIN = "admin-hostile-usage-test"
AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
REPLY = ["The Danube", ", the Rhine", " and the Volga."]
MAX_TOKENS = 16
TOKENS_PER_MINUTE = 1_000_000
HUGE = 10**30

#: (case, streamed, the usage the backend answers, the reason the record gives; None: believed)
CASES: list[tuple[str, bool, Any, str | None]] = [
    ("float", False, {"prompt_tokens": 1e30, "completion_tokens": 3}, "not_integer:prompt_tokens"),
    ("bigint", False, {"prompt_tokens": HUGE, "completion_tokens": 3}, "too_large:prompt_tokens"),
    ("string", False, {"prompt_tokens": "12", "completion_tokens": 3},
     "not_integer:prompt_tokens"),
    ("bool", False, {"prompt_tokens": True, "completion_tokens": 3}, "not_integer:prompt_tokens"),
    ("null", False, {"prompt_tokens": 9, "completion_tokens": None}, "null:completion_tokens"),
    ("negative", False, {"prompt_tokens": -1, "completion_tokens": 3}, "negative:prompt_tokens"),
    ("tera", False, {"prompt_tokens": 10**12, "completion_tokens": 3},
     "too_large:prompt_tokens"),
    ("output", False, {"prompt_tokens": 9, "completion_tokens": 10**6},
     "too_large:completion_tokens"),
    ("cached", False, {"prompt_tokens": 9, "completion_tokens": 3,
                       "prompt_tokens_details": {"cached_tokens": 10**12}}, "too_large:details"),
    ("stream-bigint", True, {"prompt_tokens": HUGE, "completion_tokens": 3},
     "too_large:prompt_tokens"),
    ("stream-float", True, {"prompt_tokens": 9, "completion_tokens": 1e30},
     "not_integer:completion_tokens"),
    ("stream-null", True, {"prompt_tokens": None, "completion_tokens": 3},
     "null:prompt_tokens"),
    ("honest", False, {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}, None),
    ("honest-stream", True, {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
     None),
]
#: a Messages client, translated to the chat backend: (case, streamed, usage, reason)
MESSAGES = [
    ("messages-float", False, {"prompt_tokens": 1e30, "completion_tokens": 3},
     "not_integer:prompt_tokens"),
    ("messages-stream-float", True, {"prompt_tokens": 9, "completion_tokens": 1e30},
     "not_integer:completion_tokens"),
    ("messages-bigint", False, {"prompt_tokens": HUGE, "completion_tokens": 3},
     "too_large:prompt_tokens"),
]
USAGE = {case: usage for case, _, usage, _ in CASES + MESSAGES}


class HostileBackend:
    """A chat backend (aiohttp, in a thread) that answers ``REPLY`` with the usage of the
    case named by the last message, ``case <name>``, whole or streamed as asked."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        usage = USAGE[body["messages"][-1]["content"].removeprefix("case ")]
        encode = json.dumps  # floats such as 1e30 and big integers, as a backend may write them
        if not body.get("stream"):
            return web.Response(content_type="application/json", text=encode({
                "id": "chatcmpl-hostile", "object": "chat.completion", "created": 0,
                "model": body["model"], "usage": usage,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "".join(REPLY)}}]}))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        head = {"id": "chatcmpl-hostile", "object": "chat.completion.chunk", "created": 0,
                "model": body["model"]}
        events = [{**head, "choices": [{"index": 0, "delta": {"content": piece}}]}
                  for piece in REPLY]
        events.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        events.append({**head, "choices": [], "usage": usage})
        for event in events:
            await response.write(b"data: " + encode(event).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._started.set()
        self._loop.run_forever()

    def __enter__(self) -> HostileBackend:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(params=["sqlite", "postgresql"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[GatewayProcess]:
    """A gateway in front of the hostile backend, on the embedded SQLite ledger or on
    PostgreSQL; one key, a token quota, prices."""
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
        out = subprocess.run([sys.executable, "-m", "gateway", "db", "migrate", "--url", url],
                             capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        monkeypatch.setenv("GATEWAY_LEDGER_URL", url)
    with HostileBackend() as backend:
        data = policy({"chat": [backend.url]})
        data["auth"]["keys"][0]["tenant"] = "acme"
        data["plans"] = [{"name": "p", "limits": {"tpm": TOKENS_PER_MINUTE}}]
        data["tenants"] = [{"name": "acme", "plan": "p"}]
        data["prices"] = {"models": {"chat-model": {"input": "1.5", "output": "6"}}}
        with GatewayProcess(tmp_path, data) as gw:
            yield gw


def _chat(gw: GatewayProcess, case: str, stream: bool) -> tuple[str, str]:
    """(the gateway's request id, the text the client read)."""
    payload: dict[str, Any] = {"model": "chat-model", "max_tokens": MAX_TOKENS, "stream": stream,
                               "messages": [{"role": "user", "content": f"case {case}"}]}
    r = httpx.post(gw.url + "/v1/chat/completions", json=payload, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return r.headers["x-request-id"], r.text


def _messages(gw: GatewayProcess, case: str, stream: bool) -> tuple[str, str]:
    payload = {"model": "chat-model", "max_tokens": MAX_TOKENS, "stream": stream,
               "messages": [{"role": "user", "content": f"case {case}"}]}
    r = httpx.post(gw.url + "/v1/messages", json=payload, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return r.headers["x-request-id"], r.text


def _records(gw: GatewayProcess, n: int) -> dict[str, dict[str, Any]]:
    """The exported records, once there are ``n`` (the ledger flushes in the background)."""
    records = wait_usage_records(gw.url, ADMIN, lambda records: len(records) >= n, within=30)
    return {rec["request_id"]: rec for rec in records}


def _rejections(gw: GatewayProcess) -> Counter[str]:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_backend_usage_rejected_total":
                assert sample.labels["backend"] == "chat-0", sample
                assert sample.labels["pool"] == "chat", sample
                counts[sample.labels["reason"]] += int(sample.value)
    return counts


def test_hostile_usage_is_recorded_as_the_gateways_estimate(gateway: GatewayProcess) -> None:
    counter = PromptCounter()
    output = counter.count_text("".join(REPLY))
    sent: dict[str, tuple[str, str | None]] = {}  # request id -> (case, reason)
    for case, stream, _, reason in CASES:
        request_id, text = _chat(gateway, case, stream)
        assert "".join(REPLY) in text or all(piece in text for piece in REPLY)
        sent[request_id] = (case, reason)
    for case, stream, _, reason in MESSAGES:
        request_id, text = _messages(gateway, case, stream)
        if "float" in case:  # a figure refused on reading is not shown to the client either
            # (as a JSON number: the ids are random hex, which may hold "1e30")
            assert re.search(r":\s*1e\+?30\b", text) is None, text
        sent[request_id] = (case, reason)

    records = _records(gateway, len(sent))
    assert set(records) == set(sent)  # every request is in the ledger, none quarantined
    for request_id, (case, reason) in sent.items():
        record = records[request_id]
        if reason is None:  # an honest backend's figures stand
            assert (record["prompt_total"], record["output"], record["estimated"],
                    record["estimate_reason"]) == (11, 7, False, None), case
            continue
        assert record["estimated"] is True, case
        assert record["estimate_reason"] == reason, case
        assert record["output"] == output, case
        assert record["cached"] == record["cache_write"] == record["reasoning"] == 0, case
        prompt = counter.count_chat(
            {"messages": [{"role": "user", "content": f"case {case}"}]}).total
        if case.startswith("messages"):  # the translated prompt: the same few tokens
            assert 0 < record["prompt_total"] <= prompt + 8, case
        else:
            assert record["prompt_total"] == prompt, case
        assert 0 < record["cost_micros"] < 1_000, case

    # the quota was settled with the records' figures, not the backend's
    used = sum(r["prompt_total"] + r["output"] for r in records.values())
    assert used < 1_000
    r = httpx.post(gateway.url + "/v1/chat/completions", headers=AUTH, timeout=30, json={
        "model": "chat-model", "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": "case honest"}]})
    assert r.status_code == 200, r.text
    reserved = counter.count_chat(
        {"messages": [{"role": "user", "content": "case honest"}]}).total + MAX_TOKENS
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == (
        TOKENS_PER_MINUTE - used - reserved)

    expected = Counter(reason.partition(":")[0] for _, _, _, reason in CASES + MESSAGES
                       if reason is not None)
    assert _rejections(gateway) == expected
