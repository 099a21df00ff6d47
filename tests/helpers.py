"""Test helpers: waiting for servers, a real ``gateway serve`` process and simulator processes,
the usage records a gateway exports (free ports: ``tests/ports.py``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.sim.server import spawn
from tests.ports import free_port, free_ports

TEST_KEY = "sk-gw-test-0123456789abcdef0123456789abcdef0123"
TEST_KEY_SHA = hashlib.sha256(TEST_KEY.encode()).hexdigest()
REPO = Path(__file__).resolve().parent.parent


def wait_http(
    url: str, timeout: float = 20.0, status: int = 200, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            r = httpx.get(url, timeout=1.0)
            if r.status_code == status:
                return
            last = r.status_code
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} not up: {last!r}")


def usage_records(url: str, admin_token: str) -> list[dict[str, Any]]:
    """The usage records of the last hour (and the next minute) from the admin export of the
    gateway at ``url``, in the export's order."""
    now = int(time.time() * 1000)
    r = httpx.get(url + "/admin/usage/export", headers={"Authorization": f"Bearer {admin_token}"},
                  params={"start_ms": now - 3_600_000, "end_ms": now + 60_000}, timeout=30)
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


def wait_usage_records(url: str, admin_token: str, enough: Callable[[list[dict[str, Any]]], bool],
                       within: float, every: float = 0.1) -> list[dict[str, Any]]:
    """``usage_records``, asked again until ``enough(records)`` (a record may reach the ledger
    just after its answer ends) or for ``within`` seconds; then the last answer."""
    deadline = time.monotonic() + within
    while True:
        records = usage_records(url, admin_token)
        if enough(records) or time.monotonic() > deadline:
            return records
        time.sleep(every)


def policy(backends: dict[str, list[str]], **server: Any) -> dict[str, Any]:
    """A policy with one pool per entry (pool name -> backend URLs) and a model per pool."""
    pools = [
        {
            "name": name,
            "class": "batch" if name.startswith("batch") else "interactive",
            "backends": [
                {"name": f"{name}-{i}", "url": url, "max_in_flight": 512}
                for i, url in enumerate(urls)
            ],
        }
        for name, urls in backends.items()
    ]
    models = [
        {"name": f"{name}-model", "pool": name, "backend_model": "sim-model"} for name in backends
    ]
    return {
        "server": {"drain_timeout": 10, **server},
        "auth": {"keys": [{"id": "test", "sha256": TEST_KEY_SHA}]},
        "pools": pools,
        "models": models,
    }


class GatewayProcess:
    """``gateway serve`` in a child process, on a free port, with a policy written to a file."""

    def __init__(self, tmp: Path, policy_data: dict[str, Any], workers: int = 1) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / f"policy-{self.port}.yaml"
        store = policy_data.setdefault("store", {})
        store.setdefault("spool_dir", str(tmp / f"spool-{self.port}"))
        store.setdefault("data_dir", str(tmp / f"data-{self.port}"))
        self.config.write_text(yaml.safe_dump(policy_data))
        self.workers = workers
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / f"gateway-{self.port}.log"

    def start(self) -> GatewayProcess:
        self._log_fh = open(self.log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--config",
                str(self.config),
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
            ],
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            wait_http(self.url + "/healthz", proc=self.proc)
        except Exception as exc:
            self._log_fh.close()
            raise RuntimeError(f"{exc}\n--- gateway output ---\n{self.output()}") from exc
        return self

    def sigterm(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_fh.close()
        return self.proc.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SimProcess:
    """``python -m gateway.sim`` in a child process on a free port (no GIL shared with the test or
    the other simulators); ``url``, ``proc``. ``with SimProcess("batch", "--jitter", "0") as
    sim:`` starts it and waits for its ``/health``; the exit kills it (SIGKILL)."""

    def __init__(self, profile: str = "interactive", *args: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.profile, self.args = profile, args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SimProcess:
        """Starts the process; does not wait (``wait_ready``)."""
        self.proc = spawn(self.port, self.profile, *self.args)
        return self

    def wait_ready(self) -> SimProcess:
        wait_http(self.url + "/health", proc=self.proc)
        return self

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> SimProcess:
        try:
            return self.start().wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def sim_processes(n: int, profile: str = "interactive", *args: str) -> Iterator[list[SimProcess]]:
    """``n`` simulator processes on distinct free ports, started together, each up (``/health``)
    before the block runs; all killed after it."""
    sims = [SimProcess(profile, *args, port=port) for port in free_ports(n)]
    try:
        for sim in sims:
            sim.start()
        for sim in sims:
            sim.wait_ready()
        yield sims
    finally:
        for sim in sims:
            sim.stop()


@contextlib.contextmanager
def tmpfs(parent: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``1m``) mounted under ``parent``, unmounted after; the test is
    skipped where it cannot be mounted (not root, or a kernel that refuses)."""
    mount = parent / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
