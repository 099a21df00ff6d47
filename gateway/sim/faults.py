"""Fault injection: process-wide defaults from flags, overridden per request by headers.

=============================  ========================================================
header                          effect
=============================  ========================================================
``x-sim-error-status: 500``     answer this status (OpenAI-shaped error) ...
``x-sim-error-rate: 0.3``       ... with this probability (default 1 when a status is set)
``x-sim-extra-latency-ms: N``   wait N ms before the response starts
``x-sim-stall-ms: N``           stall N ms before the first token (after headers if streaming)
``x-sim-disconnect-after: N``   close the connection after N content chunks, mid-stream
``x-sim-retry-after: N``        answer 429 with ``Retry-After: N``
=============================  ========================================================

Latencies are wall-clock milliseconds and are not divided by the engine's speed-up: they model the
network and broken backends, not the GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import random
    from collections.abc import Iterable

__all__ = ["HEADERS", "FaultConfig", "FaultHeaderError", "parse_faults"]

#: header name -> FaultConfig field
HEADERS: dict[bytes, str] = {
    b"x-sim-error-status": "error_status",
    b"x-sim-error-rate": "error_rate",
    b"x-sim-extra-latency-ms": "extra_latency_ms",
    b"x-sim-stall-ms": "stall_ms",
    b"x-sim-disconnect-after": "disconnect_after",
    b"x-sim-error-event-after": "error_event_after",
    b"x-sim-retry-after": "retry_after",
}
_INT_FIELDS = {"error_status", "disconnect_after", "error_event_after", "retry_after"}


class FaultHeaderError(ValueError):
    """A fault header's value is not a valid number; the request is answered 400."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultConfig:
    """Faults to inject into one request (all off by default)."""

    error_status: int | None = None
    #: Probability of answering ``error_status``; ``None`` means 1 when a status is set.
    error_rate: float | None = None
    extra_latency_ms: float = 0.0
    stall_ms: float = 0.0
    disconnect_after: int | None = None
    #: a stream ends after this many tokens with an in-stream error event and a clean end (an
    #: engine that fails mid-generation: vLLM's ``data: {"error": ...}``)
    error_event_after: int | None = None
    retry_after: int | None = None

    @property
    def active(self) -> bool:
        return self != _NONE

    def error_to_inject(self, rng: random.Random) -> int | None:
        """The status to answer with, or ``None``; draws from ``rng`` only when a rate applies."""
        if self.error_status is None and self.error_rate is None:
            return None
        rate = 1.0 if self.error_rate is None else self.error_rate
        if rate >= 1.0 or (rate > 0.0 and rng.random() < rate):
            return self.error_status if self.error_status is not None else 500
        return None


_NONE = FaultConfig()


def parse_faults(headers: Iterable[tuple[bytes, bytes]], defaults: FaultConfig) -> FaultConfig:
    """``defaults`` with the fields named by ``x-sim-*`` headers replaced.

    A header status without a header rate means rate 1: the header's author asked for the error.
    """
    changes: dict[str, float | int] = {}
    for name, value in headers:
        field = HEADERS.get(name.lower())
        if field is None:
            continue
        try:
            changes[field] = int(value) if field in _INT_FIELDS else float(value)
        except ValueError:
            raise FaultHeaderError(
                f"header {name.decode('latin-1')}: not a number: {value.decode('latin-1')!r}"
            ) from None
    if not changes:
        return defaults
    if "error_status" in changes and "error_rate" not in changes:
        changes["error_rate"] = 1.0
    return dataclasses.replace(defaults, **changes)  # type: ignore[arg-type]
