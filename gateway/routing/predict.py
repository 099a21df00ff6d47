"""Predicting a request's time to first token on a backend, before sending it.

Why: a pool's recent TTFT p90 says how the last requests fared, not how the next one will. On a
prefill-bound engine a new request's first token waits for every prompt token sent before it,
then for its own; a 2,300-token prompt behind five others waits six prefills, a 100-token one
behind none waits almost nothing. Borrowing and shedding decide on that figure.

The model, per backend (a fluid queue of prompt tokens):

- ``work``: prompt tokens the gateway sent to the backend whose prefill may not be done yet. Each
  start adds its tokens; the engine drains them at its learned prefill rate. The scraped
  ``num_requests_waiting`` (requests other gateways sent, or an engine that stalled) sets a
  floor: that many prompts of the backend's mean size.
- ``seconds_per_token``: learned from observed TTFTs. An observation is matched with its start
  by the time the request was sent (the latest start noted at or before it, on the same
  ``perf_counter_ns`` clock; without one, the oldest open start), and its TTFT divided by the
  tokens that were ahead of it plus its own is one sample (EWMA; the first sample replaces the
  default outright, so a slower engine is learned from its first answer). It is the effective cost
  under load (decode steps interleaved with chunked prefill included), and the same rate
  drains ``work``, so the two agree: a rate set too low leaves too little work ahead and the
  next samples raise it, and the reverse.
  Before any observation: :data:`DEFAULT_SECONDS_PER_TOKEN`.
- a stall: the oldest start still waiting for its first token has waited ``age`` for
  ``tokens`` (its own plus those ahead of it); its sample will be at least ``age / tokens``, so
  the prediction uses that when it is the higher rate, and reacts to an engine that slowed
  down within the wait, not one TTFT after it. Starts that expect no first token (answers
  that are not streamed) are closed when sent.
- recent waits: each observed TTFT minus its own prompt's prefill is how long it waited behind
  others (EWMA). While any start is still waiting for its first token, the time ahead of a new
  request is at least that recent wait: ground truth one TTFT late, a floor under a model that
  may have drained its fluid queue too fast. With nothing waiting it is ignored, so an idle
  backend never looks busy.
- KV pressure: an engine reporting its cache >= :data:`KV_FULL` full cannot admit a new
  sequence until one finishes; the prediction is doubled (a penalty, not a model).

``predict = (work_ahead + own_tokens) * seconds_per_token`` (x2 when the KV cache is full).
Everything is plain arithmetic on the object, no I/O; the pool calls it on its own backends.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.routing.backend import BackendState

__all__ = [
    "DEFAULT_SECONDS_PER_TOKEN",
    "KV_FULL",
    "BackendLoad",
    "Prediction",
    "Predictor",
]

#: 40 prompt tokens per ms: an 8B model on one H100 (see the simulator's calibration)
DEFAULT_SECONDS_PER_TOKEN = 2.5e-5
#: engine KV-cache use at which new sequences wait for a running one to finish
KV_FULL = 0.95
_ALPHA = 0.15  # weight of the newest sample in the learned rate
_WAIT_ALPHA = 0.3  # weight of the newest observed wait behind others
_MAX_OPEN = 4096  # open starts kept per backend (the rest are forgotten, oldest first)


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted time to first token and the part of it spent behind other requests."""

    ttft: float  # seconds from now to the first token
    ahead: float  # seconds of it waiting for other requests (0: nothing ahead)


