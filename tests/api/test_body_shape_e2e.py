"""Bodies that nest too deep or repeat a top-level key get a 400, through a live gateway.

Before the depth bound, 1,000 levels of nesting (a 2 KB body) made msgspec raise
``RecursionError`` and every proxied route and the batch file upload answered 500 with a
traceback in the log; a repeated ``model`` key was forwarded as sent, so a backend that keeps
the first key could serve a model other than the one routed and billed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
MODEL = "chat-model"
#: a valid request for each proxied route; the second ``%s`` is where the deep value goes
ROUTES = {
    "/v1/chat/completions": '{"model": "%s", "messages": [{"role": "user", "content": %s}]}',
    "/v1/completions": '{"model": "%s", "prompt": "hi", "extra": %s}',
    "/v1/embeddings": '{"model": "%s", "input": "hi", "extra": %s}',
}


def nested(depth: int, kind: str = "array") -> str:
    if kind == "array":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


@pytest.fixture(scope="module")
def gw(sim: SimServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp: Path = tmp_path_factory.mktemp("body-shape")
    data = policy({"chat": [sim.url]})
    data["batch"] = {"files_dir": str(tmp / "files")}
    with GatewayProcess(tmp, data) as proc:
        yield proc


def _assert_400(r: httpx.Response, needle: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] is None
    assert needle in error["message"], error
    assert "Traceback" not in r.text


def _post(gw: GatewayProcess, path: str, body: str) -> httpx.Response:
    return httpx.post(gw.url + path, content=body.encode(), timeout=30,
                      headers={**AUTH, "Content-Type": "application/json"})


@pytest.mark.parametrize("kind", ["array", "object"])
@pytest.mark.parametrize("depth", [129, 1_000, 100_000])
@pytest.mark.parametrize("path", list(ROUTES))
def test_deep_nesting_is_400(gw: GatewayProcess, path: str, depth: int, kind: str) -> None:
    """Too deep, at msgspec's limit (1,000) and far past it: 400 naming the bound."""
    r = _post(gw, path, ROUTES[path] % (MODEL, nested(depth, kind)))
    _assert_400(r, "nests deeper than 128 levels")


@pytest.mark.parametrize("path", list(ROUTES))
def test_nesting_at_the_bound_is_served(gw: GatewayProcess, path: str) -> None:
    """125 levels inside the request's own 3 (object, messages, message): 128, served."""
    r = _post(gw, path, ROUTES[path] % (MODEL, nested(125 if path.endswith("chat/completions")
                                                       else 127)))
    assert r.status_code == 200, r.text


def test_deep_body_at_top_level_is_400(gw: GatewayProcess) -> None:
    """A bare deep array (not an object) is refused for its depth, not with a 500."""
    _assert_400(_post(gw, "/v1/chat/completions", nested(5_000)), "nests deeper")


@pytest.mark.parametrize("depth", [129, 1_000])
def test_deep_batch_line_is_400(gw: GatewayProcess, depth: int) -> None:
    """A batch input file with one deeply nested line is refused naming the line."""
    good = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}}
    deep = ('{"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": '
            + ROUTES["/v1/chat/completions"] % (MODEL, nested(depth - 3)) + "}")
    data = json.dumps(good).encode() + b"\n" + deep.encode() + b"\n"
    r = httpx.post(gw.url + "/v1/files", headers=AUTH, timeout=30,
                   data={"purpose": "batch"}, files={"file": ("in.jsonl", data)})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "line 2: 'body' nests deeper than 128 levels" in message
    assert "Traceback" not in r.text


def test_deep_batch_create_body_is_400(gw: GatewayProcess) -> None:
    r = _post(gw, "/v1/batches", '{"input_file_id": "f", "metadata": ' + nested(2_000) + "}")
    _assert_400(r, "nests deeper than 128 levels")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param('{"model": "chat-model", "model": "other", "messages": '
                     '[{"role": "user", "content": "hi"}]}', id="model-twice"),
        pytest.param('{"model": "chat-model", "messages": [{"role": "user", "content": "hi"}],'
                     ' "mod\\u0065l": "other"}', id="model-escaped"),
        pytest.param('{"model": "chat-model", "stream": false, "messages": '
                     '[{"role": "user", "content": "hi"}], "stream": true}', id="stream-twice"),
        pytest.param('{"model": "chat-model", "max_tokens": 1, "max_tokens": 100000, '
                     '"messages": [{"role": "user", "content": "hi"}]}', id="max-tokens-twice"),
    ],
)
def test_repeated_top_level_key_is_400(gw: GatewayProcess, body: str) -> None:
    """Whichever copy a backend keeps, it is not the one the gateway routed and billed."""
    r = _post(gw, "/v1/chat/completions", body)
    _assert_400(r, "repeats the key")


def test_repeated_nested_key_is_served(gw: GatewayProcess) -> None:
    """Only the top level, which the gateway reads, must be unambiguous."""
    body = ('{"model": "chat-model", "max_tokens": 2, "messages": '
            '[{"role": "user", "content": "hi", "content": "hello"}]}')
    assert _post(gw, "/v1/chat/completions", body).status_code == 200


def test_no_traceback_in_the_log(gw: GatewayProcess) -> None:
    """None of the bodies above reached the catch-all (it logs 'unexpected error')."""
    _post(gw, "/v1/chat/completions", ROUTES["/v1/chat/completions"] % (MODEL, nested(1_000)))
    assert "unexpected error" not in gw.output()
    assert "RecursionError" not in gw.output()


@pytest.mark.parametrize("path", [*ROUTES, "/v1/batches"])
@pytest.mark.parametrize("body", [b"2\xff\x05", b"97\xff", b"[1] x", b'"s"\x00'])
def test_a_scalar_then_garbage_is_400(gw: GatewayProcess, path: str, body: bytes) -> None:
    """Found by schemathesis: a value that is not an object, followed by bytes that are not
    JSON, answered 500 (the second decode's error escaped)."""
    r = httpx.post(gw.url + path, content=body, timeout=30,
                   headers={**AUTH, "Content-Type": "application/json"})
    _assert_400(r, "not valid JSON")
