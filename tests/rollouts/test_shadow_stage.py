"""A shadow stage (a first step of 0%): the canary takes no live traffic and is judged on its
mirrored answers alone (agreement with the primary's and its TTFT against the same requests'
primary TTFT); passing, it becomes a live canary. Synthetic traffic and a fake clock (see
``synthetic``); the comparisons source stands in for ``Mirror.comparisons``, which the e2e
shadow tests exercise for real."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway.config import PolicyError, parse_policy, validate
from gateway.config.model import AgreementGate, LatencyGate, RolloutGates
from gateway.rollouts import Phase
from tests.rollouts.synthetic import drive, healthy, policy


class _Comparisons:
    """Shadow comparisons as ``Mirror.comparisons`` reports them: 20 more compared answers per
    reading, ``rate`` of them agreeing; TTFTs of the shadow ``slow`` x the primary's."""

    def __init__(self, rate: float, slow: float = 1.0) -> None:
        self.rate, self.slow = rate, slow
        self.compared = 0
        self.rng = random.Random(7)

    def agreement(self, model: str, version: str) -> tuple[int, int] | None:
        self.compared += 20
        return round(self.rate * self.compared), self.compared

    def ttfts(self, model: str, version: str, since: float) -> tuple[list[float], list[float]]:
        primary = [self.rng.lognormvariate(-1.6, 0.3) for _ in range(200)]
        return primary, [t * self.slow * self.rng.uniform(0.95, 1.05) for t in primary]


def _policy(steps: list[float], **options: Any) -> Any:
    gates = RolloutGates(shadow_agreement=AgreementGate(min=0.9),
                         ttft_p90=LatencyGate(max_ratio=1.25))
    return policy(steps, min_requests=100, gates=gates, **options)


def _reasons(run: Any) -> list[str]:
    return [e["reason"] for e in run.state.history]


def test_an_agreeing_shadow_becomes_a_live_canary_then_is_promoted() -> None:
    run = drive(_policy([0.0, 50.0, 100.0]), healthy, windows=4, rate=200,
                agreement=_Comparisons(0.99))  # type: ignore[arg-type]
    assert run.state.phase is Phase.PROMOTED, _reasons(run)
    assert _reasons(run)[:2] == ["started", "advanced"]  # the shadow stage, passed
    first = next(e for e in run.state.history if e["reason"] == "advanced")
    assert (first["from_step"], first["step"], first["share"]) == (0, 1, 50.0)
    # while in the shadow stage, the canary's share was 0: no live request went to it
    stage = [share for at, phase, share in run.log if at < first["at"]]
    assert stage and set(stage) == {0.0}


@pytest.mark.parametrize("comparisons, gate", [
    pytest.param(_Comparisons(0.6), "gate:shadow_agreement", id="disagreeing"),
    pytest.param(_Comparisons(0.99, slow=2.0), "gate:ttft_p90", id="twice-the-ttft"),
])
def test_a_failing_shadow_never_takes_live_traffic(comparisons: _Comparisons, gate: str
                                                   ) -> None:
    run = drive(_policy([0.0, 50.0, 100.0]), healthy, windows=3, rate=200,
                agreement=comparisons)  # type: ignore[arg-type]
    assert run.state.phase is Phase.ROLLED_BACK, _reasons(run)
    assert _reasons(run) == ["started", gate]
    assert {share for _, _, share in run.log} == {0.0}


def test_without_comparisons_the_shadow_stage_holds() -> None:
    run = drive(_policy([0.0, 100.0]), healthy, windows=3, rate=200)
    assert (run.state.phase, run.state.step, run.state.share) == (Phase.PROGRESSING, 0, 0.0)


def _yaml_policy(progressive: dict[str, Any], shadow: dict[str, Any] | None) -> dict[str, Any]:
    model: dict[str, Any] = {
        "name": "m", "pool": "p",
        "versions": [{"name": "v1", "backend_model": "a", "weight": 1},
                     {"name": "v2", "backend_model": "b", "weight": 0,
                      "progressive": progressive}]}
    if shadow is not None:
        model["shadow"] = shadow
    return {"pools": [{"name": "p", "backends": [{"url": "http://127.0.0.1:1"}]},
                      {"name": "s", "backends": [{"url": "http://127.0.0.1:2"}]}],
            "models": [model], "auth": {"required": False}}


GATE = {"shadow_agreement": {"min": 0.9}}


def test_a_shadow_stage_policy_is_checked() -> None:
    ok = parse_policy(_yaml_policy({"steps": [0, 10, 100], "gates": GATE},
                                   {"pool": "s", "share": 0.1, "version": "v2"}))
    validate(ok)
    assert ok.models[0].versions[1].progressive.steps[0] == 0  # type: ignore[union-attr]
    bad = [
        ({"steps": [0, 10, 100], "gates": GATE}, None, "shadow.version: v2"),
        ({"steps": [0, 10, 100], "gates": GATE}, {"pool": "s", "share": 0.1}, "shadow.version"),
        ({"steps": [0, 10, 100]}, {"pool": "s", "share": 0.1, "version": "v2"},
         "shadow_agreement"),
        ({"steps": [0], "gates": GATE}, {"pool": "s", "share": 0.1, "version": "v2"},
         "live step"),
        ({"steps": [10, 0, 100], "gates": GATE}, {"pool": "s", "share": 0.1, "version": "v2"},
         "grow"),
    ]
    for progressive, shadow, message in bad:
        with pytest.raises(PolicyError, match=message):
            validate(parse_policy(_yaml_policy(progressive, shadow)))
