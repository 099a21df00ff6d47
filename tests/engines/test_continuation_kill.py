"""The continuation kill bench (``loadtest/bench/continuation_kill.py``) runs: three streams
through a gateway in front of two real llama-servers, the serving engine SIGKILLed in each
(after 5, 20 and 40 of 160 tokens: early enough to fall mid-stream even when the client reads
tens of tokens behind the engine on a busy box, see docs/benchmarks/continuation-kill.md), each
ending whole, on the other engine, with one usage record that holds the engines' figures (the
requests ask for ``timings_per_token``: the gateway reads the engine's count of the tokens
sent), the client given ``max_tokens`` engine tokens in all, and the killed engine back in the
pool for the next. A kill that fell after the engine's last token (or whose engine was not
found in time) is run again, as the bench does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadtest.bench.continuation_kill import Bench, Options, mid_stream, summarise

pytestmark = [pytest.mark.engine, pytest.mark.process]


def _kill(bench: Bench, i: int, kill_after: int) -> dict[str, Any]:
    """Run ``i`` with a kill that falls mid-stream (three tries)."""
    for attempt in range(3):
        run = bench.run(10 * i + attempt, kill_after)
        if mid_stream(run):
            return run
    pytest.fail(f"no kill fell mid-stream in 3 tries: {run['judged']}")


def test_three_kills_end_whole_with_one_record_each(
        llama_server_bin: Path, engine_model: Path, tmp_path: Path) -> None:
    opts = Options(runs=3, max_tokens=160, workdir=tmp_path, model=engine_model,
                   binary=llama_server_bin)
    with Bench(opts) as bench:
        runs = [_kill(bench, i, kill_after) for i, kill_after in enumerate((5, 20, 40))]
        restarts = sum(bench.restarts.values())
    judged = [run["judged"] for run in runs]
    for run, j in zip(runs, judged, strict=True):
        assert run["killed"] in ("a", "b"), run["killed"]
        assert j["whole"] and not j["error_event"], j
        assert j["continued"] and j["seam_ok"], j
        assert j["records"] == 1 and j["record_ok"] and j["cost_ok"], j
        assert j["one_id"] and j["one_role"] and j["one_finish"], j
        # the engines' counts: the tokens received, the first engine's prompt, not estimated
        assert j["received_tokens"] == 160 and j["within_limit"], j
        assert j["output_is_received"] and j["prompt_is_engine"], j
        assert not j["record_estimated"], j
    assert restarts >= 3
    summary = summarise(judged)
    assert summary["whole"] == 3 and summary["records"] == {"1": 3, "0": 0, "2+": 0}
