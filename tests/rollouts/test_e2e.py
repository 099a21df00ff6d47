"""End to end: a real gateway in front of two simulators (a baseline pool and a canary
pool), driven by real streamed requests, with a hold of 1 s."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.helpers import REPO, GatewayProcess, policy
from tests.rollouts.traffic import (
    ADMIN,
    ADMIN_TOKEN,
    Traffic,
    progressive_policy,
    rollout,
    wait_phase,
)

pytestmark = pytest.mark.process

#: wall-clock stall before the first token (not divided by the simulator's speed-up)
BASE_STALL_MS = 100.0


@pytest.fixture(scope="module")
def baseline() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=20, jitter=0.0, stall_ms=BASE_STALL_MS) as sim:
        yield sim


def _gateway(tmp: Path, baseline: SimServer, canary: SimServer,
             monkeypatch: pytest.MonkeyPatch, **gates: Any) -> GatewayProcess:
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)
    data = progressive_policy(policy({"stable": [baseline.url], "canary": [canary.url]}),
                              steps=[20, 50, 100], hold="1s", min_requests=30, **gates)
    return GatewayProcess(tmp, data)


def test_a_healthy_canary_is_promoted_step_by_step(
        baseline: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SimServer("interactive", speedup=20, jitter=0.0, stall_ms=BASE_STALL_MS) as canary, \
            _gateway(tmp_path, baseline, canary, monkeypatch) as gw, Traffic([gw.url]) as t:
        view = wait_phase(gw.url, {"promoted", "rolled_back"})
        reasons = [e["reason"] for e in view["history"]]
        assert view["phase"] == "promoted", reasons
        assert reasons == ["started", "advanced", "advanced", "promoted"] or \
            reasons == ["started", "advanced", "promoted"], reasons
        assert view["share"] == 100.0
        assert t.by_pool["canary"] > 0
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'gateway_rollout_step{model="chat-model",version="v2"} 100.0' in metrics
        assert 'gateway_rollout_transitions_total{model="chat-model",reason="promoted",' \
               'version="v2"} 1.0' in metrics
        # promoted: every request now goes to the canary's pool
        before = t.by_pool["stable"]
        wait_more = rollout(gw.url)  # a round trip's worth of traffic at least
        assert wait_more["phase"] == "promoted"
        assert t.by_pool["stable"] - before <= 8  # at most the requests already in flight
        # the operators' errors, in the client API's shape
        answer = httpx.post(gw.url + "/admin/rollouts/chat-model/resume", headers=ADMIN)
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "rollout_conflict"
        answer = httpx.post(gw.url + "/admin/rollouts/chat-model/explode", headers=ADMIN)
        assert answer.status_code == 400 and "unknown rollout action" in \
            answer.json()["error"]["message"]
        answer = httpx.get(gw.url + "/admin/rollouts/no-such-model", headers=ADMIN)
        assert answer.status_code == 404 and answer.json()["error"]["message"]
        assert httpx.get(gw.url + "/admin/rollouts").status_code == 401  # the admin gate
    assert "rollout.transition model=chat-model version=v2 from=progressing to=promoted" \
        in gw.output()


def test_a_canary_with_twice_the_ttft_is_rolled_back(
        baseline: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the gateway's own queueing on a loaded box adds the same tail to both sides, which
    # shrinks a 2x stall to less at the p90: a ratio of 1.2 is the bound here
    with SimServer("interactive", speedup=20, jitter=0.0,
                   stall_ms=2 * BASE_STALL_MS) as canary, \
            _gateway(tmp_path, baseline, canary, monkeypatch,
                     ttft_p90={"max_ratio": 1.2}) as gw, Traffic([gw.url]):
        view = wait_phase(gw.url, {"promoted", "rolled_back"})
        reasons = [e["reason"] for e in view["history"]]
        # usually in its first window; on a loaded box the gateway's own queueing can hide
        # a 50 ms difference among 30 requests, and a later, larger step then shows it (the
        # first-window property at realistic counts: test_decisions.py)
        assert reasons[0] == "started" and reasons[-1] == "gate:ttft_p90", (reasons, view)
        assert "promoted" not in reasons
        assert view["share"] == 0.0
        gates = {g["name"]: g for g in view["gates"]}
        assert set(gates) == {"error_rate", "ttft_p90", "tpot_p90"}
        # operators from the command line: list, status, and a refused action (exit 1)
        env = {"GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN, "PATH": "/usr/bin:/bin"}
        cli = [sys.executable, "-m", "gateway", "rollout"]
        listed = subprocess.run([*cli, "list", "--url", gw.url], capture_output=True,
                                text=True, cwd=REPO, env=env, check=True)
        assert "chat-model" in listed.stdout and "rolled_back" in listed.stdout
        status = subprocess.run([*cli, "status", "chat-model", "--url", gw.url],
                                capture_output=True, text=True, cwd=REPO, env=env,
                                check=True)
        assert "gate ttft_p90" in status.stdout
        refused = subprocess.run([*cli, "resume", "chat-model", "--url", gw.url],
                                 capture_output=True, text=True, cwd=REPO, env=env)
        assert refused.returncode == 1 and "cannot resume" in refused.stderr
        promoted = subprocess.run([*cli, "promote", "chat-model", "--url", gw.url, "--json"],
                                  capture_output=True, text=True, cwd=REPO, env=env,
                                  check=True)
        assert '"phase": "promoted"' in promoted.stdout


def test_a_reload_that_changes_the_definition_restarts_the_rollout(
        baseline: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    with SimServer("interactive", speedup=20, jitter=0.0, stall_ms=BASE_STALL_MS) as canary, \
            _gateway(tmp_path, baseline, canary, monkeypatch) as gw:
        wait_phase(gw.url, {"progressing"})
        data = yaml.safe_load(gw.config.read_text())
        answer = httpx.post(gw.url + "/admin/reload", headers=ADMIN, timeout=30)
        assert answer.status_code == 200  # the same definition: the rollout goes on
        assert [e["reason"] for e in rollout(gw.url)["history"]] == ["started"]
        data["models"][0]["versions"][1]["progressive"]["steps"] = [5, 100]
        gw.config.write_text(yaml.safe_dump(data))
        answer = httpx.post(gw.url + "/admin/reload", headers=ADMIN, timeout=30)
        assert answer.status_code == 200
        view = rollout(gw.url)
        reasons = [e["reason"] for e in view["history"]]
        assert reasons[:2] == ["started", "definition_changed"], reasons
        assert view["steps"] == [5.0, 100.0]
    assert "definition changed by a reload; the rollout restarts at pending" in gw.output()


def test_a_shadow_stage_promotes_an_agreeing_shadow_to_canary(
        baseline: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps [0, 100]: the canary first only answers mirrored requests (no client reaches its
    pool), is judged on their agreement and TTFT, then takes live traffic."""
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)
    with SimServer("interactive", speedup=20, jitter=0.0, stall_ms=BASE_STALL_MS) as canary:
        data = progressive_policy(policy({"stable": [baseline.url], "canary": [canary.url]}),
                                  steps=[0, 100], hold="1s", min_requests=30,
                                  shadow_agreement={"min": 0.8})
        data["models"][0]["shadow"] = {"pool": "canary", "share": 1.0, "version": "v2"}
        with GatewayProcess(tmp_path, data) as gw, Traffic([gw.url]) as t:
            stage_samples = 0
            deadline = time.monotonic() + 90
            while True:  # while the stage lasts, no client request reaches the canary's pool
                live_on_canary = t.by_pool["canary"]  # read before the state: taken in stage
                view = rollout(gw.url)
                if view["phase"] != "progressing" and view["phase"] != "pending":
                    break
                if view["phase"] == "progressing":
                    assert view["share"] == 0.0
                    assert live_on_canary == 0
                    stage_samples += 1
                assert time.monotonic() < deadline, view
                time.sleep(0.1)
            reasons = [e["reason"] for e in view["history"]]
            assert view["phase"] == "promoted", (reasons, view["gates"])
            assert reasons == ["started", "promoted"], reasons
            assert stage_samples > 0
            shadowed = httpx.get(gw.url + "/admin/shadow/chat-model", headers=ADMIN).json()
            assert shadowed["versions"]["v2"]["agree"] >= 30
            deadline = time.monotonic() + 30
            while t.by_pool["canary"] == 0:  # promoted: live traffic on the canary now
                assert time.monotonic() < deadline, "no live request reached the canary"
                time.sleep(0.1)
