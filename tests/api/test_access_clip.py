"""Client-supplied free text is cut in access lines: a 5 MB model name makes a short line.

Before, the 404 for an unknown model echoed the whole name into the access line (``model``
and ``error``), 10 MB of log for one request.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import structlog

from gateway.http.asgi import clip
from gateway.sim.server import SimServer
from gateway.telemetry.logging import FIELD_LIMIT, LogSettings, setup_logging
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.process_marker import starts_process
from tests.telemetry.fakes import finished

HUGE = "m" * 5_000_000


@pytest.mark.parametrize(("text", "limit", "expected"), [
    pytest.param("short", 10, "short", id="under"),
    pytest.param("x" * 10, 10, "x" * 10, id="at-limit"),
    pytest.param("abcdefghijkl", 4, "abcd...[8 more chars]", id="over"),
])
def test_clip(text: str, limit: int, expected: str) -> None:
    assert clip(text, limit) == expected


@pytest.fixture
def out() -> Iterator[io.BytesIO]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield io.BytesIO()
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


def test_access_line_cuts_model_and_error(out: io.BytesIO) -> None:
    """Both fields a client fills are cut and marked; the line stays small."""
    access = setup_logging(LogSettings(buffered=False), stream=out)
    ctx = finished(request_model=HUGE, status=404, outcome="rejected",
                   error=f"The model '{HUGE}' does not exist")
    access(ctx)
    raw = out.getvalue()
    assert len(raw) < 3 * FIELD_LIMIT + 1_000
    line = json.loads(raw)
    assert line["model"] == clip(HUGE)
    assert line["model"].endswith(f"...[{len(HUGE) - FIELD_LIMIT} more chars]")
    assert line["error"].startswith("The model 'mmm") and "more chars]" in line["error"]


def test_access_line_redacts_before_cutting(out: io.BytesIO) -> None:
    """A secret at the cut is never left half in the line."""
    secret = "sk-live-" + "s" * 40
    access = setup_logging(LogSettings(buffered=False, secrets=(secret,)), stream=out)
    error = "e" * (FIELD_LIMIT - 10) + secret + "tail" * 1_000
    access(finished(status=502, outcome="failed", error=error))
    assert "sk-live-" not in out.getvalue().decode()


@pytest.fixture(scope="module")
@starts_process
def gw(sim: SimServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp: Path = tmp_path_factory.mktemp("clip")
    with GatewayProcess(tmp, policy({"chat": [sim.url]}, max_body_bytes=8 * 1024 * 1024)
                        ) as proc:
        yield proc


def test_unknown_huge_model_makes_a_short_access_line(gw: GatewayProcess) -> None:
    """Through a live gateway (the proxy may cut its own message too: the line is short)."""
    body = json.dumps({"model": HUGE, "messages": [{"role": "user", "content": "hi"}]})
    r = httpx.post(gw.url + "/v1/chat/completions", content=body, timeout=60,
                   headers={"Authorization": f"Bearer {TEST_KEY}",
                            "Content-Type": "application/json"})
    assert r.status_code == 404, r.text[:300]
    request_id = r.headers["x-request-id"]
    deadline = time.monotonic() + 30
    while True:  # access lines are written in batches
        found = [line for line in gw.output().splitlines() if request_id in line]
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert found, "no access line"
    (line,) = found
    assert len(line) < 3 * FIELD_LIMIT + 1_000
    model = json.loads(line)["model"]
    assert model is None or len(model) <= len(clip(HUGE))
