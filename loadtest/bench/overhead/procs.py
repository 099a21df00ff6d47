"""Process plumbing: tool installation, CPU pinning, loopback ports, start/stop, probes.

Every process the benchmark starts is registered with a ``ProcessSet`` so that it is stopped
by its pid on normal exit, on errors and on Ctrl-C; nothing is ever killed by name.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import payloads

HOST = "127.0.0.1"


def find_tool(name: str) -> str | None:
    """Locate a binary; nginx lives in /usr/sbin, which is not on every user's PATH."""
    found = shutil.which(name)
    if found:
        return found
    for d in ("/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"):
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def ensure_tools(names: Sequence[str] = ("nginx", "wrk", "taskset")) -> dict[str, str]:
    """Return paths of the tools, installing nginx/wrk with apt-get when they are missing.

    Installing from inside the benchmark keeps it one-command on a fresh Debian box; the
    package's system service is not used (we run our own nginx instances).
    """
    missing = [n for n in names if find_tool(n) is None]
    packages = sorted({"taskset": "util-linux"}.get(n, n) for n in missing)
    if packages:
        if os.geteuid() != 0 or find_tool("apt-get") is None:
            raise SystemExit(f"missing tools {missing}; install them: apt-get install {packages}")
        print(f"[overhead] installing {' '.join(packages)} with apt-get", file=sys.stderr)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
        if subprocess.run(cmd, env=env, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, check=True)
            subprocess.run(cmd, env=env, check=True)
    paths = {n: find_tool(n) for n in names}
    still_missing = [n for n, p in paths.items() if p is None]
    if still_missing:
        raise SystemExit(f"tools still missing after install: {still_missing}")
    return {n: p for n, p in paths.items() if p is not None}


def pinned(cmd: Sequence[str], cpus: str | None) -> list[str]:
    """Prefix ``cmd`` with ``taskset -c cpus`` (no prefix when ``cpus`` is empty/None)."""
    return ["taskset", "-c", cpus, *cmd] if cpus else list(cmd)


def free_ports(n: int) -> list[int]:
    """Ask the kernel for ``n`` distinct free loopback ports (held open until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Managed:
    """A started child process plus where its output goes (for error messages)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class ProcessSet:
    """Owns the benchmark's child processes; ``stop_all`` ends them by pid, newest first."""

    procs: list[Managed] = field(default_factory=list)

    def start(self, name: str, cmd: Sequence[str], log: Path, *, log_shim: bool = False,
              shim_cpus: str | None = None) -> Managed:
        """Start ``cmd`` with its output appended to ``log``.

        With ``log_shim``, the output goes through a pipe to a ``cat`` (pinned to
        ``shim_cpus`` if given) that appends it to ``log``: what a container runtime does
        (the process writes to a pipe, a shim of the runtime writes the file), so the file
        system's cost lands on the shim's core rather than on the process under test.
        """
        with log.open("ab") as out:
            # A new session keeps Ctrl-C away from the children: we stop them in order.
            proc = subprocess.Popen(
                list(cmd), stdout=subprocess.PIPE if log_shim else out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
            if proc.stdout is not None:
                # ends by itself at EOF, when the process (the pipe's only writer) exits
                subprocess.Popen(pinned(["cat"], shim_cpus), stdin=proc.stdout, stdout=out,
                                 start_new_session=True)
                proc.stdout.close()
        managed = Managed(name, proc, log)
        self.procs.append(managed)
        return managed

    def stop(self, managed: Managed, timeout: float = 10.0) -> None:
        """SIGTERM (nginx: fast shutdown; gateway: graceful), then SIGKILL after ``timeout``."""
        proc = managed.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if managed in self.procs:
            self.procs.remove(managed)

    def stop_all(self) -> None:
        for managed in reversed(list(self.procs)):
            try:
                self.stop(managed)
            except Exception as exc:  # keep stopping the others
                print(f"[overhead] failed to stop {managed.name}: {exc}", file=sys.stderr)


def http_request(
    port: int,
    method: str,
    path: str,
    body: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, str, bytes]:
    """One HTTP request over loopback; returns (status, content-type, body)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


def wait_http_ok(managed: Managed, port: int, path: str, timeout: float) -> None:
    """Poll ``GET path`` until 200; fail fast (with the log) if the process dies."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if managed.proc.poll() is not None:
            raise RuntimeError(
                f"{managed.name} exited with {managed.proc.returncode}:\n{managed.log_tail()}"
            )
        try:
            status, _, _ = http_request(port, "GET", path, timeout=2.0)
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise RuntimeError(
        f"{managed.name} not ready on :{port}{path} after {timeout}s ({last}):\n"
        f"{managed.log_tail()}"
    )


def check_endpoint(port: int, *, stream: bool, headers: dict[str, str], api: str = "chat",
                   store: bool = True) -> None:
    """POST the benchmark request (in ``api``) once and verify the answer is the fixture's,
    in that API's shape."""
    status, ctype, body = http_request(
        port,
        "POST",
        payloads.API_PATHS[api],
        payloads.request_body(stream=stream, api=api, store=store),
        {"Content-Type": "application/json", **headers},
    )
    problem = f"HTTP {status}: {body[:300]!r}" if status != 200 else None
    problem = problem or payloads.check_response(body, ctype, stream=stream, api=api)
    if problem:
        mode = "stream" if stream else "non-stream"
        raise RuntimeError(f"sanity check failed on :{port} ({api}, {mode}): {problem}")
