"""``gateway demo``: two simulated pools and the gateway in front of them, on embedded defaults.

No Redis and no policy file: the simulators run as child processes (so they use the other core)
and the gateway runs in this process on a policy built here, with a fresh demo API key.

The children never outlive the demo. SIGINT, SIGTERM and SIGHUP stop the gateway and then the
simulators (uvicorn re-raises the signal it caught once it has shut down, which with the default
SIGTERM disposition killed the demo before it could stop them: orphans holding their ports).
A demo killed outright (SIGKILL, a crash) takes them along through the kernel: each child asks
for SIGTERM when its parent dies (``PR_SET_DEATHSIG``, Linux), and runs in a process group of
its own that the demo signals as a whole.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from gateway.app.factory import create_app
from gateway.auth import new_api_key
from gateway.config import parse_policy, validate
from gateway.http.uvicorn import uvicorn_options

if TYPE_CHECKING:
    from types import FrameType

__all__ = ["demo_policy", "run_demo"]

#: the signals that stop the demo cleanly (SIGKILL is covered by the children's death signal)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_DEATHSIG = 1  # from <linux/prctl.h>


class _Stop(Exception):
    """A stop signal arrived before the gateway was serving."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def demo_policy(interactive_url: str, batch_url: str, key_sha256: str) -> dict[str, Any]:
    """The demo's policy (the same shape as ``policies/demo.yaml``)."""
    return {
        "server": {"drain_timeout": 10},
        "auth": {"required": True, "keys": [{"id": "demo", "sha256": key_sha256,
                                              "tenant": "demo", "allow_class_header": True}]},
        "plans": [{
            "name": "demo",
            "limits": {"rpm": 600, "tpm": 2_000_000, "concurrency": 64,
                       "tokens_per_day": 50_000_000, "tokens_per_month": 1_000_000_000,
                       "cost_per_day": "25", "cost_per_month": "500"},
            "models": {"demo-bulk": {"concurrency": 48}},
        }],
        "tenants": [{"name": "demo", "plan": "demo"}],
        "routing": {"rules": [{"class": "batch", "models": ["demo-bulk"]}]},
        "pools": [
            {
                "name": "interactive",
                "class": "interactive",
                "backends": [
                    {"name": "sim-interactive-1", "url": interactive_url, "max_in_flight": 256}
                ],
            },
            {
                "name": "batch",
                "class": "batch",
                "backends": [{"name": "sim-batch-1", "url": batch_url, "max_in_flight": 2048}],
            },
        ],
        "models": [
            {"name": "demo-chat", "pool": "interactive", "pools": {"batch": "batch"},
             "backend_model": "sim-model"},
            {"name": "demo-bulk", "pool": "batch", "backend_model": "sim-model"},
            {"name": "demo-embed", "pool": "interactive", "backend_model": "sim-model"},
        ],
        "prices": {
            "currency": "USD",
            "batch_factor": "0.5",
            "models": {
                "demo-chat": {"input": "0.15", "cached_input": "0.075", "output": "0.60"},
                "demo-bulk": {"input": "0.15", "cached_input": "0.075", "output": "0.60"},
                "demo-embed": {"input": "0.02", "output": "0"},
            },
        },
    }


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux), and exit at once if it
    already has (the death signal only covers deaths after it is set)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_DEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _start_sim(profile: str, port: int) -> subprocess.Popen[bytes]:
    parent = os.getpid()
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway",
            "sim",
            "--profile",
            profile,
            "--port",
            str(port),
            "--model",
            "sim-model",
            "--natural-length",  # answers end by themselves, as an agent expects
        ],
        preexec_fn=lambda: _die_with_parent(parent),  # safe: no threads run yet
        process_group=0,  # its own group: stopped as a whole, not by the terminal's Ctrl-C
    )


def _stop_children(sims: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each child's group, wait, SIGKILL what is left."""
    for proc in sims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in sims:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class _Stopper:
    """The demo's handler of SIGINT, SIGTERM and SIGHUP: before the gateway serves, interrupt
    start-up (the ``finally`` stops the children); once it serves, ask uvicorn to shut down.
    Installed again after uvicorn's own run restores it, so a signal uvicorn re-raises at the
    end lands here and does nothing more."""

    def __init__(self) -> None:
        self.server: uvicorn.Server | None = None

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.server is None:
            raise _Stop
        self.server.should_exit = True


def _wait_healthy(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"simulator at {url} did not start")
        time.sleep(0.1)


#: where the demo keeps its usage ledger (SQLite) across runs; GATEWAY_DEMO_DIR overrides it
DEMO_DIR_ENV = "GATEWAY_DEMO_DIR"
DEFAULT_DEMO_DIR = "gateway-data/demo"


def demo_dir() -> Path:
    return Path(os.environ.get(DEMO_DIR_ENV) or DEFAULT_DEMO_DIR).resolve()


def _banner(url: str, key: str, data: Path) -> str:
    return f"""
LLM gateway demo is running at {url}

  API key (demo, new each run): {key}
  models: demo-chat (interactive pool), demo-bulk (batch pool), demo-embed
  usage ledger (kept across runs): {data / "ledger.db"}
    curl -s {url}/v1/usage -H "Authorization: Bearer {key}"

curl:
  curl -sN {url}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{{"model": "demo-chat", "stream": true, "max_tokens": 16,
         "messages": [{{"role": "user", "content": "Say hello"}}]}}'

Python (pip install openai):
  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="{key}")
  reply = client.chat.completions.create(
      model="demo-chat", max_tokens=16,
      messages=[{{"role": "user", "content": "Say hello"}}])
  print(reply.choices[0].message.content, reply.usage)

Ctrl-C (or SIGTERM, SIGHUP) stops the demo and its simulators.
"""


def run_demo(host: str, port: int) -> int:
    """Run until Ctrl-C, SIGTERM or SIGHUP; returns the exit status."""
    sims: list[subprocess.Popen[bytes]] = []
    stopper = _Stopper()
    stopper.install()
    try:
        ports = {"interactive": free_port(), "batch": free_port()}
        for profile, sim_port in ports.items():
            sims.append(_start_sim(profile, sim_port))
        urls = {p: f"http://127.0.0.1:{sim_port}" for p, sim_port in ports.items()}
        for url in urls.values():
            _wait_healthy(url)
        key = new_api_key()
        data = demo_policy(
            urls["interactive"], urls["batch"], hashlib.sha256(key.encode()).hexdigest()
        )
        # the demo's usage records outlive the run: SQLite in the demo's data directory
        home = demo_dir()
        data["store"] = {"data_dir": str(home), "spool_dir": str(home / "spool")}
        policy = parse_policy(data, "<demo>")
        validate(policy, "<demo>")
        config = uvicorn.Config(
            create_app(policy),
            host=host,
            port=port,
            **uvicorn_options(policy.server.drain_timeout, policy.server.http_protocol,  # type: ignore[arg-type]
                              policy.server.limits),
        )
        server = stopper.server = uvicorn.Server(config)
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        print(_banner(f"http://{shown}:{port}", key, home), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
        return 0
    except _Stop:
        return 0
    finally:
        stopper.install()  # a second signal while the children stop must not cut it short
        _stop_children(sims)
