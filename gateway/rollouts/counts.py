"""What a rollout counts of the requests it routes: per (version role, class), in the window
of the current step.

Latencies go into log-spaced histograms (5% wide buckets from 0.1 ms), not sample lists: a
replica's window is a few hundred numbers whatever the traffic, and the windows of all
replicas add up bucket by bucket (what the deciding replica reads from Redis). Quantile
figures are read at a bucket's upper edge, so they are off by at most 5%, on the side of
caution for the baseline's bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Arm", "Histogram", "Window", "bucket_of", "edge_of"]

_BASE = 1e-4  # seconds: the first bucket's lower edge
_GROWTH = 1.05
_LOG_GROWTH = math.log(_GROWTH)
_LAST = 400  # 1e-4 * 1.05**400 is about 30,000 s


def bucket_of(seconds: float) -> int:
    """The bucket holding ``seconds``: bucket i spans (edge(i-1), edge(i)]."""
    if seconds <= _BASE:
        return 0
    return min(_LAST, math.ceil(math.log(seconds / _BASE) / _LOG_GROWTH - 1e-9))


def edge_of(bucket: int) -> float:
    """The upper edge of a bucket, seconds."""
    return _BASE * _GROWTH ** bucket


@dataclass(slots=True)
class Histogram:
    """Counts per bucket (sparse)."""

    counts: dict[int, int] = field(default_factory=dict)
    total: int = 0

    def add(self, seconds: float) -> None:
        b = bucket_of(seconds)
        self.counts[b] = self.counts.get(b, 0) + 1
        self.total += 1

    def merge(self, other: Histogram) -> None:
        for b, c in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + c
        self.total += other.total

    def rank_value(self, rank: int) -> float:
        """The upper edge of the bucket holding the ``rank``-th smallest sample (1-based)."""
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return edge_of(b)
        return math.inf

    def quantile(self, q: float) -> float | None:
        if self.total == 0:
            return None
        return self.rank_value(max(1, math.ceil(q * self.total)))

    def above(self, threshold: float) -> int:
        """Samples surely above ``threshold``: those in buckets whose lower edge is >= it."""
        return sum(c for b, c in self.counts.items() if b > 0 and edge_of(b - 1) >= threshold)

    def to_json(self) -> dict[str, int]:
        return {str(b): c for b, c in self.counts.items()}

    @classmethod
    def from_json(cls, data: dict[str, int]) -> Histogram:
        counts = {int(b): int(c) for b, c in data.items()}
        return cls(counts, sum(counts.values()))


@dataclass(slots=True)
class Arm:
    """One side of the comparison (canary or baseline) in one class."""

    requests: int = 0
    errors: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)
    #: output tokens: count of requests with a usage, sum, sum of squares
    token_n: int = 0
    tokens: float = 0.0
    tokens_sq: float = 0.0

    def merge(self, other: Arm) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.ttft.merge(other.ttft)
        self.tpot.merge(other.tpot)
        self.token_n += other.token_n
        self.tokens += other.tokens
        self.tokens_sq += other.tokens_sq

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors, "ttft": self.ttft.to_json(),
                "tpot": self.tpot.to_json(), "token_n": self.token_n, "tokens": self.tokens,
                "tokens_sq": self.tokens_sq}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Arm:
        return cls(int(data["requests"]), int(data["errors"]),
                   Histogram.from_json(data["ttft"]), Histogram.from_json(data["tpot"]),
                   int(data["token_n"]), float(data["tokens"]), float(data["tokens_sq"]))


@dataclass(slots=True)
class Window:
    """The counts of one rollout step: (role, class) -> :class:`Arm`; role is ``canary`` or
    ``baseline``."""

    arms: dict[tuple[str, str], Arm] = field(default_factory=dict)

    def arm(self, role: str, request_class: str) -> Arm:
        key = (role, request_class)
        arm = self.arms.get(key)
        if arm is None:
            arm = self.arms[key] = Arm()
        return arm

    def requests(self, role: str) -> int:
        return sum(a.requests for (r, _), a in self.arms.items() if r == role)

    def classes(self) -> list[str]:
        return sorted({c for _, c in self.arms})

    def merge(self, other: Window) -> None:
        for (role, cls), arm in other.arms.items():
            self.arm(role, cls).merge(arm)

    def to_json(self) -> dict[str, Any]:
        return {f"{role}|{cls}": arm.to_json() for (role, cls), arm in self.arms.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Window:
        window = cls()
        for key, arm in data.items():
            role, _, request_class = key.partition("|")
            window.arms[(role, request_class)] = Arm.from_json(arm)
        return window
