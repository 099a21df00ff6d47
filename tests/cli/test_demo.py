"""`gateway demo` starts two simulated pools and the gateway, prints a working key, and stops."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers import REPO, wait_http
from tests.ports import free_port

pytestmark = pytest.mark.process


def _start_demo(home: Path) -> tuple[subprocess.Popen[str], int, str, str]:
    """A demo process keeping its ledger in ``home``: (process, port, key, banner)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, text=True,
        env={**os.environ, "GATEWAY_DEMO_DIR": str(home)},
    )
    wait_http(f"http://127.0.0.1:{port}/readyz", timeout=30, proc=proc)  # type: ignore[arg-type]
    assert proc.stdout is not None
    banner = ""
    deadline = time.monotonic() + 10
    while "Ctrl-C" not in banner and time.monotonic() < deadline:
        banner += proc.stdout.readline()
    key = re.search(r"sk-gw-[A-Za-z0-9_-]{40,}", banner)
    assert key, banner
    return proc, port, key.group(0), banner


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 0


def test_demo_serves_and_stops(tmp_path: Path) -> None:
    proc, port, key, banner = _start_demo(tmp_path)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
        for model, cls in (("demo-chat", "interactive"), ("demo-bulk", "batch")):
            raw = client.chat.completions.with_raw_response.create(
                model=model, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
            assert raw.headers["x-gateway-class"] == cls
            reply = raw.parse()
            assert reply.usage is not None and reply.usage.completion_tokens == 5
        # the demo's chat model has a batch pool: the class header moves it there
        raw = client.chat.completions.with_raw_response.create(
            model="demo-chat", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Request-Class": "batch"})
        assert raw.headers["x-gateway-class"] == "batch"
        assert raw.headers["x-gateway-pool"] == "batch"
        assert len(client.embeddings.create(model="demo-embed", input="x").data) == 1
        assert f"curl -sN http://127.0.0.1:{port}/v1/chat/completions" in banner
        assert "from openai import OpenAI" in banner
        assert str(tmp_path / "ledger.db") in banner
    finally:
        _stop(proc)


def _requests_so_far(port: int, key: str) -> int:
    r = httpx.get(f"http://127.0.0.1:{port}/v1/usage",
                  headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return sum(row["requests"] for row in r.json()["data"])


def test_demo_keeps_its_usage_across_a_restart(tmp_path: Path) -> None:
    """The embedded ledger is a SQLite file: a second run still shows the first run's usage
    (to the demo tenant, whatever key the run prints)."""
    proc, port, key, _ = _start_demo(tmp_path)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
        for _ in range(3):
            client.chat.completions.create(model="demo-chat", max_tokens=2,
                                           messages=[{"role": "user", "content": "hi"}])
        assert _requests_so_far(port, key) == 3
    finally:
        _stop(proc)
    proc, port, key, _ = _start_demo(tmp_path)
    try:
        assert _requests_so_far(port, key) == 3
    finally:
        _stop(proc)


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc, Linux)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _port_of(pid: int) -> int:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(args[args.index(b"--port") + 1])


def _port_free(port: int) -> bool:
    """A server could listen on ``port`` again (SO_REUSEADDR, as servers bind: connections of
    the dead engine still in TIME_WAIT do not hold it, a live listener does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_demo_children_never_outlive_it(sig: int, tmp_path: Path) -> None:
    """However the demo is stopped (a process manager's SIGTERM, Ctrl-C, a closed terminal's
    SIGHUP, or SIGKILL), its simulated engines stop too and their ports are free again."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
        env={**os.environ, "GATEWAY_DEMO_DIR": str(tmp_path)},
    )
    sims: list[int] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", timeout=60, proc=proc)
        sims = _children(proc.pid)
        assert len(sims) == 2, sims
        ports = [_port_of(p) for p in sims]
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 0)
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in sims) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in sims if _alive(p)] == []
        deadline = time.monotonic() + 30
        while not all(_port_free(p) for p in ports) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in ports if not _port_free(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in sims:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
