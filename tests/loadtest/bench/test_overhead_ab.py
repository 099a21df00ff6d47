"""The A/B tool's own parts: set-up environments and per-process CPU time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.bench.overhead.ab import _cpu_seconds, _env, _kernel_counts, _tree, parse_args


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


def test_kernel_counts_grow_with_system_calls_and_sleeps() -> None:
    before = _kernel_counts(os.getpid())
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        for _ in range(200):
            os.write(fd, b"x")
    finally:
        os.close(fd)
    for _ in range(20):
        time.sleep(0.001)  # each sleep blocks: a voluntary switch
    after = _kernel_counts(os.getpid())
    assert after["syscalls"] - before["syscalls"] >= 200
    assert after["voluntary"] - before["voluntary"] >= 20
    assert after["involuntary"] >= before["involuntary"]


@pytest.mark.process
def test_cpu_seconds_count_the_workers_a_process_forked() -> None:
    """A gateway with ``--workers 2`` does its work in child processes: their CPU counts."""
    burn = ("import time\nd = time.process_time() + 0.3\n"
            "while time.process_time() < d: pass\ntime.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               f"{burn!r}])"])
    try:
        deadline = time.monotonic() + 20
        while _cpu_seconds(parent.pid) < 0.25:
            assert time.monotonic() < deadline, "the child's CPU was not counted"
            time.sleep(0.05)
    finally:
        for pid in reversed(_tree(parent.pid)):
            os.kill(pid, 9)
        parent.wait()


def test_arguments_are_checked() -> None:
    assert parse_args(["--pairs", "3"]).pairs == 3
    assert parse_args([]).b_proxy_cpu is None
    assert parse_args(["--b-proxy-cpu", "0,1"]).b_proxy_cpu == "0,1"
    with pytest.raises(SystemExit):
        parse_args(["--pairs", "0"])


@pytest.mark.process
@pytest.mark.parametrize("shim", [True, False])
def test_output_reaches_the_log_through_the_shim_or_directly(tmp_path: Path, shim: bool) -> None:
    """With the log shim the process writes to a pipe (as under a container runtime) and
    every line still lands in the log file; without it, straight into the file."""
    from loadtest.bench.overhead.procs import ProcessSet

    log = tmp_path / "out.log"
    script = ("import os, sys, time\n"
              "print(os.readlink('/proc/self/fd/1'), flush=True)\n"
              "for i in range(20000): print('line', i)\n")
    procs = ProcessSet()
    managed = procs.start("child", [sys.executable, "-c", script], log, log_shim=shim)
    assert managed.proc.wait(30) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the shim ends at EOF
        text = log.read_text()
        if text.endswith("line 19999\n"):
            break
        time.sleep(0.05)
    first, *rest = text.splitlines()
    assert first.startswith("pipe:") if shim else first == str(log)
    assert rest == [f"line {i}" for i in range(20000)]
