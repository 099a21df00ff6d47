"""The A/B tool's own parts: set-up environments and per-process CPU time."""

from __future__ import annotations

import os
import time

import pytest

from loadtest.overhead.ab import _cpu_seconds, _env, parse_args


def test_env_specs_parse_and_reject_garbage() -> None:
    assert _env("A=1 B='two words' C=") == {"A": "1", "B": "two words", "C": ""}
    assert _env("") == {}
    with pytest.raises(SystemExit):
        _env("NOEQUALS")


def test_cpu_seconds_grow_with_work() -> None:
    before = _cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert _cpu_seconds(os.getpid()) - before >= 0.1


def test_arguments_are_checked() -> None:
    assert parse_args(["--pairs", "3"]).pairs == 3
    with pytest.raises(SystemExit):
        parse_args(["--pairs", "0"])
