"""A model's versions: weighted backend versions (canaries), sticky when configured, and the
decision to mirror a request to a shadow pool. The progressive rollouts that move the weights
over time are ``gateway.rollouts``."""

from __future__ import annotations

import hashlib
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.config import Model, Version

__all__ = ["choose_version", "should_shadow"]


def _unit(key: bytes) -> float:
    """A stable number in [0, 1) for a key."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64


def choose_version(model: Model, sticky_key: bytes | None,
                   rng: random.Random | None = None,
                   weights: Sequence[tuple[Version, float]] | None = None) -> Version | None:
    """A version by weight; the same ``sticky_key`` always gets the same version while the
    weights stay the same.

    ``weights`` (a progressive rollout's, :meth:`gateway.rollouts.Rollouts.weights`) replace
    the configured ones. A sticky key hashes to a point of [0, 1) and takes the version
    whose segment holds it, segments laid out in order: the rollout puts its canary first,
    so a key on the canary at share s (point < s) stays there as s grows.
    """
    if not model.versions:
        return None
    if weights is not None:
        return _pick(weights, _point(model, sticky_key, rng))
    total = sum(v.weight for v in model.versions)
    point = _point(model, sticky_key, rng) * total
    for version in model.versions:
        point -= version.weight
        if point < 0:
            return version
    return model.versions[-1]


def _point(model: Model, sticky_key: bytes | None, rng: random.Random | None) -> float:
    if sticky_key is not None:
        return _unit(model.name.encode() + b"\0" + sticky_key)
    return (rng or random).random()


def _pick(weights: Sequence[tuple[Version, float]], point: float) -> Version:
    """The version whose segment holds ``point`` (weights summing to 1)."""
    last = weights[0][0]
    for version, weight in weights:
        if weight > 0:
            last = version
            point -= weight
            if point < 0:
                return version
    return last


def should_shadow(share: float, rng: random.Random | None = None) -> bool:
    return share > 0 and (rng or random).random() < share