class BackendLoad:
    """The fluid prefill queue of one backend, as this gateway process sees it."""

    __slots__ = ("_at", "_open", "learned", "mean_tokens", "recent_wait", "seconds_per_token",
                 "work")

    def __init__(self) -> None:
        self.work = 0.0  # prompt tokens sent whose prefill may not be done
        self._at = 0.0  # monotonic time ``work`` was last drained to
        self.seconds_per_token = DEFAULT_SECONDS_PER_TOKEN
        self.learned = False  # a sample has replaced the default
        self.recent_wait = 0.0  # EWMA of observed TTFT minus own prefill, seconds
        self.mean_tokens = 0.0  # EWMA of the prompt tokens started here
        #: (started at, own tokens, tokens ahead) per start, oldest first
        self._open: deque[tuple[int, int, float]] = deque()

    def drain(self, now: float) -> float:
        """``work`` after the engine prefilled at its rate since the last call."""
        if now > self._at:
            self.work = max(0.0, self.work - (now - self._at) / self.seconds_per_token)
            self._at = now
        return self.work

    def ahead(self, backend: BackendState, now: float) -> float:
        """Prompt tokens ahead of a request sent now: the fluid queue, floored by the scrape."""
        scraped = backend.engine_waiting * self.mean_tokens
        return max(self.drain(now), scraped)

    def start(self, tokens: int, ahead: float, now: float, started_ns: int = 0) -> None:
        self.drain(now)
        self.work += tokens
        self.mean_tokens = tokens if not self.mean_tokens else (
            _ALPHA * tokens + (1 - _ALPHA) * self.mean_tokens)
        self._open.append((started_ns, tokens, ahead))
        if len(self._open) > _MAX_OPEN:
            self._open.popleft()

    def rate(self, now_ns: int) -> float:
        """Seconds per prompt token, raised by the oldest start still waiting (a stall)."""
        if not self._open:
            return self.seconds_per_token
        started, tokens, ahead = self._open[0]
        total = tokens + ahead
        if not started or total < 1:
            return self.seconds_per_token
        return max(self.seconds_per_token, (now_ns - started) / 1e9 / total)

    def _match(self, sent_ns: int | None) -> tuple[int, int, float] | None:
        """Remove and return the start of the request sent at ``sent_ns``."""
        entries = self._open
        if not entries:
            return None
        if sent_ns is not None:
            for i in range(len(entries) - 1, -1, -1):
                if entries[i][0] <= sent_ns:
                    entry = entries[i]
                    del entries[i]
                    return entry
        return entries.popleft()

    def observe(self, ttft: float | None, sent_ns: int | None = None) -> None:
        """A first token came back (``ttft``): one sample of the effective prefill cost; None:
        the request expects none (not streamed), forget its start."""
        entry = self._match(sent_ns)
        if entry is None or ttft is None:
            return
        _, tokens, ahead = entry
        total = tokens + ahead
        if total < 1 or ttft <= 0:
            return
        sample = ttft / total
        self.seconds_per_token = sample if not self.learned else (
            _ALPHA * sample + (1 - _ALPHA) * self.seconds_per_token)
        self.learned = True
        wait = max(0.0, ttft - tokens * self.seconds_per_token)
        self.recent_wait = _WAIT_ALPHA * wait + (1 - _WAIT_ALPHA) * self.recent_wait

    def waiting(self) -> bool:
        """Is a start still waiting for its first token?"""
        return bool(self._open)

    def settle(self, open_requests: int) -> None:
        """Forget starts that ended without an observation (failed, cancelled)."""
        while len(self._open) > max(0, open_requests):
            self._open.popleft()


class Predictor:
    """Per-backend loads of one pool, and the prediction for a request of ``tokens``."""

    __slots__ = ("_loads",)

    def __init__(self) -> None:
        self._loads: dict[BackendState, BackendLoad] = {}

    def load(self, backend: BackendState) -> BackendLoad:
        state = self._loads.get(backend)
        if state is None:
            state = self._loads[backend] = BackendLoad()
        return state

    def predict(self, backend: BackendState, tokens: int, now: float) -> Prediction:
        """Time to first token of a request of ``tokens`` prompt tokens sent to it now."""
        load = self.load(backend)
        rate = load.rate(time.perf_counter_ns())
        ahead = load.ahead(backend, now) * rate
        if load.waiting():
            ahead = max(ahead, load.recent_wait)
        ttft = ahead + max(0, tokens) * rate
        if backend.engine_kv_usage >= KV_FULL:
            return Prediction(2 * ttft, 2 * ttft)
        return Prediction(ttft, ahead)

    def start(self, backend: BackendState, tokens: int, now: float) -> None:
        """A request of ``tokens`` prompt tokens is about to be sent to ``backend``."""
        load = self.load(backend)
        load.start(tokens, load.ahead(backend, now), now, time.perf_counter_ns())

    def observe(self, backend: BackendState, ttft: float | None,
                sent_ns: int | None = None) -> None:
        """The TTFT of a request sent at ``sent_ns`` (``time.perf_counter_ns``); None: it
        expects no first token."""
        self.load(backend).observe(ttft, sent_ns)

    def settle(self, backend: BackendState) -> None:
        self.load(backend).settle(backend.in_flight)
