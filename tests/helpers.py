"""Test helpers: free ports, waiting for servers, and a real ``gateway serve`` process."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

TEST_KEY = "sk-gw-test-0123456789abcdef0123456789abcdef0123"
TEST_KEY_SHA = hashlib.sha256(TEST_KEY.encode()).hexdigest()
REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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
