"""The time range of a usage read: ISO dates or times in, ``[lo, hi)`` unix ms out.

The API (``from``/``to``, and the old ``start``/``end`` inclusive days) and the CLI
(``--from``/``--to``) read ranges the same way: an ISO date is that day's 00:00 UTC, an ISO
time without a zone is UTC, one with a zone is converted. A bad value raises ``WindowError``
naming the parameter, so the API can answer a 400 with ``param`` and the CLI can say which
flag was wrong. Everything here is pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

__all__ = [
    "DAY_MS",
    "HOUR_MS",
    "MAX_RANGE_DAYS",
    "Window",
    "WindowError",
    "iso_day",
    "iso_hour",
    "iso_month",
    "parse_instant",
    "read_window",
    "today_window",
]

HOUR_MS = 3_600_000
DAY_MS = 86_400_000
#: the longest range one usage read may cover (a year and a month of slack)
MAX_RANGE_DAYS = 400
#: instants before the epoch or past year 9999 are refused (no record can be there)
_MAX_MS = int(datetime(9999, 12, 31, tzinfo=UTC).timestamp() * 1000)


class WindowError(ValueError):
    """A range parameter that cannot be read; ``param`` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Window:
    """``[lo, hi)`` in unix ms."""

    lo: int
    hi: int


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def parse_instant(text: str, param: str) -> int:
    """An ISO date (``2024-05-01``: 00:00 UTC) or time (UTC unless a zone is given) as unix
    ms; raises ``WindowError`` naming ``param``."""
    value = text.strip()
    try:
        if len(value) == 10:  # YYYY-MM-DD
            when = datetime.combine(date.fromisoformat(value), datetime.min.time(), UTC)
        else:
            when = datetime.fromisoformat(value)
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
        ms = _ms(when)
    except (ValueError, OverflowError, OSError):
        raise WindowError(f"{param}: {text[:64]!r} is not an ISO date (YYYY-MM-DD) or time "
                          "(YYYY-MM-DDTHH:MM[:SS][+HH:MM])", param) from None
    if not 0 <= ms <= _MAX_MS:
        raise WindowError(f"{param}: {text[:64]!r} is outside 1970..9999", param)
    return ms


def _day(text: str, param: str) -> date:
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise WindowError(f"{param}: {text[:64]!r} is not a day (YYYY-MM-DD)", param) from None


def today_window(now_ms: int | None = None) -> Window:
    """Today, UTC: ``[00:00, 24:00)``."""
    now = now_ms if now_ms is not None else _ms(datetime.now(UTC))
    lo = now - now % DAY_MS
    return Window(lo, lo + DAY_MS)


def read_window(
    *,
    from_: str | None = None,
    to: str | None = None,
    start: str | None = None,
    end: str | None = None,
    hour_aligned: bool = True,
    max_days: int = MAX_RANGE_DAYS,
    now_ms: int | None = None,
) -> Window:
    """The range of a usage read.

    ``from``/``to``: ``[from, to)``, each defaulting to today's bounds (00:00 UTC today, 00:00
    tomorrow). ``start``/``end`` (the old spelling): inclusive UTC days, ``end`` defaulting to
    ``start``. The two spellings cannot be mixed. ``hour_aligned``: both ends must fall on a
    UTC hour (the rollups are hourly, so anything finer could not be answered truthfully).
    """
    if (from_ is not None or to is not None) and (start is not None or end is not None):
        raise WindowError("give from/to or start/end, not both", "start" if from_ is None
                          and start is not None else "from")
    today = today_window(now_ms)
    if start is not None or end is not None:
        first = _day(start, "start") if start is not None else None
        last = _day(end, "end") if end is not None else first
        if first is None:
            first = last
        assert first is not None and last is not None
        try:
            lo = _ms(datetime.combine(first, datetime.min.time(), UTC))
            hi = _ms(datetime.combine(last + timedelta(days=1), datetime.min.time(), UTC))
        except OverflowError:
            raise WindowError("end: past year 9999", "end") from None
        if hi <= lo:
            raise WindowError("end: before start", "end")
        names = ("start", "end")
    else:
        lo = parse_instant(from_, "from") if from_ is not None else today.lo
        hi = parse_instant(to, "to") if to is not None else today.hi
        if hi <= lo:
            raise WindowError("to: must be after from (the range is [from, to); both default "
                              "to today's bounds in UTC)", "to")
        names = ("from", "to")
    if hour_aligned:
        for value, name in ((lo, names[0]), (hi, names[1])):
            if value % HOUR_MS and name in ("from", "to"):
                raise WindowError(f"{name}: usage is kept per UTC hour; give a time on the "
                                  "hour (or a date)", name)
    if hi - lo > max_days * DAY_MS:
        raise WindowError(f"{names[1]}: the range is longer than {max_days} days; ask for "
                          "less at a time", names[1])
    return Window(lo, hi)


def iso_hour(ms: int) -> str:
    """``2024-05-01T13:00:00Z``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_day(ms: int) -> str:
    """``2024-05-01``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


def iso_month(ms: int) -> str:
    """``2024-05``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m")
