"""Instructions per request of each client API on one live gateway, counted by callgrind.

``python -m loadtest.bench.overhead.instructions chat responses`` starts the fixture backend
(nginx, as the overhead bench does) and one gateway under ``valgrind --tool=callgrind``, warms
each path up, then for each round and path zeroes the counters (``callgrind_control -z``),
sends ``--requests`` requests of that path one after another on one keep-alive connection,
and dumps the counters (``callgrind_control -d``): their total over the requests is the
path's instructions per request. Paths: ``chat``, ``messages``, ``responses`` (with
``store: false``: translation alone) and ``responses-stored`` (the default ``store: true``,
which also saves the response in the ledger's database). It prints each round and the ratio of
each path to ``chat`` in the same round.

Why instructions: the box is shared and a core's speed drifts, so CPU time of separate runs
cannot show a few percent; instructions are the same on a busy machine and an idle one. They
are counted on one connection, so every request also pays the event loop's wake-up that 64
busy connections share: ``ab``'s CPU-per-request ratios (``loadtest.bench.overhead.ab``) run
higher than these, the translation being a larger part of a request under load. Both gateway
and fixture run unpinned by default (``--proxy-cpu``, ``--backend-cpu`` to pin them).

The gateway's ledger is a SQLite file in the run's temp dir (``GATEWAY_LEDGER_URL``), so a
database another gateway migrated is never read. Needs ``valgrind`` (``callgrind_control`` is
part of it); the gateway starts in about a minute under it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import gateway, nginx, payloads
from .procs import HOST, ProcessSet, ensure_tools, free_ports

__all__ = ["PATHS", "main"]

#: path name -> (client API, ``store`` of a Responses request)
PATHS = {"chat": ("chat", True), "messages": ("messages", True),
         "responses": ("responses", False), "responses-stored": ("responses", True)}
_TOTAL = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.overhead.instructions",
                                description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help=f"the paths to count, of {', '.join(PATHS)} (chat responses)")
    p.add_argument("--stream", action="store_true", help="streams of 64 chunks")
    p.add_argument("--requests", type=int, default=100, help="requests per count (100)")
    p.add_argument("--rounds", type=int, default=2, help="counts of each path (2)")
    p.add_argument("--warmup", type=int, default=30, help="requests per path first (30)")
    p.add_argument("--proxy-cpu", default="", help="taskset -c list of the gateway")
    p.add_argument("--backend-cpu", default="", help="taskset -c list of the fixture")
    p.add_argument("--out", type=Path, help="JSON of the counts")
    args = p.parse_args(argv)
    args.paths = args.paths or ["chat", "responses"]
    unknown = [path for path in args.paths if path not in PATHS]
    if unknown:  # (not argparse's choices: it checks an empty list against them as one value)
        p.error(f"unknown paths {unknown}; expected some of {', '.join(PATHS)}")
    return args


def _send(conn: http.client.HTTPConnection, path: str, api_key: str, stream: bool) -> None:
    api, store = PATHS[path]
    body = payloads.request_body(stream=stream, api=api, store=store).encode()
    conn.request("POST", payloads.API_PATHS[api], body=body,
                 headers=payloads.request_headers(api_key, api))
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:  # an error answer is cheap: it would pass for a fast request
        raise RuntimeError(f"{path}: status {response.status}: {data[:300]!r}")


def _counted(workdir: Path, pid: int, label: str) -> int:
    """Dump the counters (since the last zeroing) and read their total."""
    subprocess.run(["callgrind_control", "-d", label, str(pid)], check=True,
                   capture_output=True)
    dump = max(workdir.glob("callgrind.out.*"), key=os.path.getmtime)
    match = _TOTAL.search(dump.read_bytes())
    if match is None:
        raise RuntimeError(f"no total in {dump}")
    dump.unlink()
    return int(match.group(1))


def count(args: argparse.Namespace, procs: ProcessSet, workdir: Path) -> dict[str, list[float]]:
    """Instructions per request of each path, one figure per round."""
    tools = ensure_tools()
    backend_cpu = args.backend_cpu or None
    bj, bs = free_ports(2)
    ports = nginx.PortPair(bj, bs)
    nginx.start(procs, tools["nginx"], workdir, "backend",
                nginx.backend_config(workdir, ports, backend_cpu), ports, backend_cpu)
    api_key = gateway.new_api_key()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://{HOST}:{ports.json}"
    os.environ["GATEWAY_LEDGER_URL"] = f"sqlite:///{workdir / 'ledger.db'}"
    valgrind = shutil.which("valgrind") or "valgrind"
    template = (f"{shlex.quote(valgrind)} --tool=callgrind "
                f"--callgrind-out-file={workdir / 'callgrind.out'} "
                f"{shlex.quote(sys.executable)} {gateway.default_command()}")
    (port,) = free_ports(1)
    gw = gateway.start(procs, workdir, template=template, api_key=api_key, port=port,
                       backend_port=ports.for_mode(args.stream), cpus=args.proxy_cpu or None,
                       label="callgrind", ready_timeout=600)
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    for path in args.paths:
        for _ in range(args.warmup):
            _send(conn, path, api_key, args.stream)
    counts: dict[str, list[float]] = {path: [] for path in args.paths}
    for round_ in range(args.rounds):
        for path in args.paths:
            subprocess.run(["callgrind_control", "-z", str(gw.proc.pid)], check=True,
                           capture_output=True)
            for _ in range(args.requests):
                _send(conn, path, api_key, args.stream)
            time.sleep(0.5)  # what the requests left to the loop (the record's flush) runs
            total = _counted(workdir, gw.proc.pid, f"{path}-{round_}")
            counts[path].append(total / args.requests)
            print(f"[instructions] round {round_ + 1} {path:>16}: "
                  f"{total / args.requests / 1e6:.3f}M per request", flush=True)
    conn.close()
    return counts


def report(counts: dict[str, list[float]]) -> str:
    lines = []
    chat = counts.get("chat")
    for path, figures in counts.items():
        line = f"{path}: " + ", ".join(f"{f / 1e6:.3f}M" for f in figures)
        if chat is not None and path != "chat":
            line += " (/ chat: " + ", ".join(f"{f / c:.3f}" for f, c in zip(figures, chat,
                                                                                strict=True)) + ")"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="overhead-instructions-"))
    procs = ProcessSet()
    try:
        counts = count(args, procs, workdir)
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    print(report(counts))
    if args.out is not None:
        summary: dict[str, Any] = {"stream": args.stream, "requests": args.requests,
                                   "instructions_per_request": counts}
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
