"""One backend's live state: load, observed latency, engine signals and health.

Health is a small state machine driven by outcomes (passive) and probes (active):

    healthy --(eject_after consecutive failures)--> ejected --(back-off elapses)--> half-open
    half-open --(one trial request or probe succeeds)--> healthy
    half-open --(it fails)--> ejected again, for twice as long (up to eject_max)

Everything here is synchronous arithmetic on the object; the I/O that produces the outcomes
lives in the forwarder and the health checker.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import Backend, Health

__all__ = ["EWMA_ALPHA", "RETRY_AFTER_CAP", "TTFT_SAMPLES", "BackendState"]

EWMA_ALPHA = 0.2  # weight of the newest observation in the latency averages
#: the newest TTFTs a backend keeps, for the console's percentiles (computed when asked)
TTFT_SAMPLES = 256
#: default longest Retry-After wait, in seconds (the policy's ``routing.retry.retry_after_max``)
RETRY_AFTER_CAP = 60.0


class BackendState:
    """Configuration and live counters of one backend (per process)."""

    __slots__ = (
        "apis",
        "auth_header",
        "config",
        "consecutive_failures",
        "detected_engine",
        "ejected_total",
        "ejected_until",
        "ejections",
        "engine_kv_usage",
        "engine_running",
        "engine_waiting",
        "half_open_trial",
        "in_flight",
        "label",
        "not_before",
        "prefill_since",
        "prefilling",
        "signals_missing",
        "signals_warned",
        "tpot_ewma",
        "ttft_ewma",
        "ttft_recent",
        "urls",
    )

    def __init__(self, config: Backend, label: str) -> None:
        self.label = label
        self.in_flight = 0
        #: streamed requests sent here whose first chunk has not come back yet (queued or
        #: prefilling in the engine): a newcomer's first token waits for their prefill steps.
        #: Counted by the forwarder around one attempt
        self.prefilling = 0
        #: the sum of their start times (monotonic): with as many pending, the backend whose
        #: sum is smaller has the older ones, nearer their first chunk
        self.prefill_since = 0.0
        self.ttft_ewma = 0.0  # seconds; 0 = no observation yet
        #: the last TTFT_SAMPLES TTFTs (seconds), oldest first; an append per observation
        self.ttft_recent: deque[float] = deque(maxlen=TTFT_SAMPLES)
        self.tpot_ewma = 0.0
        self.engine_waiting = 0.0  # from scraped engine metrics
        self.engine_running = 0.0
        self.engine_kv_usage = 0.0
        #: the engine its metrics' names showed (``upstream/engines.py``), when no policy key
        #: names it
        self.detected_engine: str | None = None
        #: its last scrape held none of its engine's metric names; warned of once
        self.signals_missing = False
        self.signals_warned = False
        self.consecutive_failures = 0
        self.ejections = 0
        #: ejections since start, whoever decided them (a request, a stream's end, a health
        #: probe): the ``gateway_ejections_total`` the metrics report from it
        self.ejected_total = 0
        self.ejected_until = 0.0  # monotonic; 0 = not ejected
        self.half_open_trial = False
        self.not_before = 0.0  # honour a backend's Retry-After
        self.configure(config)

    def configure(self, config: Backend) -> None:
        """(Re)apply configuration; live counters are kept across policy reloads."""
        self.config = config
        base = config.url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        # upstream URLs are fixed here, never taken from the request
        self.urls = {
            "/v1/chat/completions": base + "/chat/completions",
            "/v1/completions": base + "/completions",
            "/v1/embeddings": base + "/embeddings",
            "/v1/responses": base + "/responses",
            "/v1/messages": base + "/messages",
        }
        self.apis = config.apis
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        self.auth_header = f"Bearer {key}".encode() if key else None

    # --- load
    @property
    def full(self) -> bool:
        return self.in_flight >= self.config.max_in_flight

    def acquire(self) -> None:
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1

    def prefill_started(self, now: float) -> None:
        """A streamed request was sent here at ``now`` and awaits its first chunk."""
        self.prefilling += 1
        self.prefill_since += now

    def prefill_ended(self, started: float) -> None:
        """Its first chunk came back, or the attempt ended without one (it started at
        ``started``)."""
        self.prefilling -= 1
        self.prefill_since = self.prefill_since - started if self.prefilling else 0.0

    # --- health
    def available(self, now: float) -> bool:
        """May take a new request now (not ejected, not told to wait, not full)."""
        if self.full or now < self.not_before:
            return False
        if self.ejected_until == 0.0:
            return True
        if now < self.ejected_until:
            return False
        return not self.half_open_trial  # one trial at a time when half-open

    def healthy(self, now: float) -> bool:
        return self.ejected_until == 0.0 or now >= self.ejected_until

    def on_pick(self, now: float) -> None:
        if self.ejected_until and now >= self.ejected_until:
            self.half_open_trial = True

    def on_success(self) -> None:
        self.consecutive_failures = 0
        if self.ejected_until:
            self.ejected_until = 0.0
            self.half_open_trial = False
            self.ejections = max(0, self.ejections - 1)

    def on_failure(self, health: Health, now: float) -> bool:
        """Count a failure; returns True when this ejects the backend."""
        self.consecutive_failures += 1
        trial = self.half_open_trial
        self.half_open_trial = False
        if trial or (not self.ejected_until and self.consecutive_failures >= health.eject_after):
            self.ejections += 1
            self.ejected_total += 1
            span = min(health.eject_max, health.eject_base * 2 ** (self.ejections - 1))
            self.ejected_until = now + span
            return True
        return False

    def on_retry_after(self, seconds: float, now: float | None = None,
                       cap: float = RETRY_AFTER_CAP) -> None:
        """Keep out of picks for ``seconds`` (a backend's Retry-After), never more than ``cap``.

        The clamp is here as well as in the parser because this is where the wait is spent: an
        infinite or absurd value would sideline the backend for good (and ``int(inf)`` in a
        pool's Retry-After hint would fail every later request); NaN and <= 0 are ignored.
        """
        if not seconds > 0:  # also NaN
            return
        start = time.monotonic() if now is None else now
        self.not_before = start + min(seconds, cap)

    # --- latency
    def observe(self, ttft: float | None, tpot: float | None) -> None:
        if ttft is not None:
            self.ttft_ewma = ttft if not self.ttft_ewma else (
                EWMA_ALPHA * ttft + (1 - EWMA_ALPHA) * self.ttft_ewma
            )
            self.ttft_recent.append(ttft)
        if tpot is not None:
            self.tpot_ewma = tpot if not self.tpot_ewma else (
                EWMA_ALPHA * tpot + (1 - EWMA_ALPHA) * self.tpot_ewma
            )

    def __repr__(self) -> str:
        state = "ejected" if self.ejected_until else "healthy"
        return (
            f"<BackendState {self.label} [in flight: {self.in_flight}/"
            f"{self.config.max_in_flight} (prefilling {self.prefilling}) | {state}]>"
        )
