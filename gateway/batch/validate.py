"""Check a batch input file line by line before anything runs (pure: no I/O).

Every line must be a JSON object ``{custom_id, method, url, body}``: a unique non-empty
``custom_id``, ``method`` POST, ``url`` one of the proxied endpoints (and, at batch creation,
the batch's endpoint), a ``body`` the live endpoint would accept (the same ``parse_request``
checks), no ``stream``, a model the gateway serves, the same model on every line, and at most
``max_line_bytes``. A bad file is refused with the first ``report_errors`` problems, each
naming its line number (1-based, as an editor shows it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.batch.errors import BatchFileInvalid, BatchFileTooLarge
from gateway.dialects.body import MAX_DEPTH, nests_deeper
from gateway.dialects.chat.parse import parse_request
from gateway.dialects.shape import ENDPOINTS
from gateway.errors import InvalidRequest

__all__ = ["BatchLine", "FileSummary", "Limits", "iter_lines", "parse_line", "validate_file"]

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """What a batch file may hold."""

    max_file_bytes: int
    max_lines: int
    max_line_bytes: int
    report_errors: int = 20


@dataclass(frozen=True, slots=True)
class FileSummary:
    """What validation learned: the number of requests, their endpoint and model."""

    lines: int
    endpoint: str
    model: str


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request of a batch, ready to send."""

    custom_id: str
    url: str
    body: bytes


def iter_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of every non-blank line."""
    for number, line in enumerate(data.split(b"\n"), 1):
        if line.strip():
            yield number, line


_TOO_DEEP = f"'body' nests deeper than {MAX_DEPTH} levels"


def parse_line(line: bytes) -> tuple[BatchLine, dict[str, Any]]:
    """Decode one line into a request and its decoded body; raises ``InvalidRequest``."""
    try:
        item = _decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"not valid JSON ({exc})") from None
    except RecursionError:  # msgspec's own limit (~1,000 levels): far past ours
        raise InvalidRequest(_TOO_DEEP) from None
    if not isinstance(item, dict):
        raise InvalidRequest("not a JSON object")
    # the line wraps the body in one more object: the body itself may nest MAX_DEPTH levels
    if len(line) > 2 * MAX_DEPTH and nests_deeper(item, MAX_DEPTH + 1):
        raise InvalidRequest(_TOO_DEEP)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise InvalidRequest("'custom_id' must be a non-empty string")
    if item.get("method") != "POST":
        raise InvalidRequest(f"'method' must be POST, got {item.get('method')!r}")
    url = item.get("url")
    endpoint = ENDPOINTS.get(url) if isinstance(url, str) else None
    if endpoint is None:
        raise InvalidRequest(f"'url' must be one of {', '.join(ENDPOINTS)}, got {url!r}")
    body = item.get("body")
    if not isinstance(body, dict):
        raise InvalidRequest("'body' must be a JSON object")
    if body.get("stream"):
        raise InvalidRequest("'body.stream' is not supported in a batch")
    raw = _encoder.encode(body)
    try:
        parse_request(raw, endpoint)
    except InvalidRequest as exc:
        raise InvalidRequest(f"body: {exc.message}") from None
    return BatchLine(custom_id, endpoint.path, raw), body


def validate_file(
    data: bytes, limits: Limits, models: Collection[str], endpoint: str | None = None
) -> FileSummary:
    """Check every line; raise ``BatchFileInvalid`` listing the first problems by line number."""
    if len(data) > limits.max_file_bytes:
        raise BatchFileTooLarge(
            f"file of {len(data)} bytes exceeds the limit of {limits.max_file_bytes} bytes")
    problems: list[str] = []
    count = 0
    seen: dict[str, int] = {}
    first: tuple[int, str, str] | None = None  # line, url, model of the first good line

    def problem(number: int, reason: str) -> None:
        problems.append(f"line {number}: {reason}")

    for number, line in iter_lines(data):
        count += 1
        if count > limits.max_lines:
            problem(number, f"more than {limits.max_lines} requests in one file")
            break
        if len(line) > limits.max_line_bytes:
            problem(number, f"{len(line)} bytes exceeds the line limit of"
                            f" {limits.max_line_bytes}")
            continue
        try:
            request, body = parse_line(line)
        except InvalidRequest as exc:
            problem(number, exc.message)
            continue
        if request.custom_id in seen:
            problem(number, f"custom_id {request.custom_id!r} is a duplicate of line"
                            f" {seen[request.custom_id]}")
        seen.setdefault(request.custom_id, number)
        model = body["model"]
        if endpoint is not None and request.url != endpoint:
            problem(number, f"url {request.url!r} differs from the batch endpoint {endpoint!r}")
        if model not in models:
            problem(number, f"model {model!r} is not served by this gateway")
        elif first is None:
            first = (number, request.url, model)
        else:
            if request.url != first[1]:
                problem(number, f"url {request.url!r} differs from line {first[0]}'s"
                                f" {first[1]!r}")
            if model != first[2]:
                problem(number, f"model {model!r} differs from line {first[0]}'s {first[2]!r}"
                                " (one model per batch)")
    if count == 0:
        problems.append("the file holds no requests")
    if problems:
        shown = problems[: limits.report_errors]
        more = len(problems) - len(shown)
        tail = f"; and {more} more" if more else ""
        raise BatchFileInvalid(
            f"invalid batch file ({len(problems)} problem{'s' if len(problems) > 1 else ''}): "
            + "; ".join(shown) + tail, param="file")
    assert first is not None
    return FileSummary(count, first[1], first[2])
