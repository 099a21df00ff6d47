"""Rollouts: weighted backend versions of a model (canaries), sticky when configured, and the
decision to mirror a request to a shadow pool."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import Model, Version

__all__ = ["ShadowStats", "choose_version", "should_shadow"]


def _unit(key: bytes) -> float:
    """A stable number in [0, 1) for a key."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64


def choose_version(model: Model, sticky_key: bytes | None,
                   rng: random.Random | None = None) -> Version | None:
    """A version by weight; the same ``sticky_key`` always gets the same version."""
    if not model.versions:
        return None
    total = sum(v.weight for v in model.versions)
    point = (_unit(model.name.encode() + b"\0" + sticky_key) if sticky_key is not None
             else (rng or random).random()) * total
    for version in model.versions:
        point -= version.weight
        if point < 0:
            return version
    return model.versions[-1]


def should_shadow(share: float, rng: random.Random | None = None) -> bool:
    return share > 0 and (rng or random).random() < share


@dataclass
class ShadowStats:
    """Counts of shadow requests (per process)."""

    started: int = 0
    skipped: int = 0  # the shadow pool had no free backend, or too many shadows in flight
    by_status: dict[int, int] = field(default_factory=dict)
    errors: int = 0
    in_flight: int = 0
    latencies: list[float] = field(default_factory=list)
    output_bytes: int = 0
