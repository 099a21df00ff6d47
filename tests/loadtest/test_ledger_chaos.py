"""The ledger chaos script: its counting (pure functions), and one real scenario, short.

``loadtest.bench.ledger_chaos`` kills and starves the ledger under load and counts answered,
recorded, lost and doubled records; here its sums are checked on made-up logs, and the
``sqlite-kill9`` scenario runs for a few seconds against a real ``gateway serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
from pathlib import Path

import httpx
import pytest

from loadtest.bench.ledger_chaos import (
    COLUMNS,
    SCENARIOS,
    ClientLog,
    Options,
    doubled_ids,
    error_code,
    errors_text,
    exit_status,
    format_table,
    parse_scenarios,
    response_kind,
    run,
    tally,
    transport_kind,
)


def test_response_kind_answers_only_whole_200s() -> None:
    assert response_kind(200, False, b'{"id":"x"}') is None
    assert response_kind(200, True, b"data: {}\n\ndata: [DONE]\n\n") is None
    cut = b'data: {}\n\ndata: {"error":{"code":"usage_not_recorded"}}\n\n'
    assert response_kind(200, True, cut) == "stream without [DONE] (usage_not_recorded)"
    assert response_kind(200, True, b"data: {}\n\n") == "stream without [DONE] (no error event)"
    body = b'{"error": {"message": "m", "code": "usage_not_recorded"}}'
    assert response_kind(503, False, body) == "503 usage_not_recorded"
    assert response_kind(502, False, b"bad gateway") == "502"
    assert error_code(b"nothing") is None


def test_transport_kind() -> None:
    request = httpx.Request("POST", "http://x/")
    assert transport_kind(httpx.ConnectError("no", request=request), False) == "connect"
    assert transport_kind(httpx.ReadTimeout("slow", request=request), True) == "timeout"
    assert transport_kind(httpx.RemoteProtocolError("eof"), True) == "cut mid-response"
    assert transport_kind(httpx.ReadError("reset"), False) == "cut before headers"


def _log() -> ClientLog:
    log = ClientLog()
    for rid in ("a", "b", "c", "d"):
        log.note(rid, None)
    log.note("e", "503 usage_not_recorded")
    log.note("f", "cut mid-response")
    log.note(None, "connect")
    log.note(None, "connect")
    return log


def test_client_log_keeps_answers_ids_and_errors() -> None:
    log = _log()
    assert log.requests == 8
    assert log.answered == ["a", "b", "c", "d"]
    assert set(log.seen) == set("abcdef") and log.seen["e"] == "503 usage_not_recorded"
    assert log.errors == {"503 usage_not_recorded": 1, "cut mid-response": 1, "connect": 2}
    assert errors_text(log.errors) == "connect 2, 503 usage_not_recorded 1, cut mid-response 1"
    assert errors_text({}) == "-"


def test_tally_counts_lost_doubled_interrupted_and_unfinished() -> None:
    rows = [("a", "completed"), ("b", "completed"), ("b", "completed"), ("e", "failed"),
            ("f", "cancelled"), ("g", "interrupted"), ("h", "completed"), ("d", "cancelled")]
    t = tally(_log(), rows, {"h": 2, "x": 1})
    assert t.answered == 4
    assert t.recorded == 8  # rows, a doubled one twice
    assert (t.lost, t.lost_ids) == (1, ["c"])
    # "b" repeats among the rows, "h" is reported twice by the database's GROUP BY
    assert (t.doubled, t.doubled_ids) == (2, {"b": 2, "h": 2})
    assert t.interrupted == 1
    assert t.unfinished == 2  # e (a 503) and f (cut): "d" was answered
    assert t.unknown == 2  # g and h: no client saw their ids
    assert (t.answered_not_completed, t.not_completed) == (1, {"d": "cancelled"})
    assert t.unanswered_outcomes == {"failed": 1, "cancelled": 1}
    assert t.pending == 0


def test_a_record_left_in_a_spool_is_pending_not_lost() -> None:
    t = tally(_log(), [("a", "completed"), ("b", "completed")], {}, pending=["c", "d", "a"])
    assert (t.lost, t.pending, t.pending_answered) == (0, 2, 2)
    assert t.recorded == 2


def test_nothing_lost_nothing_doubled() -> None:
    rows = [(rid, "completed") for rid in "abcd"]
    t = tally(_log(), rows, {})
    assert (t.lost, t.doubled, t.interrupted, t.unfinished, t.unknown) == (0, 0, 0, 0, 0)


def test_doubled_ids_asks_the_database(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE usage_records (day TEXT, request_id TEXT)")
        db.executemany("INSERT INTO usage_records VALUES (?, ?)",
                       [("d1", "a"), ("d2", "a"), ("d1", "b"), ("d1", "c"), ("d2", "c"),
                        ("d3", "c")])
    assert asyncio.run(doubled_ids(f"sqlite:///{path}")) == {"a": 2, "c": 3}


def test_table_and_exit_status() -> None:
    ok = {"scenario": "pg-freeze", "store": "postgresql", "load_seconds": 20.4, "answered": 10,
          "recorded": 12, "pending": 0, "lost": 0, "doubled": 0, "interrupted": 0,
          "unfinished": 2, "errors": {"503 usage_not_recorded": 2}}
    skipped = {"scenario": "disk-full", "store": "", "skipped": "cannot mount a tmpfs"}
    text = format_table([ok, skipped])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["scenario", "store", "load"]
    assert len(lines) == 4 and all(c.split()[0] in lines[0] for c in COLUMNS)
    assert lines[2].split()[:11] == ["pg-freeze", "postgresql", "20", "10", "12", "0", "0", "0",
                                     "0", "2", "503"]
    assert "skipped: cannot mount a tmpfs" in lines[3]
    assert exit_status([ok, skipped]) == 0
    assert exit_status([ok, ok | {"lost": 1}]) == 1
    assert exit_status([ok | {"doubled": 3}]) == 1
    assert exit_status([ok, {"scenario": "x", "failed": "boom"}]) == 2


def test_parse_scenarios() -> None:
    assert parse_scenarios("all") == list(SCENARIOS)
    assert parse_scenarios("pg-stop, sqlite-kill9") == ["pg-stop", "sqlite-kill9"]
    with pytest.raises(argparse.ArgumentTypeError, match="nope"):
        parse_scenarios("pg-stop,nope")


@pytest.mark.process
def test_sigkill_on_sqlite_loses_and_doubles_nothing(tmp_path: Path) -> None:
    """The real thing, short: 4 clients for 3 s, the gateway SIGKILLed after 1 s and
    restarted; the restarted gateway and then the counting replay its journal."""
    [result] = run(["sqlite-kill9"], Options(duration=3.0, clients=4), tmp_path)
    assert not result.get("failed"), result.get("detail")
    assert result["gateway_exit_codes"]["a"][0] == -9  # it was killed, then stopped
    assert result["answered"] > 50, result
    assert result["lost"] == 0, (result["lost_ids"], result["lost_seen_as"])
    assert result["doubled"] == 0, result["doubled_ids"]
    assert result["recorded"] >= result["answered"]
    assert result["unreplayed_segments"] == 0 and result["pending"] == 0
    assert result["errors"].get("connect", 0) > 0  # the clients did see it go down
