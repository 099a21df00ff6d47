"""The chat-shaped APIs' own checks: chat completions, completions and embeddings requests
parsed into the pipeline's request shape (``dialects.shape``).

Only what the gateway needs is checked (model, stream, token limits, the endpoint's required
input); every other field (tools, response_format, logprobs, seed, ...) passes through untouched.
The body's JSON is decoded by ``dialects.body`` (depth and repeated keys checked there).
"""

from __future__ import annotations

from typing import Any

from gateway.dialects.body import decode_object, type_name
from gateway.dialects.shape import Endpoint, ParsedRequest
from gateway.errors import InvalidRequest

__all__ = ["parse_request"]


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise InvalidRequest(
            f"'messages' must be an array, got {type_name(messages)}", param="messages"
        )
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(
                f"'messages[{i}]' must be an object, got {type_name(message)}",
                param=f"messages[{i}]",
            )
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidRequest(
                f"'messages[{i}].role' is required and must be a string",
                param=f"messages[{i}].role",
            )


def _check_input(field: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, (str, int, list)):
            return
    raise InvalidRequest(
        f"'{field}' must be a string or a non-empty array of strings or token ids,"
        f" got {type_name(value)}",
        param=field,
    )


def _check_positive_int(payload: dict[str, Any], field: str) -> None:
    value = payload.get(field)
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"'{field}' must be a positive integer", param=field)


def parse_request(body: bytes, endpoint: Endpoint) -> ParsedRequest:
    """Decode and check a request body; raises InvalidRequest naming the field."""
    if not body:
        raise InvalidRequest("request body is empty; expected a JSON object")
    payload = decode_object(body)
    model = payload.get("model")
    if model is None:
        raise InvalidRequest("'model' is a required field", param="model")
    if not isinstance(model, str):
        raise InvalidRequest(f"'model' must be a string, got {type_name(model)}", param="model")
    if endpoint.input_field not in payload:
        raise InvalidRequest(
            f"'{endpoint.input_field}' is a required field", param=endpoint.input_field
        )
    if endpoint.input_field == "messages":
        _check_messages(payload["messages"])
    else:
        _check_input(endpoint.input_field, payload[endpoint.input_field])
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest(
            f"'stream' must be a boolean, got {type_name(stream)}", param="stream"
        )
    if stream and not endpoint.streams:
        raise InvalidRequest(f"'stream' is not supported on {endpoint.path}", param="stream")
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    _check_positive_int(payload, "max_tokens")
    _check_positive_int(payload, "max_completion_tokens")
    _check_positive_int(payload, "n")
    return ParsedRequest(payload, model, stream)
