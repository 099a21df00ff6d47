"""Limits and scopes: what a tenant may use, and the calendar arithmetic behind budgets.

Pure values and pure functions, no I/O: the stores (``memory.py``, ``redis.py``) apply them.
Budgets count per calendar day and month: UTC, or the time zone of the tenant's organization
(:class:`Partition`). For UTC the Redis store repeats the arithmetic in Lua on the server's
clock; for another zone Python computes the local days and months around now
(:func:`calendar_candidates`, DST-correct with ``zoneinfo``) and the script picks the one that
holds the server's clock. ``tests/quota`` checks that both stores agree.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "DEFAULT_THRESHOLDS",
    "LIMIT_NAMES",
    "AlertLevel",
    "AlertRule",
    "LimitName",
    "Limits",
    "Partition",
    "Period",
    "Scope",
    "build_scopes",
    "calendar_candidates",
    "day_period",
    "month_period",
    "period_ids",
    "seconds_to_next_day",
    "seconds_to_next_month",
    "zone",
]

LimitName = Literal["rpm", "tpm", "concurrency", "tokens_per_day", "tokens_per_month"]

# Order matters: it is the order in which a refusal is reported on a tie, and the wire order of
# limits in the Redis script arguments.
LIMIT_NAMES: tuple[LimitName, ...] = (
    "rpm",
    "tpm",
    "concurrency",
    "tokens_per_day",
    "tokens_per_month",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What one scope may use; ``None`` means unlimited.

    ``rpm`` and ``tpm`` count over a rolling 60 s window (``tpm`` counts input + output tokens);
    ``concurrency`` counts leases of requests in flight; the budgets count tokens per calendar
    day and month (UTC, or the zone of the scope's :class:`Partition`).
    """

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value < 0:
                raise ValueError(f"limit {f.name} must be >= 0 or None, got {value}")

    @property
    def unlimited(self) -> bool:
        """True when no limit is set, so a store can skip the scope entirely."""
        return all(getattr(self, name) is None for name in LIMIT_NAMES)

    def values(self) -> tuple[int | None, ...]:
        """The limits in ``LIMIT_NAMES`` order (the wire order of the Redis script)."""
        return (self.rpm, self.tpm, self.concurrency, self.tokens_per_day, self.tokens_per_month)

    def scaled(self, share: float) -> Limits:
        """This process's share of the limits, for fail-open mode without the shared store.

        Each set limit becomes ``floor(limit * share)`` but at least 1, so a tiny share of a
        small limit still lets some traffic through rather than refusing every request.
        """
        return Limits(**{name: _scale(getattr(self, name), share) for name in LIMIT_NAMES})


def _scale(limit: int | None, share: float) -> int | None:
    if limit is None:
        return None
    return max(1, int(limit * share))


@lru_cache(maxsize=256)
def zone(name: str) -> tzinfo:
    """The time zone of an IANA name from the installed tzdata (``UTC`` is the fast one).

    Raises ``ValueError`` for a name the installed tzdata does not know; nothing downloads.
    """
    if name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {name!r}") from exc


@dataclass(frozen=True, slots=True)
class Partition:
    """The counters of one organization: one Redis hash tag and one calendar.

    Every scope of a tenant that belongs to an organization lives under the organization's tag
    (``gw:q:{org/<name>}``, ``keys.py``), so the one script that checks the organization's, the
    team's and the tenant's counters touches one Redis Cluster slot; the tenant's own scopes
    then carry the tenant in their names. ``timezone`` (an IANA name) is the calendar of every
    day and month budget in the partition.
    """

    organization: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if not self.organization or any(c in self.organization for c in "{}/"):
            raise ValueError(f"bad organization name {self.organization!r}")
        zone(self.timezone)  # raises on an unknown zone

    @property
    def tag(self) -> str:
        """The hash-tag name: never a tenant's (tenant names hold no ``/``)."""
        return f"org/{self.organization}"


AlertLevel = Literal["organization", "team", "tenant", "key"]

#: the thresholds (percent of a day or month budget) alerted when a policy names none
DEFAULT_THRESHOLDS: tuple[int, ...] = (50, 80, 100)


@dataclass(frozen=True, slots=True)
class AlertRule:
    """Who this scope's day and month budgets alert about, and at which percentages.

    ``level`` and ``subject`` say whose budget it is (the organization, team or tenant name, or
    the key id); ``thresholds`` are percentages in 1..100, kept sorted and distinct.
    """

    level: AlertLevel
    subject: str
    thresholds: tuple[int, ...] = DEFAULT_THRESHOLDS

    def __post_init__(self) -> None:
        if any(not 1 <= t <= 100 for t in self.thresholds):
            raise ValueError(f"alert thresholds must be within 1..100, got {self.thresholds}")
        object.__setattr__(self, "thresholds", tuple(sorted(set(self.thresholds))))


@dataclass(frozen=True, slots=True)
class Scope:
    """One set of counters a request is admitted against, named within its owner.

    The owner is the request's tenant, or the ``partition`` (an organization) when set: then
    the name must say which tenant, team or organization the counters are for. Names are
    ``tenant``, ``key:<key id>`` and ``model:<model>`` when built by :func:`build_scopes`;
    ``gateway.quota.scopes.scopes_for`` documents the names inside an organization. Any
    name without ``{`` or ``}`` works.
    """

    name: str
    limits: Limits
    #: what this scope's tpm and budgets count: tokens, or cost in micro-units (spend limits,
    #: reserved from the request's ``estimated_cost`` and settled with its actual cost)
    unit: Literal["tokens", "cost"] = "tokens"
    #: the organization whose tag and calendar the counters use (None: the tenant's, UTC)
    partition: Partition | None = None
    #: threshold alerts of this scope's day and month budgets (None: none)
    alerts: AlertRule | None = None

    def __post_init__(self) -> None:
        if not self.name or "{" in self.name or "}" in self.name:
            raise ValueError(f"bad scope name {self.name!r}")
        if self.unit not in ("tokens", "cost"):
            raise ValueError(f"bad scope unit {self.unit!r}")

    @property
    def timezone(self) -> str:
        """The calendar of this scope's budgets."""
        return "UTC" if self.partition is None else self.partition.timezone


