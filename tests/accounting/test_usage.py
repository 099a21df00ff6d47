"""Reading usage from response bodies, and asking the backend for it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.accounting import BackendUsage, request_usage, text_from_body, usage_from_body


def body(**fields: Any) -> bytes:
    return msgspec.json.encode({"id": "x", "object": "chat.completion", **fields})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(
            body(
                choices=[{"message": {"role": "assistant", "content": "hi"}}],
                usage={
                    "prompt_tokens": 10,
                    "completion_tokens": 5,
                    "total_tokens": 15,
                    "prompt_tokens_details": {"cached_tokens": 4},
                    "completion_tokens_details": {"reasoning_tokens": 2},
                },
            ),
            BackendUsage(
                prompt_tokens=10,
                completion_tokens=5,
                total_tokens=15,
                cached_tokens=4,
                reasoning_tokens=2,
            ),
            id="chat",
        ),
        pytest.param(
            body(data=[], usage={"prompt_tokens": 8, "total_tokens": 8}),
            BackendUsage(prompt_tokens=8, total_tokens=8),
            id="embeddings",
        ),
        pytest.param(
            body(usage={"prompt_tokens": 3, "prompt_tokens_details": None,
                        "completion_tokens_details": {"reasoning_tokens": None}}),
            BackendUsage(prompt_tokens=3),
            id="null-details",
        ),
        pytest.param(
            body(
                usage={"prompt_tokens": 3, "completion_tokens": None, "prompt_tokens_details": None}
            ),
            BackendUsage(rejected="null:completion_tokens"),
            id="null-total",
        ),
        pytest.param(
            body(usage={"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 9}}),
            BackendUsage(prompt_tokens=3, cached_tokens=3, overstated=9),
            id="cached-capped",
        ),
        pytest.param(body(choices=[]), None, id="absent"),
        pytest.param(body(usage=None), None, id="null"),
        pytest.param(body(usage={"prompt_tokens": -1}),
                     BackendUsage(rejected="negative:prompt_tokens"), id="negative"),
        pytest.param(body(usage="12"), BackendUsage(rejected="malformed:usage"),
                     id="usage-not-an-object"),
        pytest.param(b"<html>502</html>", None, id="not-json"),
    ],
)
def test_usage_from_body(raw: bytes, expected: BackendUsage | None) -> None:
    assert usage_from_body(raw) == expected


def test_text_from_body() -> None:
    chat = body(choices=[{"message": {"content": "a"}}, {"message": {"content": "b"}}])
    completion = body(choices=[{"text": "xyz", "index": 0}])
    assert text_from_body(chat) == "ab"
    assert text_from_body(completion) == "xyz"
    assert text_from_body(b"nope") == ""


def test_request_usage_sets_include_usage_and_reports_the_client_choice() -> None:
    payload: dict[str, Any] = {"stream": True}
    assert request_usage(payload, True) is False
    assert payload["stream_options"] == {"include_usage": True}

    asked: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
    assert request_usage(asked, True) is True
    assert asked["stream_options"] == {"include_usage": True}

    options = {"continuous_usage_stats": False}
    other: dict[str, Any] = {"stream": True, "stream_options": options}
    assert request_usage(other, True) is False
    assert other["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert options == {"continuous_usage_stats": False}  # the client's dict is not edited


def test_request_usage_leaves_non_streamed_requests_alone() -> None:
    payload: dict[str, Any] = {"model": "m"}
    assert request_usage(payload, False) is True
    assert payload == {"model": "m"}
