"""The decision loop on synthetic traffic with a fake clock: faults roll back within one hold
window, a healthy canary is promoted in len(steps) windows, noise does not flap."""

from __future__ import annotations

import pytest

from gateway.rollouts import Phase
from tests.rollouts.synthetic import drive, failing, healthy, policy, slow_ttft

STEPS = [1.0, 5.0, 25.0, 50.0, 100.0]


def _transitions(run: object) -> list[tuple[str, float]]:
    state = run.state  # type: ignore[attr-defined]
    return [(e["reason"], e["at"]) for e in state.history]


def test_healthy_canary_reaches_100_percent_in_len_steps_windows() -> None:
    """5 steps at 1000 requests/s: started, then one advance per hold window, promoted."""
    run = drive(policy(STEPS), healthy, windows=len(STEPS), rate=1000)
    reasons = [r for r, _ in _transitions(run)]
    assert run.state.phase is Phase.PROMOTED, reasons
    assert reasons == ["started", "advanced", "advanced", "advanced", "promoted"]
    assert run.state.share == 100.0


@pytest.mark.parametrize("answer, gate", [
    pytest.param(failing(0.05), "gate:error_rate", id="error-rate-5pct"),
    pytest.param(slow_ttft(2.0), "gate:ttft_p90", id="ttft-2x"),
])
def test_faulty_canary_is_rolled_back_within_one_hold_window(answer: object, gate: str
                                                              ) -> None:
    """At the first step (1% of 1000 requests/s: 10 a second on the canary), the rollback
    comes once the canary has min_requests (200), before its first hold (60 s) ends."""
    run = drive(policy(STEPS), answer, windows=1.5, rate=1000)  # type: ignore[arg-type]
    history = run.state.history
    assert run.state.phase is Phase.ROLLED_BACK, [e["reason"] for e in history]
    started, rolled = history[0], history[-1]
    assert rolled["reason"] == gate
    assert rolled["at"] - started["at"] <= run.hold
    assert run.state.share == 0.0
    assert run.rollouts.weights("m")[0][1] == 0.0  # type: ignore[index]


def test_small_counts_do_not_decide() -> None:
    """Below min_requests nothing moves, even with every canary request failing."""
    run = drive(policy(STEPS, min_requests=10_000), failing(1.0), windows=3, rate=1000)
    assert run.state.phase is Phase.PROGRESSING
    assert run.state.step == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noisy_healthy_canary_does_not_flap_over_20_windows(seed: int) -> None:
    """Jittered but identical versions over 20 hold windows of 21 steps: 20 decisions,
    every one an advance (the last a promotion), none a rollback."""
    steps = [float(i) for i in range(1, 21)] + [100.0]
    run = drive(policy(steps, min_requests=100), healthy, windows=20, rate=300, seed=seed)
    reasons = [r for r, _ in _transitions(run)]
    assert not [r for r in reasons if r.startswith("gate:")], reasons
    assert reasons == ["started", *["advanced"] * 19, "promoted"]


def test_a_waiting_baseline_holds_the_step() -> None:
    """A canary with data but too few baseline samples for a p90 bound waits."""
    run = drive(policy([50.0, 100.0], min_requests=5), healthy, windows=2, rate=5,
                ticks_per_hold=2)
    assert run.state.phase in (Phase.PROGRESSING, Phase.PROMOTED)


class _Agreement:
    """What the shadow comparisons (``Mirror.comparisons``) give the gate: (agreed, compared)
    since the process started; here ``compared`` grows by 20 between two readings, of which
    ``agreed`` agree."""

    def __init__(self, agreed: int, compared: int) -> None:
        self.rate = agreed / compared
        self.compared = 0
        self.asked: list[tuple[str, str]] = []

    def agreement(self, model: str, version: str) -> tuple[int, int] | None:
        self.asked.append((model, version))
        self.compared += 20
        return round(self.rate * self.compared), self.compared


@pytest.mark.parametrize("agreed, phase", [
    pytest.param(60, Phase.ROLLED_BACK, id="disagreeing"),
    pytest.param(199, Phase.PROMOTED, id="agreeing"),
])
def test_the_shadow_agreement_gate_reads_the_agreement_source(agreed: int, phase: Phase
                                                              ) -> None:
    from gateway.config.model import AgreementGate, RolloutGates
    from tests.rollouts import synthetic

    source = _Agreement(agreed, 200)
    gates = RolloutGates(shadow_agreement=AgreementGate(min=0.9))
    run = synthetic.drive(policy([50.0, 100.0], min_requests=50, gates=gates), healthy,
                          windows=1.5, rate=200, agreement=source)
    assert run.state.phase is phase, [e["reason"] for e in run.state.history]
    assert ("m", "canary") in source.asked


def test_without_a_shadow_comparison_the_agreement_gate_holds_the_step() -> None:
    from gateway.config.model import AgreementGate, RolloutGates

    gates = RolloutGates(shadow_agreement=AgreementGate(min=0.9))
    run = drive(policy([50.0, 100.0], min_requests=50, gates=gates), healthy, windows=3,
                rate=200)
    assert (run.state.phase, run.state.step) == (Phase.PROGRESSING, 0)
