"""Shadow answers compared, end to end: a real gateway process, a primary and a shadow
simulator, and the report at ``GET /admin/shadow/{model}``.

The simulator's text is a function of the prompt (and the request's ``seed``): two simulators
of one profile give the same answer word for word, so a shadow of the same profile agrees.
A shadow that ends its answers sooner (``default_max_tokens=8`` against the primary's 64, for
requests that set no ``max_tokens``) gives the first 8 words of the primary's 64: ROUGE-1 F
2*8/72 = 0.22, a disagreement.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

ADMIN = "admin-test-token"
CLOSED_KEY = "sk-gw-closed-0123456789abcdef0123456789abcdef01"
MODEL = "chat-model"


def _policy(primary: str, shadow: str | None, share: float = 1.0) -> dict[str, Any]:
    """One model on the primary pool, mirrored to the shadow pool; two tenants, one whose
    content may be recorded (TEST_KEY) and one whose may not (CLOSED_KEY)."""
    data = policy({"chat": [primary], **({"shadow": [shadow]} if shadow else {})})
    data["models"] = [{"name": MODEL, "pool": "chat", "backend_model": "sim-model"}]
    if shadow is not None:
        data["models"][0]["shadow"] = {"pool": "shadow", "share": share, "version": "next"}
    data["auth"]["keys"] = [
        {"id": "open", "sha256": hashlib.sha256(TEST_KEY.encode()).hexdigest(),
         "tenant": "open"},
        {"id": "closed", "sha256": hashlib.sha256(CLOSED_KEY.encode()).hexdigest(),
         "tenant": "closed"},
    ]
    data["plans"] = [{"name": "basic"}]
    data["tenants"] = [{"name": "open", "plan": "basic", "record_content": True},
                       {"name": "closed", "plan": "basic"}]
    return data


@contextmanager
def _gateway(tmp: Path, data: dict[str, Any]) -> Iterator[GatewayProcess]:
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        with GatewayProcess(tmp, data) as gw:
            yield gw
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)


def _chat(gw: GatewayProcess, prompt: str, *, stream: bool = False, key: str = TEST_KEY,
          **body: Any) -> httpx.Response:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
               "stream": stream, **body}
    r = httpx.post(gw.url + "/v1/chat/completions", json=payload,
                   headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r


def _report(gw: GatewayProcess, model: str = MODEL) -> httpx.Response:
    return httpx.get(f"{gw.url}/admin/shadow/{model}",
                     headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)


def _settled(gw: GatewayProcess, n: int) -> dict[str, Any]:
    """The report once ``n`` comparisons are filed (shadows finish after their primaries)."""
    deadline = time.monotonic() + 30
    while True:
        r = _report(gw)
        assert r.status_code == 200, r.text
        report: dict[str, Any] = r.json()
        if sum(report["compared"].values()) >= n or time.monotonic() > deadline:
            return report
        time.sleep(0.1)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_same_profile_agrees(tmp_path: Path, stream: bool) -> None:
    """A shadow of the same profile gives the same words: every comparison agrees, exactly;
    the report and the metrics say so."""
    with SimServer("interactive", speedup=20, jitter=0.0) as primary, \
            SimServer("interactive", speedup=20, jitter=0.0) as shadow, \
            _gateway(tmp_path, _policy(primary.url, shadow.url)) as gw:
        for i in range(4):
            _chat(gw, f"same question {i}", stream=stream, max_tokens=12)
        report = _settled(gw, 4)
        assert report["compared"] == {"agree": 4, "disagree": 0, "error": 0}
        assert report["agreement_rate"] == 1.0
        assert report["versions"]["next"]["agree"] == 4
        assert report["shadow"]["version"] == "next"
        window = report["window"]
        assert window["similarity"]["p10"] == 1.0
        assert window["output_tokens_ratio"] == 1.0
        assert window["finish_reason_match"] == 1.0
        assert window["status"] == {"primary": {"200": 4}, "shadow": {"200": 4}}
        assert window["ttft"]["ratio_p50"] is not None
        assert window["duration"]["ratio_p90"] is not None
        assert report["disagreeing"] == []
        metrics = httpx.get(gw.url + "/metrics").text
        assert re.search(r'gateway_shadow_compared_total\{model="chat-model",outcome="agree",'
                         r'version="next"\} 4\.0', metrics) or re.search(
            r'gateway_shadow_compared_total\{model="chat-model",version="next",'
            r'outcome="agree"\} 4\.0', metrics), metrics
        assert 'gateway_shadow_similarity_bucket{le="1.0",model="chat-model",version="next"} 4.0' \
            in metrics or 'gateway_shadow_similarity_bucket{model="chat-model",version="next",' \
            'le="1.0"} 4.0' in metrics
        assert "gateway_shadow_latency_ratio_count" in metrics


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_shorter_shadow_disagrees(tmp_path: Path, stream: bool) -> None:
    """A shadow that stops after 8 words disagrees; its example carries the texts for the
    tenant whose content may be recorded, and none for the tenant whose may not."""
    with SimServer("interactive", speedup=20, jitter=0.0) as primary, \
            SimServer("interactive", speedup=20, jitter=0.0, default_max_tokens=8) as shadow, \
            _gateway(tmp_path, _policy(primary.url, shadow.url)) as gw:
        opened = _chat(gw, "tell me more", stream=stream)
        _chat(gw, "a secret question", stream=stream, key=CLOSED_KEY)
        report = _settled(gw, 2)
        assert report["compared"] == {"agree": 0, "disagree": 2, "error": 0}
        assert report["agreement_rate"] == 0.0
        assert report["window"]["output_tokens_ratio"] == pytest.approx(8 / 64)
        assert report["window"]["similarity"]["p50"] == pytest.approx(2 * 8 / 72, abs=0.05)
        assert report["window"]["finish_reason_match"] == 1.0  # both ended naturally: stop
        kept, withheld = report["disagreeing"]
        assert (kept["tenant"], withheld["tenant"]) == ("open", "closed")
        primary_text = kept["primary"]["text"]
        if not stream:
            assert primary_text == opened.json()["choices"][0]["message"]["content"]
        assert kept["shadow"]["text"].split() == primary_text.split()[:8]
        assert "text" not in withheld["primary"] and "text" not in withheld["shadow"]
        assert "not recorded" in withheld["content"]
        assert "secret" not in _report(gw).text
        assert (withheld["primary"]["output_tokens"], withheld["shadow"]["output_tokens"]) == (
            64, 8)


def test_failing_shadow_is_an_error_not_a_disagreement(tmp_path: Path) -> None:
    """A shadow answering 500 is counted as an error, with its status in the mix."""
    with SimServer("interactive", speedup=20, jitter=0.0) as primary, \
            SimServer("interactive", speedup=20, jitter=0.0, error_status=500) as shadow, \
            _gateway(tmp_path, _policy(primary.url, shadow.url)) as gw:
        for i in range(3):
            _chat(gw, f"q{i}", max_tokens=4)
        report = _settled(gw, 3)
        assert report["compared"] == {"agree": 0, "disagree": 0, "error": 3}
        assert report["agreement_rate"] is None
        assert report["window"]["status"] == {"primary": {"200": 3}, "shadow": {"500": 3}}


def test_report_for_unknown_model_and_without_admin(tmp_path: Path) -> None:
    """An unknown model is a 404 in the API's error shape; without the admin token the route
    does not exist."""
    with SimServer("interactive", speedup=20, jitter=0.0) as primary, \
            _gateway(tmp_path, _policy(primary.url, None)) as gw:
        r = _report(gw, "no-such-model")
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "model_not_found"
        r = _report(gw)  # a model without a shadow: an empty report
        assert r.status_code == 200 and r.json()["shadow"] is None
        assert r.json()["compared"] == {"agree": 0, "disagree": 0, "error": 0}
        r = httpx.get(f"{gw.url}/admin/shadow/{MODEL}", timeout=10)
        assert r.status_code == 401


_VARYING = re.compile(rb'"(id|created|system_fingerprint)":("[^"]*"|\d+)')


def _masked(body: bytes) -> bytes:
    """The body with the fields that differ between any two calls (ids, timestamps) masked."""
    return _VARYING.sub(rb'"\1":"*"', body)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_primary_identical_with_shadowing_on_and_off(tmp_path: Path, stream: bool) -> None:
    """The client's bytes are the same with every request mirrored (to a shadow that differs)
    as without a shadow, ids and timestamps aside."""
    with SimServer("interactive", speedup=20, jitter=0.0) as primary, \
            SimServer("interactive", speedup=20, jitter=0.0, default_max_tokens=8) as shadow, \
            _gateway(tmp_path, _policy(primary.url, shadow.url)) as on, \
            _gateway(tmp_path, _policy(primary.url, None)) as off:
        for i in range(3):
            body: dict[str, Any] = {"max_tokens": 16} if i else {}
            a, b = (_chat(gw, f"identical {i}", stream=stream, **body) for gw in (on, off))
            assert a.headers["content-type"] == b.headers["content-type"]
            assert _masked(a.content) == _masked(b.content)
        assert sum(_settled(on, 3)["compared"].values()) == 3


def test_compare_off_mirrors_without_comparing(tmp_path: Path) -> None:
    """``shadow.compare: false`` mirrors every request (as before comparisons) and files
    no comparison."""
    with SimServer("interactive", speedup=20, jitter=0.0) as primary, \
            SimServer("interactive", speedup=20, jitter=0.0) as shadow:
        data = _policy(primary.url, shadow.url)
        data["models"][0]["shadow"]["compare"] = False
        with _gateway(tmp_path, data) as gw:
            for i in range(3):
                _chat(gw, f"q{i}", max_tokens=4)
            deadline = time.monotonic() + 30
            while shadow.stats()["completed"] < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert shadow.stats()["completed"] == 3
            assert _report(gw).json()["compared"] == {"agree": 0, "disagree": 0, "error": 0}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("mode", ["translated", "passthrough"])
def test_messages_api_primary_is_compared(tmp_path: Path, mode: str, stream: bool) -> None:
    """An Anthropic Messages request is mirrored as chat and compared with the primary's
    answer, whether the primary was translated to chat or passed through to a backend that
    speaks Messages (its text blocks and stop reason read from the Anthropic shape)."""
    with SimServer("interactive", speedup=20, jitter=0.0) as primary, \
            SimServer("interactive", speedup=20, jitter=0.0) as shadow:
        data = _policy(primary.url, shadow.url)
        if mode == "passthrough":
            data["pools"][0]["backends"][0]["api"] = ["messages"]
        with _gateway(tmp_path, data) as gw:
            for i in range(2):
                r = httpx.post(gw.url + "/v1/messages", timeout=30,
                               headers={"x-api-key": TEST_KEY},
                               json={"model": MODEL, "max_tokens": 10, "stream": stream,
                                     "messages": [{"role": "user", "content": f"m{i}"}]})
                assert r.status_code == 200, r.text
            report = _settled(gw, 2)
            assert report["compared"] == {"agree": 2, "disagree": 0, "error": 0}, report
            assert report["window"]["output_tokens_ratio"] == 1.0
            assert report["window"]["finish_reason_match"] == 1.0  # max_tokens reads length
