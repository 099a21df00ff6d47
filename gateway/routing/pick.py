"""Choosing a backend inside a pool: pure functions of the backends' state.

``least_loaded``: two random candidates (power of two choices), the one with the lower cost
wins. Cost = (outstanding + engine queue + 1) / weight, times a latency penalty from the EWMA of
observed TTFT and decode time relative to the pool's best, times a KV-pressure penalty when the
engine reports its cache nearly full. Comparing two random candidates rather than taking the
global minimum keeps many gateway processes from piling onto one momentarily idle backend.
Prefill-aware (the pool's ``prefill_aware``, on by default): of the two, the one with fewer
streamed requests still waiting for their first chunk (``BackendState.prefilling``), or with as
many, the one whose pending requests were sent earlier on average (nearer their first chunk:
in the step in progress rather than in the next), wins while its load is within
``PREFILL_BOUND`` x the other's, cost deciding otherwise. An engine steps
all its sequences together, so a newcomer's first token waits for the step in progress and
shares its own step with every prefill already scheduled there: on a busy engine each of them
adds a whole prefill (a 256-token one is as long as a decode step) to the newcomer's TTFT,
while one more decode costs it almost nothing.

Affinity: rendezvous hashing of a conversation key gives every conversation a stable backend
order; the first backend in that order whose load is within ``bounded_load`` x the pool mean
takes it, so prefix caches are reused without letting one backend overload.

Prefix: among the backends within the same load bound, the one that was sent the longest prefix
of this prompt (``gateway.routing.prefix``) takes it, the lower cost breaking a tie; when none
holds any of it, least loaded. Only the candidates given are considered: the pool has already
left out ejected and full backends, whatever their cached prefix.
"""

from __future__ import annotations

import hashlib
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gateway.routing.backend import BackendState

__all__ = [
    "PREFILL_BOUND",
    "cost",
    "pick_affine",
    "pick_least_loaded",
    "pick_prefix",
    "pick_round_robin",
]

#: a prefill-aware pick takes the backend with fewer requests awaiting their first chunk while
#: its load is at most this x the other's (the default bound of affinity and prefix routing)
PREFILL_BOUND = 1.25


def _latency_penalty(b: BackendState, best_ttft: float, best_tpot: float) -> float:
    penalty = 1.0
    if best_ttft > 0 and b.ttft_ewma > best_ttft:
        penalty *= min(10.0, b.ttft_ewma / best_ttft) ** 0.5
    if best_tpot > 0 and b.tpot_ewma > best_tpot:
        penalty *= min(10.0, b.tpot_ewma / best_tpot) ** 0.5
    return penalty


def _load(b: BackendState) -> float:
    return (b.in_flight + b.engine_waiting + 1) / b.config.weight


def cost(b: BackendState, best_ttft: float = 0.0, best_tpot: float = 0.0) -> float:
    """Lower is better."""
    load = _load(b)
    kv = 4.0 if b.engine_kv_usage >= 0.95 else 1.0
    return load * kv * _latency_penalty(b, best_ttft, best_tpot)


def _best(candidates: Sequence[BackendState]) -> tuple[float, float]:
    ttfts = [b.ttft_ewma for b in candidates if b.ttft_ewma > 0]
    tpots = [b.tpot_ewma for b in candidates if b.tpot_ewma > 0]
    return (min(ttfts) if ttfts else 0.0, min(tpots) if tpots else 0.0)


def pick_least_loaded(
    candidates: Sequence[BackendState],
    rng: random.Random | None = None,
    prefill_aware: bool = False,
) -> BackendState | None:
    """Power of two choices on :func:`cost` (``prefill_aware``: fewer requests awaiting their
    first chunk first, within :data:`PREFILL_BOUND`); None when there is no candidate."""
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0]
    r = rng or random
    a, b = r.sample(candidates, 2)
    if prefill_aware and (a.prefilling or b.prefilling):
        if a.prefilling != b.prefilling:
            fewer, more = (a, b) if a.prefilling < b.prefilling else (b, a)
        else:  # as many pending: the older ones are nearer their first chunk
            fewer, more = (a, b) if a.prefill_since <= b.prefill_since else (b, a)
        if _load(fewer) <= PREFILL_BOUND * _load(more) and fewer.engine_kv_usage < 0.95:
            return fewer
    best_ttft, best_tpot = _best(candidates)
    return a if cost(a, best_ttft, best_tpot) <= cost(b, best_ttft, best_tpot) else b


def pick_round_robin(candidates: Sequence[BackendState], counter: int) -> BackendState | None:
    if not candidates:
        return None
    return candidates[counter % len(candidates)]


def _rank(key: bytes, backend: BackendState) -> int:
    digest = hashlib.blake2b(key + backend.label.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def pick_affine(
    candidates: Sequence[BackendState], key: bytes, bounded_load: float
) -> BackendState | None:
    """The conversation's preferred backend within the load bound, else None."""
    if not candidates:
        return None
    mean = sum(b.in_flight / b.config.weight for b in candidates) / len(candidates)
    limit = bounded_load * (mean + 1)
    for b in sorted(candidates, key=lambda b: _rank(key, b), reverse=True):
        if (b.in_flight + 1) / b.config.weight <= limit:
            return b
    return None


def pick_prefix(
    candidates: Sequence[BackendState],
    depth: Callable[[BackendState], int],
    bounded_load: float,
    rng: random.Random | None = None,
    prefill_aware: bool = False,
) -> BackendState | None:
    """The candidate within the load bound holding the longest cached prefix (``depth``: its
    length in chunks); least loaded (``prefill_aware`` or not) when none holds any; None when
    there is no candidate."""
    if not candidates:
        return None
    mean = sum(b.in_flight / b.config.weight for b in candidates) / len(candidates)
    limit = bounded_load * (mean + 1)
    best: BackendState | None = None
    best_depth, best_cost = 0, 0.0
    for b in candidates:
        d = depth(b)
        if d < best_depth or d == 0 or (b.in_flight + 1) / b.config.weight > limit:
            continue
        c = cost(b)
        if d > best_depth or c < best_cost:
            best, best_depth, best_cost = b, d, c
    return best if best is not None else pick_least_loaded(candidates, rng, prefill_aware)
