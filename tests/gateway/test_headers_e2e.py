"""What crosses the proxy hop: credentials, hop-by-hop headers, the model name, request ids."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from tests.echo_backend import EchoBackend
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def echo_gateway(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp: Path = tmp_path_factory.mktemp("echo")
    with EchoBackend() as echo:
        data = policy({"echo": [echo.url]})
        data["pools"][0]["backends"][0]["api_key_env"] = "ECHO_BACKEND_KEY"
        os.environ["ECHO_BACKEND_KEY"] = "backend-secret-key"
        try:
            with GatewayProcess(tmp, data) as gw:
                yield gw, echo
        finally:
            del os.environ["ECHO_BACKEND_KEY"]


def _post(url: str, **headers: str) -> httpx.Response:
    body = {
        "model": "echo-model",
        "messages": [{"role": "user", "content": "hi"}],
        "seed": 7,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    }
    return httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {TEST_KEY}", **headers},
        timeout=10,
    )


def test_client_credentials_never_reach_backend(echo_gateway) -> None:  # type: ignore[no-untyped-def]
    """The backend sees its own key from the policy, never the client's."""
    gw, echo = echo_gateway
    r = _post(gw.url, **{"X-Api-Key": "client-other", "Cookie": "session=1"})
    assert r.status_code == 200
    seen = echo.requests[-1]["headers"]
    assert seen["authorization"] == "Bearer backend-secret-key"
    assert TEST_KEY not in str(seen)
    assert "x-api-key" not in seen and "cookie" not in seen


def test_hop_by_hop_headers_stripped(echo_gateway) -> None:  # type: ignore[no-untyped-def]
    """Connection-scoped headers and those named by Connection are not forwarded."""
    gw, echo = echo_gateway
    r = _post(
        gw.url,
        **{
            "Connection": "keep-alive, X-Private",
            "X-Private": "1",
            "Keep-Alive": "timeout=5",
            "X-Custom": "kept",
        },
    )
    assert r.status_code == 200
    seen = echo.requests[-1]["headers"]
    assert "x-private" not in seen and "keep-alive" not in seen
    assert seen["x-custom"] == "kept"


def test_model_rewritten_and_fields_pass_through(echo_gateway) -> None:  # type: ignore[no-untyped-def]
    """The backend gets its model name; fields the gateway does not use pass untouched."""
    gw, echo = echo_gateway
    assert _post(gw.url).status_code == 200
    body = echo.requests[-1]["body"]
    assert body["model"] == "sim-model"
    assert body["seed"] == 7
    assert body["tools"][0]["function"]["name"] == "f"
    assert echo.requests[-1]["path"] == "/v1/chat/completions"


def test_request_id_is_the_gateways_client_id_is_correlation(echo_gateway) -> None:  # type: ignore[no-untyped-def]
    """The request id is always the gateway's; a client's id travels beside it, never as it."""
    gw, echo = echo_gateway
    r = _post(gw.url, **{"X-Request-Id": "client-abc.123"})
    own = r.headers["x-request-id"]
    assert own != "client-abc.123" and len(own) == 32
    assert r.headers["x-client-request-id"] == "client-abc.123"
    seen = echo.requests[-1]["headers"]
    assert seen["x-request-id"] == own
    assert seen["x-client-request-id"] == "client-abc.123"
    # the same client id twice: two requests, two ids
    again = _post(gw.url, **{"X-Request-Id": "client-abc.123"}).headers["x-request-id"]
    assert again != own
    # x-client-request-id (as the openai SDKs send it) is kept as the client sent it
    r = _post(gw.url, **{"X-Client-Request-Id": "sdk-7"})
    assert r.headers["x-client-request-id"] == "sdk-7"
    assert echo.requests[-1]["headers"]["x-client-request-id"] == "sdk-7"
    r = _post(gw.url, **{"X-Request-Id": "bad id with spaces"})
    assert len(r.headers["x-request-id"]) == 32
    assert "x-client-request-id" not in r.headers
    # the access line carries both, each in its own field
    deadline = time.monotonic() + 10
    while '"client_request_id":"sdk-7"' not in gw.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [json.loads(line) for line in gw.output().splitlines()
             if '"client_request_id":"client-abc.123"' in line]
    assert lines and all(line["request_id"] != "client-abc.123" for line in lines)


def test_response_carries_the_public_model_name(echo_gateway) -> None:  # type: ignore[no-untyped-def]
    """The backend answers as 'sim-model'; the client asked for 'echo-model' and gets it."""
    gw, echo = echo_gateway
    r = _post(gw.url)
    assert r.status_code == 200
    assert echo.requests[-1]["body"]["model"] == "sim-model"
    assert r.json()["model"] == "echo-model"


def test_backend_headers_relayed_but_not_framing(echo_gateway) -> None:  # type: ignore[no-untyped-def]
    """End-to-end headers come back; the backend's connection headers do not."""
    gw, _ = echo_gateway
    r = _post(gw.url)
    assert r.headers.get("x-backend-note") == "relayed"
    assert r.headers.get("server") is None
