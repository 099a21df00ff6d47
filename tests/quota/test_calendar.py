"""Budget calendars per organization time zone: DST-correct days, month ends, and the memory
and Redis stores agreeing on which day and month an instant belongs to."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import redis

from gateway.quota import Limits, MemoryQuotaStore, QuotaRequest, RedisQuotaStore, Scope
from gateway.quota.alerts import BudgetAlert
from gateway.quota.limits import (
    AlertRule,
    Partition,
    calendar_candidates,
    day_period,
    month_period,
    period_ids,
    seconds_to_next_day,
    seconds_to_next_month,
)
from gateway.quota.redis import _calendar_text
from gateway.quota.scripts import _COMMON
from tests.redis_servers import RedisProc

NY = "America/New_York"
PARIS = "Europe/Paris"


def ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("now", "zone", "day", "hours"),
    [
        pytest.param(ts(2025, 3, 9, 12), NY, 20250309, 23, id="ny-spring-forward"),
        pytest.param(ts(2025, 11, 2, 12), NY, 20251102, 25, id="ny-fall-back"),
        pytest.param(ts(2025, 3, 30, 12), PARIS, 20250330, 23, id="paris-spring-forward"),
        pytest.param(ts(2025, 3, 10, 3, 59), NY, 20250309, 23, id="ny-late-evening"),
        pytest.param(ts(2025, 3, 10, 4, 0), NY, 20250310, 24, id="ny-next-midnight"),
        pytest.param(ts(2025, 3, 10, 4, 0), "UTC", 20250310, 24, id="utc"),
    ],
)
def test_local_days(now: float, zone: str, day: int, hours: int) -> None:
    period = day_period(now, zone)
    assert period.id == day == period_ids(now, zone)[0]
    assert period.start <= now < period.end
    assert period.end - period.start == hours * 3600
    assert seconds_to_next_day(now, zone) == period.end - now


def test_month_end_in_a_zone() -> None:
    """Paris: 2025-10-31 23:30 local is still October (and 30 minutes from November, which
    started at 23:00 UTC); UTC is in October for another hour."""
    now = ts(2025, 10, 31, 22, 30)
    assert period_ids(now, PARIS) == (20251031, 202510)
    assert seconds_to_next_month(now, PARIS) == 1800
    assert period_ids(now + 1800, PARIS) == (20251101, 202511)
    assert period_ids(now + 1800) == (20251031, 202510)  # UTC: still October
    october = month_period(now, PARIS)
    assert october.end - october.start == 31 * 86400 + 3600  # the fall-back hour


def test_a_day_a_zone_skipped_has_no_instant() -> None:
    """Samoa skipped 2011-12-30: the day before ends where the day after starts."""
    days, _ = calendar_candidates(ts(2011, 12, 30, 12), "Pacific/Apia")
    assert [d.id for d in days] == [20111230, 20111231, 20120101]
    assert days[0].start == days[0].end == days[1].start
    assert day_period(ts(2011, 12, 30, 12), "Pacific/Apia").id == 20111231


def test_unknown_zones_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown time zone"):
        Partition("o", "Mars/Olympus_Mons")


#: the instants compared: around DST changes and month ends, in three zones
INSTANTS = [
    (zone, base + offset)
    for zone, base in [(NY, ts(2025, 3, 9, 7)), (NY, ts(2025, 11, 2, 6)),
                       (PARIS, ts(2025, 3, 30, 1)), (PARIS, ts(2025, 10, 31, 23)),
                       (PARIS, ts(2025, 12, 31, 23)), ("Pacific/Kiritimati", ts(2024, 2, 28, 10)),
                       ("UTC", ts(2024, 2, 29, 23, 59)), ("UTC", ts(2023, 12, 31, 23, 59))]
    for offset in (-3601, -61, -1, 0, 1, 59, 3599, 3600, 7200)
]


@pytest.mark.parametrize("skew", [-300.0, 0.0, 300.0])
def test_the_script_picks_what_python_computes(redis_proc: RedisProc, skew: float) -> None:
    """The Lua ``periods`` with the calendar Python sends (computed on a clock ``skew``
    seconds off the server's) gives the day, month and the waits the memory store uses."""
    client = redis.Redis.from_url(redis_proc.url)
    script = client.register_script(_COMMON + """
local now = tonumber(ARGV[1])
local d, m, nd, nm = periods(math.floor(now / 1000000), now, ARGV[2])
return {d, m, nd, nm}
""")
    try:
        for zone, now in INSTANTS:
            partition = Partition("o", zone)
            calendar = _calendar_text(partition, now + skew)
            got = script(args=[round(now * 1e6), calendar])
            want = [*period_ids(now, zone), round(seconds_to_next_day(now, zone) * 1e6),
                    round(seconds_to_next_month(now, zone) * 1e6)]
            assert got == want, (zone, datetime.fromtimestamp(now, UTC), skew)
    finally:
        client.close()


async def test_memory_budget_resets_at_local_midnight_across_dst() -> None:
    """New York, on the day clocks spring forward: a budget spent by 23:59 local refuses with a
    60 s wait, is fresh at 00:00 local (04:00 UTC), and its alert names the local day."""
    now = [ts(2025, 3, 10, 3, 59)]
    alerts: list[BudgetAlert] = []
    store = MemoryQuotaStore(clock=lambda: now[0], alerts=alerts.extend)
    org = Partition("bigco", NY)
    scopes = (Scope("org:bigco", Limits(tokens_per_day=100), "tokens", org,
                    AlertRule("organization", "bigco", (100,))),)

    def request(est: int) -> QuotaRequest:
        return QuotaRequest(request_id=uuid.uuid4().hex, tenant="a", scopes=scopes,
                            estimated_tokens=est)

    res = (await store.reserve(request(100))).reservation
    assert res is not None and await store.settle(res, 100)
    refused = await store.reserve(request(1))
    assert not refused.admitted and refused.retry_after == 60
    assert [(a.period, a.threshold) for a in alerts] == [("2025-03-09", 100)]
    now[0] += 60
    assert (await store.reserve(request(100))).admitted
    assert (await store.usage("a", "org:bigco", org)).tokens_today == 100


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Etc/GMT+12"])
async def test_redis_charges_the_local_day(redis_proc: RedisProc, zone: str) -> None:
    """UTC+14 and UTC-12: whatever the hour, at least one of them is not on UTC's date; the
    Redis store charges the zone's own day and month and reads them back."""
    store = RedisQuotaStore.from_url(redis_proc.url, timeout=30.0, connect_timeout=30.0)
    org = Partition(f"o-{uuid.uuid4().hex[:8]}", zone)
    scopes = (Scope(f"org:{org.organization}", Limits(tokens_per_day=100,
                                                      tokens_per_month=100), "tokens", org),)
    try:
        before = period_ids(datetime.now(UTC).timestamp(), zone)
        res = (await store.reserve(QuotaRequest(request_id=uuid.uuid4().hex, tenant="a",
                                                scopes=scopes, estimated_tokens=7))).reservation
        after = period_ids(datetime.now(UTC).timestamp(), zone)
        assert res is not None
        record = f"gw:q:{{org/{org.organization}}}:r:a/{res.request_id}"
        charged = tuple(int(redis_proc.cli("HGET", record, f)) for f in ("d", "m"))
        assert charged in (before, after)
        usage = await store.usage("a", f"org:{org.organization}", org)
        assert (usage.tokens_today, usage.tokens_this_month) == (7, 7)
    finally:
        await store.aclose()
