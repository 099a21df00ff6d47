"""Result lines of the output and error files, in OpenAI's shape.

``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``: a 200
answer goes to the output file with ``error: null``; any other final answer goes to the error
file with the response and ``error: {code, message}`` taken from the gateway's error body; a
line that never got an answer (the batch expired) has ``response: null``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.batch.objects import LineResult

__all__ = ["answer_line", "error_line", "line_id", "request_id_of"]

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()


def request_id_of(batch_id: str, index: int) -> str:
    """The line's deterministic request id: usage records of a re-run line dedupe on it."""
    return f"{batch_id}_{index}"


def line_id(batch_id: str, index: int) -> str:
    return f"batch_req_{batch_id.removeprefix('batch_')}_{index}"


def _body(status: int, body: bytes) -> tuple[Any, str | None, str | None]:
    """The body to embed (raw JSON when it is JSON) and its error code and message."""
    try:
        decoded = _dec.decode(body)
    except msgspec.DecodeError:
        text = body.decode("utf-8", "replace")[:1000]
        return text, None, text or f"HTTP {status}"
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        return msgspec.Raw(body), str(code) if code else None, str(error.get("message", ""))
    return msgspec.Raw(body), None, None


def answer_line(
    batch_id: str, index: int, custom_id: str, status: int, body: bytes
) -> LineResult:
    """The result of a line that got a final HTTP answer."""
    embedded, code, message = _body(status, body)
    error = None
    if status != 200:
        error = {"code": code or f"http_{status}", "message": message or f"HTTP {status}"}
    line = _enc.encode({
        "id": line_id(batch_id, index),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id_of(batch_id, index),
                     "body": embedded},
        "error": error,
    })
    return LineResult(index, status == 200, line)


def error_line(batch_id: str, index: int, custom_id: str, code: str, message: str) -> LineResult:
    """The result of a line that never got an answer."""
    line = _enc.encode({
        "id": line_id(batch_id, index),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    })
    return LineResult(index, False, line)
