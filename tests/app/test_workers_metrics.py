"""Under ``gateway serve --workers 2`` a scrape counts every request answered before it, by
whichever worker (issue 14, point 23: a scrape right after 10 requests showed 9)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process


def _answered(text: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "gateway_requests_total" and s.labels.get("model") == "chat-model")


def test_scrape_counts_both_workers(tmp_path: Path) -> None:
    with SimServer("interactive", speedup=20) as sim, \
            GatewayProcess(tmp_path, policy({"chat": [sim.url]}), workers=2) as gw:
        body = {"model": "chat-model", "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]}
        for round_ in range(1, 6):
            for _ in range(10):
                with httpx.Client(timeout=60) as client:  # new connection: either worker
                    r = client.post(gw.url + "/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {TEST_KEY}"})
                    assert r.status_code == 200, r.text
            with httpx.Client(timeout=60) as client:
                scrape = client.get(gw.url + "/metrics")
            assert scrape.status_code == 200
            assert _answered(scrape.text) == 10 * round_, (round_, gw.output()[-2000:])
