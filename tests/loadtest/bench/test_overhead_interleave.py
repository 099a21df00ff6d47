"""The interleaving bench runs both set-ups end to end and reports a row per batch size."""

from __future__ import annotations

import re

import pytest

from loadtest.bench.overhead.interleave import main, parse_args


def test_both_set_ups_run_and_report_each_batch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--batches", "1,3", "--seconds", "0.05", "--repeat", "1"]) == 0
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| \*\*([\d.]+)\*\*",
                      capsys.readouterr().out, re.MULTILINE)
    assert [r[0] for r in rows] == ["1", "3"]
    for _, alone, pair, ratio in rows:
        assert float(alone) > 0 and float(pair) > 0
        assert float(ratio) == pytest.approx(float(pair) / float(alone), rel=0.05)


def test_arguments_are_checked() -> None:
    for bad in (["--batches", "x"], ["--batches", "0"], ["--repeat", "0"], ["--cpu", "4096"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
