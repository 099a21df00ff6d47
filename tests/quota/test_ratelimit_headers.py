"""The x-ratelimit-* duration format matches OpenAI's (20ms, 1s, 6m0s)."""

from __future__ import annotations

from gateway.quota.base import RateLimitState
from gateway.quota.ratelimit import format_duration, ratelimit_headers


def test_durations() -> None:
    assert format_duration(0) == "0s"
    assert format_duration(0.0201) == "21ms"
    assert format_duration(0.0001) == "1ms"
    assert format_duration(1.0) == "1s"
    assert format_duration(1.2) == "2s"  # rounded up: waiting that long finds the slot free
    assert format_duration(360) == "6m0s"
    assert format_duration(3605) == "1h0m5s"


def test_headers_only_for_set_limits() -> None:
    only_tokens = RateLimitState(limit_tokens=10, remaining_tokens=3, reset_tokens_s=0.5)
    assert dict(ratelimit_headers(only_tokens)) == {
        b"x-ratelimit-limit-tokens": b"10", b"x-ratelimit-remaining-tokens": b"3",
        b"x-ratelimit-reset-tokens": b"500ms"}
    both = RateLimitState(limit_requests=60, remaining_requests=59, reset_requests_s=1,
                          limit_tokens=10, remaining_tokens=3)
    assert len(ratelimit_headers(both)) == 6
