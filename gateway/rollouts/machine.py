"""The rollout state machine: phases, the transitions between them, and the decision of one
tick. Pure: no I/O, the time is an argument (tests drive it with a fake clock).

::

    pending --start--> progressing(0) --advanced--> progressing(1) ... --promoted--> promoted
    (progressing at a 0% step is a shadow stage: judged on mirrored requests only)
                          |    ^                                  |
                pause     v    | resume                 gate:<name> (one gate fails)
                        paused                                    v
                                                             rolled_back (0%)
    any live phase --abort--> aborted (0%);  any phase but promoted --promote--> promoted (100%)
    a changed definition (reload) --definition_changed--> pending (a new rollout)

Every transition makes a new window (``epoch`` + 1: counts start again), bumps ``revision``
(stores write a state only over the revision it was read at) and is kept in ``history``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from gateway.config.model import seconds
from gateway.rollouts.gates import GateResult, evaluate, evaluate_shadow

if TYPE_CHECKING:
    from gateway.config.model import Progressive
    from gateway.rollouts.counts import Histogram, Window

__all__ = ["ACTIONS", "HISTORY", "InvalidAction", "Phase", "RolloutState", "act", "decide",
           "restart", "transition"]

#: transitions kept in a state's history
HISTORY = 50


class Phase(StrEnum):
    PENDING = "pending"
    PROGRESSING = "progressing"
    PAUSED = "paused"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"


_LIVE = frozenset({Phase.PENDING, Phase.PROGRESSING, Phase.PAUSED})


class InvalidAction(ValueError):
    """An operator action that does not apply to the rollout's phase (409)."""


@dataclass(slots=True)
class RolloutState:
    """One model's rollout: what the canary's share is now, and how it got there."""

    model: str
    version: str  # the canary's label
    definition: str  # hash of the progressive definition it runs
    steps: list[float]
    phase: Phase = Phase.PENDING
    step: int = 0
    since: float = 0.0  # wall clock of the last transition
    epoch: int = 0
    revision: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def share(self) -> float:
        """The canary's share of traffic, percent."""
        if self.phase in (Phase.PROGRESSING, Phase.PAUSED):
            return self.steps[self.step]
        return 100.0 if self.phase is Phase.PROMOTED else 0.0

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["phase"] = str(self.phase)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutState:
        return cls(**{**data, "phase": Phase(data["phase"])})

    def __repr__(self) -> str:
        return (f"<RolloutState {self.model}/{self.version} {self.phase}({self.step}) "
                f"{self.share:g}% [epoch {self.epoch} | revision {self.revision}]>")


def transition(state: RolloutState, phase: Phase, step: int, reason: str, now: float,
               by: str = "gateway") -> RolloutState:
    """``state`` moved to ``phase`` at ``step`` for ``reason`` (a new window)."""
    entry = {"at": round(now, 3), "from": str(state.phase), "to": str(phase),
             "from_step": state.step, "step": step, "reason": reason, "by": by}
    moved = dataclasses.replace(state, phase=phase, step=step, since=now,
                                epoch=state.epoch + 1, revision=state.revision + 1,
                                history=[*state.history, entry][-HISTORY:])
    moved.history[-1]["share"] = moved.share
    return moved


def restart(model: str, version: str, definition: str, steps: list[float], now: float,
            previous: RolloutState | None, reason: str) -> RolloutState:
    """A new rollout (pending) over ``previous``, whose revision and epoch it continues."""
    if previous is None:
        return RolloutState(model, version, definition, list(steps), since=now)
    base = dataclasses.replace(previous, version=version, definition=definition,
                               steps=list(steps))
    return transition(base, Phase.PENDING, 0, reason, now)


def _next(state: RolloutState, now: float) -> RolloutState:
    after = state.step + 1
    if after >= len(state.steps) or state.steps[after] >= 100:
        return transition(state, Phase.PROMOTED, state.step, "promoted", now)
    return transition(state, Phase.PROGRESSING, after, "advanced", now)


def decide(state: RolloutState, definition: Progressive, window: Window, now: float,
           agreement: tuple[int, int] | None = None,
           shadow_ttft: tuple[Histogram, Histogram] | None = None,
           ) -> tuple[RolloutState | None, list[GateResult]]:
    """The transition of one tick, if any, and the gate verdicts it read.

    A pending rollout starts at its first step. While progressing, once the window holds
    ``min_requests`` on the canary a failing gate rolls it back at once; after ``hold`` a
    window where every gate passes advances it (the last step promotes). Waiting gates hold
    the step. At a shadow stage (a step of 0%) the evidence is the mirrored requests:
    ``min_requests`` compared answers, and the shadow gates (:func:`evaluate_shadow`).
    """
    if state.phase is Phase.PENDING:
        return transition(state, Phase.PROGRESSING, 0, "started", now), []
    if state.phase is not Phase.PROGRESSING:
        return None, []
    if state.steps[state.step] == 0:  # shadow stage
        if (agreement[1] if agreement is not None else 0) < definition.min_requests:
            return None, []
        results = evaluate_shadow(definition, agreement, shadow_ttft)
    else:
        if window.requests("canary") < definition.min_requests:
            return None, []
        results = evaluate(definition, window, agreement)
    failed = [r.name for r in results if r.verdict == "fail"]
    if failed:
        return transition(state, Phase.ROLLED_BACK, state.step, f"gate:{failed[0]}", now), \
            results
    if now - state.since >= seconds(definition.hold) and all(
            r.verdict == "pass" for r in results):
        return _next(state, now), results
    return None, results


def act(state: RolloutState, action: str, now: float, by: str) -> RolloutState:
    """An operator's ``pause``, ``resume``, ``promote`` or ``abort``; :class:`InvalidAction`
    when it does not apply."""
    phase = state.phase
    if action == "pause" and phase in (Phase.PENDING, Phase.PROGRESSING):
        return transition(state, Phase.PAUSED, state.step, "operator:pause", now, by)
    if action == "resume" and phase is Phase.PAUSED:
        return transition(state, Phase.PROGRESSING, state.step, "operator:resume", now, by)
    if action == "promote" and phase is not Phase.PROMOTED:
        return transition(state, Phase.PROMOTED, state.step, "operator:promote", now, by)
    if action == "abort" and (phase in _LIVE or phase is Phase.PROMOTED):
        return transition(state, Phase.ABORTED, state.step, "operator:abort", now, by)
    if action not in ACTIONS:
        raise InvalidAction(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")
    raise InvalidAction(f"cannot {action} a rollout that is {phase}")


#: the operator actions
ACTIONS = ("pause", "resume", "promote", "abort")
