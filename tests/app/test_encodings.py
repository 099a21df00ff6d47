"""The gateway loads its models' tokenizers when it starts, not on the first request.

Loading an encoding is ~0.4 s of CPU; on the first request that needs it, it would stall the
event loop with every other request behind it (the noisy-neighbour benchmark saw a fresh
gateway's first requests wait 0.4-0.8 s and reach the engines in one burst).
"""

from __future__ import annotations

from pathlib import Path

from gateway.app.state import Gateway
from gateway.config import parse_policy
from tests.helpers import policy


def _policy(tmp: Path, encodings: list[str]) -> dict[str, object]:
    data = policy({"chat": ["http://127.0.0.1:9"]})
    model = data["models"][0]
    data["models"] = [{**model, "name": f"m-{e}", "encoding": e} for e in encodings]
    data["store"] = {"spool_dir": str(tmp / "spool"), "data_dir": str(tmp / "data")}
    return data


async def test_start_and_reload_load_the_models_encodings(tmp_path: Path) -> None:
    gw = Gateway(parse_policy(_policy(tmp_path, ["cl100k_base"])))
    assert gw.counters == {}  # nothing is loaded by building the state
    await gw.start()
    try:
        assert set(gw.counters) == {"cl100k_base"}  # before any request
        await gw.reload(parse_policy(_policy(tmp_path, ["cl100k_base", "o200k_base"])))
        assert set(gw.counters) == {"cl100k_base", "o200k_base"}
    finally:
        await gw.close()
