"""Event-loop stall benchmark: how long can one request freeze a gateway worker?

``python -m loadtest.bench.loop_stall [--rounds 3]``

Starts a simulated engine and one gateway worker, then, for each kind of hostile input, sends
it (from 2 concurrent clients, ``--rounds`` times each) while a probe on its own keep-alive
connection asks ``GET /healthz`` every 5 ms. The probe's worst and p99 latency during a phase,
against the same probe on the idle gateway, is the longest the worker's loop was blocked (a
blocked loop answers nothing). The inputs:

* ``nospace-admitted``: a 3 MiB prompt of one repeated letter (the tokenizer's worst case:
  ~0.5 us a byte), admitted and counted (3 MiB: the simulated engine's KV cache holds it);
* ``nospace-at-limit``: the same from a key already at its rpm limit (must be refused before
  any counting);
* ``words``: 1.5 MiB of ordinary words;
* ``many-messages``: 20,000 short messages (the per-message path of the counter);
* ``stream-no-usage``: a streamed answer cut by the backend (``x-sim-disconnect-after``) so
  it reports no usage and the delivered text is counted after it ends.

The gateway is pinned to core 0 and the simulator and this client to the others (when the
machine has two or more cores), so the figure is the gateway's own, not CPU contention with
the engine. Target (issue 14, point 6): the worst probe latency under every input stays below
50 ms. Talks HTTP only; prints a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-gw-stall-bench-0123456789abcdef0123456789abcdef"
LIMITED = "sk-gw-stall-limited-0123456789abcdef0123456789abc"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, path: str = "/healthz", timeout: float = 30.0) -> None:
    host, port = url.removeprefix("http://").split(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up")


def _policy(sim_url: str, spool: Path) -> dict[str, Any]:
    def key(token: str, kid: str, tenant: str) -> dict[str, Any]:
        return {"id": kid, "tenant": tenant, "sha256": hashlib.sha256(token.encode()).hexdigest()}

    return {
        "auth": {"keys": [key(KEY, "bench", "open"), key(LIMITED, "limited", "tight")]},
        "pools": [{"name": "chat", "backends": [{"name": "sim", "url": sim_url,
                                                 "max_in_flight": 64}]}],
        "models": [{"name": "chat", "pool": "chat", "backend_model": "sim-model"}],
        "plans": [{"name": "open", "limits": {"rpm": 1_000_000}},
                  {"name": "tight", "limits": {"rpm": 1}}],
        "tenants": [{"name": "open", "plan": "open"}, {"name": "tight", "plan": "tight"}],
        "store": {"spool_dir": str(spool)},
        "server": {"max_body_bytes": 16 << 20},
    }


class Probe:
    """GET /healthz every 5 ms on one keep-alive connection; keeps each latency."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self._stop.is_set():
            t0 = time.perf_counter()
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            self.samples.append(time.perf_counter() - t0)
            time.sleep(0.005)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _post(port: int, token: str, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if b'"stream": true' in body:
        headers["x-sim-disconnect-after"] = "1500"
    conn.request("POST", "/v1/chat/completions", body, headers)
    response = conn.getresponse()
    response.read()
    return response.status


def _inputs() -> dict[str, tuple[str, bytes]]:
    nospace = json.dumps({"model": "chat", "max_tokens": 4,
                          "messages": [{"role": "user", "content": "a" * (3 << 20)}]}).encode()
    words = json.dumps({"model": "chat", "max_tokens": 4, "messages": [
        {"role": "user", "content": "lorem ipsum dolor sit amet " * ((3 << 19) // 27)}]}).encode()
    many = json.dumps({"model": "chat", "max_tokens": 4, "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} here"}
        for i in range(20_000)]}).encode()
    stream = json.dumps({"model": "chat", "max_tokens": 2000, "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]}).encode()
    return {
        "nospace-admitted": (KEY, nospace),
        "nospace-at-limit": (LIMITED, nospace),
        "words": (KEY, words),
        "many-messages": (KEY, many),
        "stream-no-usage": (KEY, stream),
    }


def _phase(port: int, token: str, body: bytes, rounds: int) -> tuple[list[float], list[int]]:
    codes: list[int] = []

    def client() -> None:
        for _ in range(rounds):
            codes.append(_post(port, token, body))

    with Probe(port) as probe:
        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return probe.samples, codes


def _stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[-1] * 1e3, ordered[int(0.99 * (len(ordered) - 1))] * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.loop_stall",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="requests per client per input")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="loop-stall-"))
    sim_port, gw_port = _free_port(), _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "GATEWAY_ACCESS_LOG": "off"}
    try:
        log = open(tmp / "procs.log", "wb")  # noqa: SIM115
        cores = sorted(os.sched_getaffinity(0))
        gw_cores, other = ({cores[0]}, set(cores[1:])) if len(cores) > 1 else (None, None)
        if other:
            os.sched_setaffinity(0, other)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "gateway", "sim", "--port", str(sim_port), "--profile",
             "interactive", "--speedup", "50"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env))
        _wait(f"http://127.0.0.1:{sim_port}", "/health")
        config = tmp / "policy.yaml"
        config.write_text(yaml.safe_dump(_policy(f"http://127.0.0.1:{sim_port}", tmp / "spool")))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port",
             str(gw_port)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env))
        if gw_cores:
            os.sched_setaffinity(procs[-1].pid, gw_cores)
        _wait(f"http://127.0.0.1:{gw_port}")
        _post(gw_port, LIMITED, b'{"model":"chat","max_tokens":1,"messages":'
                                b'[{"role":"user","content":"x"}]}')  # use up the rpm of 1
        with Probe(gw_port) as idle:
            time.sleep(2.0)
        rows = [("idle", *_stats(idle.samples), "")]
        for name, (token, body) in _inputs().items():
            samples, codes = _phase(gw_port, token, body, args.rounds)
            statuses = ",".join(f"{c}x{codes.count(c)}" for c in sorted(set(codes)))
            rows.append((name, *_stats(samples), statuses))
        print("| input | worst probe (ms) | p99 probe (ms) | answers |")
        print("| --- | ---: | ---: | --- |")
        for name, worst, p99, statuses in rows:
            print(f"| {name} | {worst:.1f} | {p99:.1f} | {statuses} |")
        worst_all = max(r[1] for r in rows[1:])
        print(f"\nworst stall under hostile input: {worst_all:.1f} ms (target < 50 ms): "
              + ("met" if worst_all < 50 else "NOT met"))
        return 0
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