def build_scopes(
    tenant: Limits,
    *,
    key_id: str | None = None,
    key: Limits | None = None,
    model: str | None = None,
    per_model: Limits | None = None,
) -> tuple[Scope, ...]:
    """The scopes of one request: the tenant's, then the key's and the model's when limited.

    Scopes with no limit at all are left out: they would cost Redis work and never refuse.
    """
    scopes = [Scope("tenant", tenant)]
    if key_id is not None and key is not None:
        scopes.append(Scope(f"key:{key_id}", key))
    if model is not None and per_model is not None:
        scopes.append(Scope(f"model:{model}", per_model))
    return tuple(s for s in scopes if not s.limits.unlimited)


def period_ids(now: float, timezone: str = "UTC") -> tuple[int, int]:
    """The day (``yyyymmdd``) and month (``yyyymm``) that contain ``now`` (epoch seconds), in
    ``timezone``'s calendar (UTC unless given)."""
    if timezone == "UTC":
        t = datetime.fromtimestamp(now, UTC)
        return t.year * 10000 + t.month * 100 + t.day, t.year * 100 + t.month
    return day_period(now, timezone).id, month_period(now, timezone).id


def seconds_to_next_day(now: float, timezone: str = "UTC") -> float:
    """Seconds until the next midnight (UTC unless given): when a daily budget starts again."""
    if timezone == "UTC":
        return 86400.0 - (now % 86400.0)
    return day_period(now, timezone).end - now


def seconds_to_next_month(now: float, timezone: str = "UTC") -> float:
    """Seconds until the first midnight of next month (UTC unless given): when a monthly
    budget starts again."""
    if timezone == "UTC":
        t = datetime.fromtimestamp(now, UTC)
        days_left = calendar.monthrange(t.year, t.month)[1] - t.day
        return days_left * 86400.0 + seconds_to_next_day(now)
    return month_period(now, timezone).end - now


@dataclass(frozen=True, slots=True)
class Period:
    """One calendar day or month of a time zone: its id and ``[start, end)`` in epoch seconds."""

    id: int
    start: float
    end: float


def _midnight(d: date, tz: tzinfo) -> float:
    """The first instant of local date ``d``. A midnight that a DST jump skips (some zones
    spring forward at 00:00) resolves to the jump itself: ``fold=0`` takes the offset before
    it, so the day starts when its first local instant exists."""
    return datetime(d.year, d.month, d.day, tzinfo=tz).timestamp()


def _day_id(d: date) -> int:
    return d.year * 10000 + d.month * 100 + d.day


def _local_day(now: float, tz: tzinfo) -> date:
    """The date ``d`` with ``midnight(d) <= now < midnight(d + 1)``.

    Defined by the midnights rather than by the local wall clock alone, so that the day ids
    are one contiguous run of ranges even where a zone turns its clock back over midnight,
    and the Redis store (which picks from these ranges) cannot disagree with this one.
    """
    d = datetime.fromtimestamp(now, tz).date()
    one = timedelta(days=1)
    for _ in range(4):
        if now < _midnight(d, tz):
            d -= one
        elif now >= _midnight(d + one, tz):
            d += one
        else:
            break
    return d


def _day_range(d: date, tz: tzinfo) -> Period:
    return Period(_day_id(d), _midnight(d, tz), _midnight(d + timedelta(days=1), tz))


def _month_range(year: int, month: int, tz: tzinfo) -> Period:
    nxt = date(year + month // 12, month % 12 + 1, 1)
    return Period(year * 100 + month, _midnight(date(year, month, 1), tz), _midnight(nxt, tz))


#: the day and month last computed per zone: most calls fall in the same day
_CURRENT: dict[str, tuple[Period, Period]] = {}


def _current(now: float, timezone: str) -> tuple[Period, Period]:
    cached = _CURRENT.get(timezone)
    if cached is not None and cached[0].start <= now < cached[0].end:
        return cached
    tz = zone(timezone)
    d = _local_day(now, tz)
    found = _CURRENT[timezone] = (_day_range(d, tz), _month_range(d.year, d.month, tz))
    return found


def day_period(now: float, timezone: str) -> Period:
    """The local day of ``timezone`` that holds ``now`` (23 or 25 hours long across DST)."""
    return _current(now, timezone)[0]


def month_period(now: float, timezone: str) -> Period:
    """The local month of ``timezone`` that holds ``now``."""
    return _current(now, timezone)[1]


def calendar_candidates(now: float, timezone: str) -> tuple[tuple[Period, ...], tuple[Period, ...]]:
    """The local day before, of and after ``now``, and likewise the months, for the Redis
    script: it picks the one that holds the server's clock (which may differ from this
    process's clock by a little, never by a day)."""
    tz = zone(timezone)
    d = _local_day(now, tz)
    one = timedelta(days=1)
    days = (_day_range(d - one, tz), _day_range(d, tz), _day_range(d + one, tz))
    y, m = d.year, d.month
    before = (y - 1, 12) if m == 1 else (y, m - 1)
    after = (y + 1, 1) if m == 12 else (y, m + 1)
    months = (_month_range(*before, tz), _month_range(y, m, tz), _month_range(*after, tz))
    return days, months
