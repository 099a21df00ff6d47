"""``gateway serve`` as a process: startup failures end it at once, with one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, policy
from tests.redis_servers import RedisProc

pytestmark = pytest.mark.process

PATIENCE = 60.0  # seconds: the process must exit well within this, even on a loaded box


def test_port_in_use_with_redis_exits_at_once(redis_proc: RedisProc, tmp_path: Path) -> None:
    """With ``GATEWAY_REDIS_URL`` set, a port already in use logged "address already in use"
    and then hung, deaf to SIGTERM and SIGINT (the app had started before uvicorn tried to bind,
    and its shutdown did not return). Now the port is bound first: exit 1, one line, nothing
    started."""
    config = tmp_path / "policy.yaml"
    data = policy({"chat": ["http://127.0.0.1:9"]})
    data["store"] = {"spool_dir": str(tmp_path / "spool"), "data_dir": str(tmp_path / "data")}
    config.write_text(yaml.safe_dump(data))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config),
             "--port", str(port)],
            cwd=REPO, capture_output=True, timeout=PATIENCE,
            env={**os.environ, "GATEWAY_REDIS_URL": redis_proc.url},
        )
    assert proc.returncode != 0
    lines = proc.stderr.decode().strip().splitlines()
    assert lines == [f"gateway: cannot listen on 127.0.0.1:{port}: address already in use"]
    assert proc.stdout == b""
