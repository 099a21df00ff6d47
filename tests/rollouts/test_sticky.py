"""Sticky conversations through step changes: a conversation on the canary stays on it as
its share grows, one on the baseline moves only when the growing share takes it, and only a
rollback moves conversations off the canary."""

from __future__ import annotations

import itertools

from gateway.config import Model, Version
from gateway.config.model import Progressive
from gateway.rollouts import weights_for
from gateway.routing.versions import choose_version

CANARY = Version(backend_model="v2", weight=0, name="canary", progressive=Progressive())
STABLE = Version(backend_model="v1", weight=1, name="stable")
# the canary listed last: its place in the policy must not matter
MODEL = Model(name="m", pool="p", versions=[STABLE, CANARY], sticky="conversation")
KEYS = [f"conversation-{i}".encode() for i in range(3000)]


def _chosen(share: float) -> dict[bytes, str]:
    weights = weights_for(MODEL, CANARY, share)
    out = {}
    for key in KEYS:
        version = choose_version(MODEL, key, weights=weights)
        assert version is not None
        out[key] = version.label
    return out


def test_a_conversation_on_the_canary_stays_there_as_the_share_grows() -> None:
    steps = [1.0, 5.0, 25.0, 50.0, 100.0]
    seen = [_chosen(s) for s in steps]
    for before, after in itertools.pairwise(seen):
        moved_off = [k for k in KEYS if before[k] == "canary" and after[k] != "canary"]
        assert moved_off == []
    shares = [sum(v == "canary" for v in s.values()) / len(KEYS) for s in seen]
    assert abs(shares[2] - 0.25) < 0.03  # and the share is what the step says


def test_only_a_rollback_moves_conversations_off_the_canary() -> None:
    at_25 = _chosen(25.0)
    rolled_back = _chosen(0.0)
    assert any(v == "canary" for v in at_25.values())
    assert all(v == "stable" for v in rolled_back.values())


def test_a_baseline_conversation_moves_only_when_the_step_needs_it() -> None:
    """From 5% to 25% exactly the keys the canary's wider segment covers move: none moves
    back, and a key that stays on the baseline keeps its version."""
    at_5, at_25 = _chosen(5.0), _chosen(25.0)
    moved = [k for k in KEYS if at_5[k] == "stable" and at_25[k] == "canary"]
    assert 0.15 < len(moved) / len(KEYS) < 0.25
    assert all(at_25[k] == "stable" for k in KEYS if at_5[k] == "stable" and k not in moved)


def test_weights_without_a_rollout_keep_the_configured_order() -> None:
    """No rollout weights: the configured weights as before (unchanged behaviour)."""
    model = Model(name="m", pool="p", versions=[Version(backend_model="a", weight=1),
                                                Version(backend_model="b", weight=0)])
    assert {choose_version(model, k).label for k in KEYS[:200]} == {"a"}  # type: ignore[union-attr]
