"""The pure parts: the pacing rule, line validation, result lines."""

from __future__ import annotations

import json

import pytest

from gateway.batch import BatchFileInvalid, Limits, PoolLoad, target_in_flight, validate_file
from gateway.batch.output import answer_line, error_line
from tests.batch.common import jsonl

LIMITS = Limits(max_file_bytes=1 << 20, max_lines=100, max_line_bytes=4096, report_errors=3)
RULE = {"share": 0.8, "floor": 1, "ceiling": 256}


@pytest.mark.parametrize(("batch", "interactive", "mine", "expected"), [
    pytest.param(PoolLoad(64, 0, 0), [PoolLoad(32, 2, 0)], 0, 64, id="idle-fills-capacity"),
    pytest.param(PoolLoad(64, 40, 0), [PoolLoad(32, 2, 0)], 40, 64, id="own-lines-not-others"),
    pytest.param(PoolLoad(64, 40, 0), [PoolLoad(32, 2, 0)], 10, 34, id="others-use-the-pool"),
    pytest.param(PoolLoad(64, 64, 5), [], 0, 1, id="full-pool-keeps-floor"),
    pytest.param(PoolLoad(64, 10, 0), [PoolLoad(32, 2, 1)], 10, 1, id="interactive-queue"),
    pytest.param(PoolLoad(64, 10, 0), [PoolLoad(32, 26, 0)], 10, 1, id="interactive-share"),
    pytest.param(PoolLoad(1000, 0, 0), [], 0, 256, id="ceiling"),
])
def test_target_in_flight(batch: PoolLoad, interactive: list[PoolLoad], mine: int,
                          expected: int) -> None:
    assert target_in_flight(batch, interactive, mine, **RULE) == expected  # type: ignore[arg-type]


def test_valid_file_summary() -> None:
    summary = validate_file(jsonl(5), LIMITS, {"m"})
    assert (summary.lines, summary.endpoint, summary.model) == (5, "/v1/chat/completions", "m")


def test_problems_are_capped_and_counted() -> None:
    data = b"\n".join([b"[]"] * 5)
    with pytest.raises(BatchFileInvalid) as info:
        validate_file(data, LIMITS, {"m"})
    assert "5 problems" in info.value.message and "and 2 more" in info.value.message
    assert "line 1: not a JSON object" in info.value.message


def test_limits_lines_and_line_bytes() -> None:
    with pytest.raises(BatchFileInvalid, match="more than 100 requests"):
        validate_file(jsonl(101), LIMITS, {"m"})
    big = jsonl(1).replace(b"Question 0?", b"x" * 5000)
    with pytest.raises(BatchFileInvalid, match=r"line 1: 5.* bytes exceeds the line limit"):
        validate_file(big, LIMITS, {"m"})


def test_body_checked_like_a_live_request() -> None:
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "m", "messages": [], "stream": False}})
    with pytest.raises(BatchFileInvalid, match="line 1: body: 'messages' must contain"):
        validate_file(line.encode(), LIMITS, {"m"})


def test_result_lines_have_openai_shape() -> None:
    ok = json.loads(answer_line("batch_ab", 3, "c3", 200, b'{"id":"x"}').line)
    assert ok == {"id": "batch_req_ab_3", "custom_id": "c3", "error": None,
                  "response": {"status_code": 200, "request_id": "batch_ab_3",
                               "body": {"id": "x"}}}
    failed = answer_line("batch_ab", 4, "c4", 400,
                         b'{"error":{"message":"bad","type":"t","param":null,"code":"c"}}')
    assert not failed.ok
    assert json.loads(failed.line)["error"] == {"code": "c", "message": "bad"}
    expired = json.loads(error_line("batch_ab", 5, "c5", "batch_expired", "late").line)
    assert expired["response"] is None and expired["error"]["code"] == "batch_expired"
