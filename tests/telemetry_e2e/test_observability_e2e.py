"""Traces, metrics and logs of a real gateway process under a known workload."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.telemetry.test_otlp_export import Collector, _value

pytestmark = pytest.mark.process

BACKEND_SECRET = "backend-secret-value-XYZ123"
ADMIN = "admin-secret-token-ABC987"
PROMPT = "my confidential prompt text 4242"


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_known_workload_traces_metrics_logs(tmp_path: Path) -> None:
    collector = Collector()
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "GATEWAY_ADMIN_TOKEN": ADMIN,
        "SIM_BACKEND_KEY": BACKEND_SECRET,
    }
    os.environ.update(env)
    try:
        with SimServer("interactive", speedup=10, jitter=0.0) as sim:
            data = policy({"chat": [sim.url]})
            data["pools"][0]["backends"][0]["api_key_env"] = "SIM_BACKEND_KEY"
            gw = GatewayProcess(tmp_path, data).start()
            try:
                client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
                traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                for i in range(3):
                    client.chat.completions.create(
                        model="chat-model", max_tokens=4,
                        messages=[{"role": "user", "content": PROMPT}],
                        extra_headers={"traceparent": traceparent} if i == 0 else None)
                list(client.chat.completions.create(
                    model="chat-model", max_tokens=6, stream=True,
                    messages=[{"role": "user", "content": PROMPT}]))
                bad = httpx.post(gw.url + "/v1/chat/completions",
                                 headers={"Authorization": "Bearer sk-gw-wrong-key"},
                                 json={"model": "chat-model", "messages": []})
                assert bad.status_code == 401
                r = httpx.post(gw.url + "/v1/chat/completions",
                               headers={"Authorization": f"Bearer {TEST_KEY}",
                                        "x-sim-error-status": "500"},
                               json={"model": "chat-model", "max_tokens": 2,
                                     "messages": [{"role": "user", "content": PROMPT}]})
                assert r.status_code == 502
                time.sleep(1.2)  # metrics reach prometheus_client at most once a second
                text = httpx.get(gw.url + "/metrics").text
                ok = _metric(text, "gateway_requests_total", status="200")
                assert ok == 4, [ln for ln in text.splitlines() if "requests_total" in ln]
                assert _metric(text, "gateway_requests_total", status="502") == 1
                assert _metric(text, "gateway_tokens_total", kind="output") == 3 * 4 + 6
                assert _metric(text, "gateway_ttft_seconds_count") >= 1
                time.sleep(0.5)
            finally:
                gw.stop()
        # traces: one server span per request, GenAI attributes, the client's trace continued
        spans = [s for req in collector.requests for rs in req.resource_spans
                 for ss in rs.scope_spans for s in ss.spans]
        server = [s for s in spans if s.kind == 2]
        assert len(server) >= 5
        attrs = [{a.key: _value(a.value) for a in s.attributes} for s in server]
        chat = [a for a in attrs if a.get("gen_ai.request.model") == "chat-model"
                and a.get("gen_ai.usage.output_tokens") == 4]
        assert len(chat) == 3
        assert all(a["gen_ai.operation.name"] == "chat" for a in chat)
        assert any(s.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c" for s in server)
        assert not any(PROMPT in str(a) for a in attrs)  # content off by default
        assert any(s.kind == 3 for s in spans)  # a client span per upstream attempt
        # logs: JSON lines, one access line per request, no secret anywhere
        output = gw.output()
        lines = [json.loads(ln) for ln in output.splitlines() if ln.startswith("{")]
        access = [ln for ln in lines if ln.get("event") == "access"]
        assert len(access) >= 6, output[-2000:]
        for secret in (TEST_KEY, BACKEND_SECRET, ADMIN, PROMPT):
            assert secret not in output
        assert not re.search(r"sk-gw-[A-Za-z0-9_-]{20,}", output)
    finally:
        for key in env:
            os.environ.pop(key, None)
        collector.shutdown()
        collector.server_close()


def test_metrics_count_every_request_at_once(tmp_path: Path) -> None:
    """``/metrics`` right after the responses counts all of them: finished requests are
    counted in batches (``FinishedRequests``), and a scrape hands over what waits first."""
    with SimServer("interactive", speedup=50, jitter=0.0) as sim:
        gw = GatewayProcess(tmp_path, policy({"chat": [sim.url]})).start()
        try:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
            for n in (1, 7):
                for _ in range(n):
                    client.chat.completions.create(
                        model="chat-model", max_tokens=3,
                        messages=[{"role": "user", "content": "hi"}])
                text = httpx.get(gw.url + "/metrics").text  # no wait
                assert _metric(text, "gateway_requests_total", status="200") == (
                    1 if n == 1 else 8), [ln for ln in text.splitlines() if "requests_t" in ln]
                assert _metric(text, "gateway_tokens_total", kind="output") == 3 * (
                    1 if n == 1 else 8)
        finally:
            gw.stop()
