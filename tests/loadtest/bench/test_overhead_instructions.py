"""The instructions tool's own parts: its paths, a callgrind dump's total, the report."""

from __future__ import annotations

import json

import pytest

from loadtest.bench.overhead import payloads
from loadtest.bench.overhead.instructions import _TOTAL, PATHS, parse_args, report


def test_paths_send_each_api_and_store() -> None:
    bodies = {path: json.loads(payloads.request_body(stream=False, api=api, store=store))
              for path, (api, store) in PATHS.items()}
    assert bodies["responses"]["store"] is False
    assert "store" not in bodies["responses-stored"]  # the default, store: true
    assert "messages" in bodies["chat"] and "input" in bodies["responses"]


def test_total_of_a_dump() -> None:
    dump = b"version: 1\ncmd: python\nevents: Ir\nfn=(1) main\n12 34\nsummary: 123456789\n"
    match = _TOTAL.search(dump)
    assert match is not None and int(match.group(1)) == 123456789
    assert _TOTAL.search(b"events: Ir\ntotals: 42\n") is not None


def test_report_gives_ratios_to_chat() -> None:
    text = report({"chat": [1_000_000.0, 2_000_000.0], "responses": [1_100_000.0, 2_400_000.0]})
    assert text.splitlines() == ["chat: 1.000M, 2.000M",
                                 "responses: 1.100M, 2.400M (/ chat: 1.100, 1.200)"]


def test_arguments_are_checked() -> None:
    assert parse_args([]).paths == ["chat", "responses"]
    with pytest.raises(SystemExit):
        parse_args(["nonsense"])
