"""Pure parts: limit scaling, scope building, calendar periods, back-off, error mapping."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.quota import Backoff, Limits, QuotaUnavailable, build_scopes
from gateway.quota.errors import QuotaConnectError, QuotaStoreError, QuotaTimeout
from gateway.quota.limits import period_ids, seconds_to_next_day, seconds_to_next_month
from gateway.quota.redis import map_redis_error


def ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


def test_scaled_floors_but_keeps_at_least_one() -> None:
    limits = Limits(rpm=10, tpm=999, concurrency=1, tokens_per_day=None)
    assert limits.scaled(1 / 3) == Limits(rpm=3, tpm=333, concurrency=1, tokens_per_day=None)


def test_negative_limits_are_rejected() -> None:
    with pytest.raises(ValueError):
        Limits(rpm=-1)


def test_build_scopes_drops_unlimited_ones() -> None:
    scopes = build_scopes(
        Limits(rpm=5), key_id="k", key=Limits(), model="m", per_model=Limits(tpm=9)
    )
    assert [s.name for s in scopes] == ["tenant", "model:m"]


@pytest.mark.parametrize(
    ("now", "day", "month", "to_day", "to_month"),
    [
        pytest.param(ts(2024, 2, 29, 23, 0), 20240229, 202402, 3600, 3600, id="leap-day-end"),
        pytest.param(ts(2023, 12, 31, 0, 0), 20231231, 202312, 86400, 86400, id="year-end"),
        pytest.param(ts(2025, 4, 1), 20250401, 202504, 86400, 30 * 86400, id="month-start"),
    ],
)
def test_periods(now: float, day: int, month: int, to_day: float, to_month: float) -> None:
    assert period_ids(now) == (day, month)
    assert seconds_to_next_day(now) == to_day
    assert seconds_to_next_month(now) == to_month


def test_backoff_lets_one_probe_through_per_pause() -> None:
    now = [0.0]
    backoff = Backoff(initial=1.0, maximum=4.0, jitter=0.0, clock=lambda: now[0])
    assert backoff.allow()
    backoff.failure()
    assert not backoff.allow()
    now[0] = 1.0
    assert backoff.allow() and not backoff.allow()  # one probe, the rest wait for it
    backoff.failure()
    now[0] = 2.5
    assert not backoff.allow()  # second pause is 2 s
    now[0] = 3.0
    assert backoff.allow()
    backoff.success()
    assert backoff.allow() and backoff.allow() and repr(backoff) == "<Backoff [ok]>"


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        pytest.param(RedisConnectionError("refused"), QuotaConnectError, id="connect"),
        pytest.param(RedisTimeoutError("slow"), QuotaTimeout, id="redis-timeout"),
        pytest.param(TimeoutError(), QuotaTimeout, id="deadline"),
        pytest.param(ReadOnlyError("READONLY"), QuotaStoreError, id="readonly"),
    ],
)
def test_redis_errors_map_to_quota_errors(exc: Exception, kind: type[Exception]) -> None:
    mapped = map_redis_error(exc)
    assert isinstance(mapped, kind) and isinstance(mapped, QuotaUnavailable)
