"""Limits and scopes: what a tenant may use, and the calendar arithmetic behind budgets.

Pure values and pure functions, no I/O: the stores (``memory.py``, ``redis.py``) apply them.
The Redis store repeats the calendar arithmetic in Lua on the server's clock (``scripts.py``);
``tests/quota`` checks that both agree.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Literal

__all__ = [
    "LIMIT_NAMES",
    "LimitName",
    "Limits",
    "Scope",
    "build_scopes",
    "period_ids",
    "seconds_to_next_day",
    "seconds_to_next_month",
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
    ``concurrency`` counts leases of requests in flight; the budgets count tokens per UTC
    calendar day and month.
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


@dataclass(frozen=True, slots=True)
class Scope:
    """One set of counters a request is admitted against, named within its tenant.

    Names are ``tenant``, ``key:<key id>`` and ``model:<model>`` when built by
    :func:`build_scopes`; any name without ``{`` or ``}`` works.
    """

    name: str
    limits: Limits
    #: what this scope's tpm and budgets count: tokens, or cost in micro-units (spend limits,
    #: reserved from the request's ``estimated_cost`` and settled with its actual cost)
    unit: Literal["tokens", "cost"] = "tokens"

    def __post_init__(self) -> None:
        if not self.name or "{" in self.name or "}" in self.name:
            raise ValueError(f"bad scope name {self.name!r}")
        if self.unit not in ("tokens", "cost"):
            raise ValueError(f"bad scope unit {self.unit!r}")


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


def period_ids(now: float) -> tuple[int, int]:
    """The UTC day (``yyyymmdd``) and month (``yyyymm``) that contain ``now`` (epoch seconds)."""
    t = datetime.fromtimestamp(now, UTC)
    return t.year * 10000 + t.month * 100 + t.day, t.year * 100 + t.month


def seconds_to_next_day(now: float) -> float:
    """Seconds until the next UTC midnight: when a daily budget starts again."""
    return 86400.0 - (now % 86400.0)


def seconds_to_next_month(now: float) -> float:
    """Seconds until the first UTC midnight of next month: when a monthly budget starts again."""
    t = datetime.fromtimestamp(now, UTC)
    days_left = calendar.monthrange(t.year, t.month)[1] - t.day
    return days_left * 86400.0 + seconds_to_next_day(now)
