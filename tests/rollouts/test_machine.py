"""The state machine and the manager around it: operator actions, restarts on a changed
definition, state kept in the data directory across restarts."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gateway.rollouts import InvalidAction, MemoryRolloutStore, Phase, Rollouts
from gateway.rollouts.machine import RolloutState, act, transition
from tests.rollouts.synthetic import Clock, drive, healthy, policy

STEPS = [1.0, 5.0, 25.0, 50.0, 100.0]


def _state() -> RolloutState:
    return transition(RolloutState("m", "canary", "d", STEPS), Phase.PROGRESSING, 0,
                      "started", 1.0)


@pytest.mark.parametrize("action, phase, share", [
    pytest.param("pause", Phase.PAUSED, 1.0, id="pause"),
    pytest.param("promote", Phase.PROMOTED, 100.0, id="promote"),
    pytest.param("abort", Phase.ABORTED, 0.0, id="abort"),
])
def test_operator_actions(action: str, phase: Phase, share: float) -> None:
    moved = act(_state(), action, 2.0, "admin")
    assert (moved.phase, moved.share) == (phase, share)
    assert moved.history[-1]["reason"] == f"operator:{action}"
    assert moved.revision == 2 and moved.epoch == 2  # a new window


@pytest.mark.parametrize("action", ["resume", "bogus"])
def test_an_action_that_does_not_apply_is_refused(action: str) -> None:
    with pytest.raises(InvalidAction):
        act(_state(), action, 2.0, "admin")


def test_pause_holds_the_step_and_resume_decides_again() -> None:
    async def go() -> None:
        clock = Clock()
        rollouts = Rollouts(MemoryRolloutStore(), clock=clock, interval=1.0)
        rollouts.configure(policy(STEPS, min_requests=1))
        await rollouts.tick()
        paused = await rollouts.act("m", "pause", "test")
        clock.now += 3600
        await rollouts.tick()
        assert (await rollouts.state("m")).phase is Phase.PAUSED
        assert paused.share == 1.0
        resumed = await rollouts.act("m", "resume", "test")
        assert resumed.phase is Phase.PROGRESSING and resumed.step == 0

    asyncio.run(go())


def test_state_survives_a_restart_in_the_data_directory(tmp_path: Path) -> None:
    """Two windows at 1000 requests/s reach step 2; a new process reads it back."""
    path = tmp_path / "rollouts.json"
    run = drive(policy(STEPS), healthy, windows=2.05, rate=1000,
                store=MemoryRolloutStore(path))
    assert run.state.step == 2

    async def again() -> RolloutState:
        rollouts = Rollouts(MemoryRolloutStore(path), clock=run.clock, interval=1.0)
        rollouts.configure(policy(STEPS))
        await rollouts.start()
        await rollouts.aclose()
        assert rollouts.weights("m")[0][1] == 0.25  # type: ignore[index]
        return await rollouts.state("m")

    state = asyncio.run(again())
    assert (state.phase, state.step, state.revision) == (Phase.PROGRESSING, 2,
                                                         run.state.revision)


def test_a_changed_definition_restarts_the_rollout_with_a_log_event(
        caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> tuple[RolloutState, RolloutState]:
        clock = Clock()
        rollouts = Rollouts(MemoryRolloutStore(), clock=clock, interval=1.0)
        rollouts.configure(policy(STEPS))
        await rollouts.tick()
        await rollouts.act("m", "promote", "test")
        before = await rollouts.state("m")
        rollouts.configure(policy(STEPS))  # the same definition: nothing happens
        await rollouts.sync()
        assert (await rollouts.state("m")).revision == before.revision
        rollouts.configure(policy([10.0, 100.0]))  # a new one: explicit restart
        with caplog.at_level(logging.INFO, logger="gateway.rollouts"):
            await rollouts.sync()
        return before, await rollouts.state("m")

    before, after = asyncio.run(go())
    assert before.phase is Phase.PROMOTED
    assert after.phase is Phase.PENDING and after.steps == [10.0, 100.0]
    assert after.history[-1]["reason"] == "definition_changed"
    assert after.revision == before.revision + 1
    assert "definition changed" in caplog.text
    assert "rollout.transition" in caplog.text
