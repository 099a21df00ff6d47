"""The probe: pass, too slow, and a failing backend; exit status and PASS/FAIL lines."""

from __future__ import annotations

import pytest

from gateway.sim.server import SimServer
from loadtest.cli import main


def test_probe_passes(sim: SimServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["probe", "--url", sim.url + "/v1", "--model", "m", "--max-tokens", "32"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("PASS") == 6 and "FAIL" not in out
    assert "32 of 32 (from usage)" in out and "TTFT" in out


def test_probe_too_slow_fails(sim: SimServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["probe", "--url", sim.url, "--model", "m", "--max-tokens", "16", "--min-tps", "1000000"]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL speed >= 1e+06 tok/s" in out and "PASS output tokens as asked" in out


def test_probe_against_failing_backend(
    failing_sim: SimServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["probe", "--url", failing_sim.url, "--model", "m", "--max-tokens", "8"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL request succeeded: http_500" in out and "FAIL text non-empty" in out


def test_probe_model_from_models_list(sim: SimServer, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --model the first model /v1/models lists is used."""
    assert main(["probe", "--url", sim.url, "--max-tokens", "8"]) == 0
    assert "sim-model" in capsys.readouterr().out
