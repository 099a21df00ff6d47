"""Memory and file descriptors of one gateway worker holding many open streams, and after.

``python -m loadtest.bench.streams [--streams 2000] [--cycles 3] [--soak 600]`` starts a slow
streaming backend (:mod:`loadtest.bench.fastserver`: one SSE event per ``--interval-ms``, 100 ms
by default, and a stream long enough never to end by itself) and one embedded gateway worker in
front of it (no Redis, access log off, the overhead bench's policy), then:

1. **ramp**: opens streams from raw asyncio sockets, batch by batch, and once each has its first
   event reads the gateway's memory at 0, 500, 1,000 and 2,000 open streams (``VmRSS`` of
   ``/proc/<pid>/status``, ``Rss``/``Anonymous``/``Private_Dirty`` of ``smaps_rollup``) and its
   open fds (``/proc/<pid>/fd``); the per-stream increment is ``(RSS(N) - RSS(0)) / N``;
2. **close**: every client disconnects (the gateway cancels each stream: the teardown under
   test) and, once the gateway's fd count has come back (or 10 s passed), memory is read again;
3. **cycles**: ``--cycles`` more rounds of open N / hold ``--hold`` seconds / disconnect;
4. **soak** (``--soak S``): rounds like 3 for S seconds; the RSS read after each round's close
   is fitted against time (least squares, MB per hour), and fds compared with the baseline.

Clients disconnect with a FIN by default (``--abort``: a RST). The bench raises its own
``RLIMIT_NOFILE`` (the gateway and backend inherit it). Results: a Markdown table on stdout and
JSON in ``loadtest/results/streams.json``. It talks HTTP to the gateway and reads ``/proc``;
``--memdebug FILE`` also has the gateway dump its allocation sites after each close
(``gateway/http/memdebug.py``). A benchmark, so it lives in ``loadtest/bench/`` (the validation
tool outside it talks HTTP only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from .overhead import gateway
from .overhead.procs import HOST, Managed, ProcessSet, free_ports, pinned

__all__ = ["Sample", "fit_slope", "main", "read_memory"]

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "streams.json"
RAMP_POINTS = (500, 1000, 2000)
_MB = 1024 * 1024


def _log(msg: str) -> None:
    print(f"[streams] {msg}", file=sys.stderr, flush=True)


# --- what the gateway process holds -------------------------------------------------------------

@dataclass(slots=True)
class Sample:
    """One reading of the gateway process: memory in bytes, open fds, and when."""

    label: str
    streams: int
    t_s: float
    rss: int
    anon: int
    private_dirty: int
    fds: int


def _kb_fields(path: Path, names: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            out[key] = int(rest.split()[0]) * 1024
    return out


def read_memory(pid: int, label: str, streams: int, t0: float) -> Sample:
    """The process's resident memory (status and smaps_rollup) and its open fds."""
    proc = Path(f"/proc/{pid}")
    status = _kb_fields(proc / "status", ("VmRSS",))
    rollup = _kb_fields(proc / "smaps_rollup", ("Rss", "Anonymous", "Private_Dirty"))
    return Sample(label, streams, round(time.monotonic() - t0, 1), status["VmRSS"],
                  rollup.get("Anonymous", 0), rollup.get("Private_Dirty", 0),
                  len(os.listdir(proc / "fd")))


def fit_slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(x, y)`` points (0 with fewer than two distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / var


# --- the clients --------------------------------------------------------------------------------

class _Stream(asyncio.Protocol):
    """One client: sends the streaming request, notes its first event, counts what follows."""

    def __init__(self, request: bytes, started: asyncio.Future[None]) -> None:
        self.request = request
        self.started = started
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if self.started.done():
            return
        self.head += data
        if b"data:" in self.head:
            if not self.head.startswith(b"HTTP/1.1 200"):
                self.started.set_exception(RuntimeError(f"gateway answered {self.head[:200]!r}"))
            else:
                self.started.set_result(None)
            self.head = b""

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.started.done():
            self.started.set_exception(
                RuntimeError(f"connection lost before the first event: {exc}"))

    def leave(self, abort: bool) -> None:
        if self.transport is not None:
            (self.transport.abort if abort else self.transport.close)()


def _request(port: int, api_key: str) -> bytes:
    body = (b'{"model":"bench-model","stream":true,"max_tokens":1000000,'
            b'"messages":[{"role":"user","content":"hold this stream open"}]}')
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s:%d\r\n"
            b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (HOST.encode(), port, api_key.encode(), len(body),
                                                 body))


class Clients:
    """The open streams of the bench, opened in batches and closed all at once."""

    def __init__(self, port: int, api_key: str, batch: int) -> None:
        self.port, self.batch = port, batch
        self.request = _request(port, api_key)
        self.open: list[_Stream] = []

    async def open_to(self, n: int) -> None:
        """Open streams until ``n`` are open, each having received its first event."""
        loop = asyncio.get_running_loop()
        while len(self.open) < n:
            todo = min(self.batch, n - len(self.open))
            made = []
            for _ in range(todo):
                started: asyncio.Future[None] = loop.create_future()
                stream = _Stream(self.request, started)
                made.append((stream, started))
            await asyncio.gather(*(loop.create_connection(lambda s=s: s, HOST, self.port)
                                   for s, _ in made))
            async with asyncio.timeout(180):
                await asyncio.gather(*(f for _, f in made))
            self.open.extend(s for s, _ in made)

    def close_all(self, abort: bool) -> None:
        for stream in self.open:
            stream.leave(abort)
        self.open.clear()


# --- the run ------------------------------------------------------------------------------------

@dataclass
class Run:
    """Everything measured in one run."""

    meta: dict[str, Any]
    samples: list[Sample] = field(default_factory=list)
    cycles: list[Sample] = field(default_factory=list)
    soak: list[Sample] = field(default_factory=list)


async def _settle(pid: int, baseline_fds: int, wait: float) -> None:
    """Wait until the gateway's fds are back to ``baseline_fds`` (at most 10 s), then ``wait``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if len(os.listdir(f"/proc/{pid}/fd")) <= baseline_fds:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(wait)


async def _cycle(clients: Clients, n: int, hold: float, abort: bool, pid: int,
                 baseline_fds: int) -> None:
    await clients.open_to(n)
    await asyncio.sleep(hold)
    clients.close_all(abort)
    await _settle(pid, baseline_fds, 1.0)


async def _dump(args: argparse.Namespace, pid: int) -> None:
    """With ``--memdebug``: the gateway appends its allocation sites to the file."""
    if args.memdebug is not None:
        os.kill(pid, signal.SIGUSR2)
        await asyncio.sleep(5.0)


async def measure(args: argparse.Namespace, pid: int, port: int, api_key: str, run: Run) -> None:
    t0 = time.monotonic()
    clients = Clients(port, api_key, args.batch)
    # warm-up: the code paths of a stream and its teardown, so the baseline is not a cold start
    await clients.open_to(20)
    clients.close_all(args.abort)
    await asyncio.sleep(2.0)
    await _dump(args, pid)
    base = read_memory(pid, "idle", 0, t0)
    run.samples.append(base)
    _log(f"idle: {base.rss / _MB:.1f} MB, {base.fds} fds")
    for n in (p for p in RAMP_POINTS if p < args.streams):
        await clients.open_to(n)
        await asyncio.sleep(args.hold)
        run.samples.append(sample := read_memory(pid, "open", n, t0))
        _log(f"{n} open: {sample.rss / _MB:.1f} MB, {sample.fds} fds")
    await clients.open_to(args.streams)
    await asyncio.sleep(args.hold)
    run.samples.append(sample := read_memory(pid, "open", args.streams, t0))
    _log(f"{args.streams} open: {sample.rss / _MB:.1f} MB, {sample.fds} fds")
    clients.close_all(args.abort)
    await _settle(pid, base.fds, 1.0)
    run.samples.append(sample := read_memory(pid, "closed", 0, t0))
    await _dump(args, pid)
    _log(f"closed: {sample.rss / _MB:.1f} MB, {sample.fds} fds")
    for i in range(args.cycles):
        await _cycle(clients, args.streams, args.hold, args.abort, pid, base.fds)
        run.cycles.append(sample := read_memory(pid, f"cycle {i + 1}", 0, t0))
        await _dump(args, pid)
        _log(f"after cycle {i + 1}: {sample.rss / _MB:.1f} MB, {sample.fds} fds")
    if args.soak > 0:
        end = time.monotonic() + args.soak
        i = 0
        while time.monotonic() < end:
            i += 1
            await _cycle(clients, args.streams, args.hold, args.abort, pid, base.fds)
            run.soak.append(sample := read_memory(pid, f"soak {i}", 0, t0))
            _log(f"soak cycle {i} (t={sample.t_s:.0f}s): {sample.rss / _MB:.1f} MB, "
                 f"{sample.fds} fds")


def summary(run: Run) -> dict[str, Any]:
    """Derived figures: per-stream increment, growth after close and across cycles, slope."""
    base = run.samples[0]
    opened = [s for s in run.samples if s.label == "open"]
    closed = next((s for s in run.samples if s.label == "closed"), None)
    top = max(opened, key=lambda s: s.streams) if opened else base
    out: dict[str, Any] = {
        "idle_mb": base.rss / _MB,
        "peak_streams": top.streams,
        "peak_mb": top.rss / _MB,
        "per_stream_kb": (top.rss - base.rss) / max(1, top.streams) / 1024,
        "baseline_fds": base.fds,
    }
    if closed is not None:
        out["closed_mb"] = closed.rss / _MB
        after = run.cycles or [closed]
        out["after_cycles_mb"] = [s.rss / _MB for s in run.cycles]
        out["kept_per_cycle_kb_per_stream"] = (
            (after[-1].rss - closed.rss) / max(1, len(run.cycles)) / max(1, top.streams) / 1024)
        out["fds_after"] = after[-1].fds
    if run.soak:
        points = [(s.t_s / 3600, s.rss / _MB) for s in run.soak]
        half = run.soak[len(run.soak) // 2:]
        out["soak"] = {
            "cycles": len(run.soak),
            "seconds": run.soak[-1].t_s - run.soak[0].t_s,
            "first_mb": run.soak[0].rss / _MB,
            "last_mb": run.soak[-1].rss / _MB,
            "min_mb": min(s.rss for s in run.soak) / _MB,
            "max_mb": max(s.rss for s in run.soak) / _MB,
            "slope_mb_per_hour": fit_slope(points),
            "slope_second_half_mb_per_hour": fit_slope(
                [(s.t_s / 3600, s.rss / _MB) for s in half]),
            "fds_last": run.soak[-1].fds,
            "fds_max": max(s.fds for s in run.soak),
        }
    return out


def markdown(run: Run) -> str:
    rows = ["| point | open streams | VmRSS MB | anon MB | private dirty MB | fds |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for s in [*run.samples, *run.cycles, *run.soak[-3:]]:
        rows.append(f"| {s.label} | {s.streams} | {s.rss / _MB:.1f} | {s.anon / _MB:.1f} | "
                    f"{s.private_dirty / _MB:.1f} | {s.fds} |")
    info = summary(run)
    lines = [*rows, "",
             f"- per open stream: {info['per_stream_kb']:.1f} KB "
             f"(idle {info['idle_mb']:.1f} MB -> {info['peak_mb']:.1f} MB at "
             f"{info['peak_streams']} streams)"]
    if "closed_mb" in info:
        lines.append(f"- after the streams closed: {info['closed_mb']:.1f} MB; kept per cycle: "
                     f"{info['kept_per_cycle_kb_per_stream']:.2f} KB per stream; fds "
                     f"{info['fds_after']} (baseline {info['baseline_fds']})")
    if "soak" in info:
        s = info["soak"]
        lines.append(f"- soak: {s['cycles']} cycles over {s['seconds']:.0f} s, RSS after close "
                     f"{s['first_mb']:.1f} -> {s['last_mb']:.1f} MB (min {s['min_mb']:.1f}, max "
                     f"{s['max_mb']:.1f}), slope {s['slope_mb_per_hour']:+.2f} MB/h (second "
                     f"half {s['slope_second_half_mb_per_hour']:+.2f} MB/h); fds last "
                     f"{s['fds_last']}, max {s['fds_max']} (baseline {info['baseline_fds']})")
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.machine()


def _raise_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < need:
        _log(f"RLIMIT_NOFILE hard limit {hard} is below the {need} fds wanted")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.streams", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=2000, help="open streams at the peak (2000)")
    p.add_argument("--cycles", type=int, default=3, help="open/close rounds after the ramp (3)")
    p.add_argument("--hold", type=float, default=3.0,
                   help="seconds streams stay open before a reading or a close (3)")
    p.add_argument("--soak", type=float, default=0.0, metavar="SECONDS",
                   help="then rounds for this long, fitting RSS against time (0: none)")
    p.add_argument("--interval-ms", type=float, default=100.0,
                   help="the backend's pause between events (100)")
    p.add_argument("--batch", type=int, default=100, help="connections opened at once (100)")
    p.add_argument("--abort", action="store_true", help="clients leave with a RST, not a FIN")
    p.add_argument("--gateway-cpus", default="0", help="taskset CPUs of the gateway (0)")
    p.add_argument("--backend-cpus", default="1", help="taskset CPUs of the backend (1)")
    p.add_argument("--gateway-cmd", default=None, help="command template (see the overhead bench)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment of the gateway (e.g. MALLOC_ARENA_MAX=1)")
    p.add_argument("--memdebug", type=Path, default=None, metavar="FILE",
                   help="run the gateway with GATEWAY_MEMDEBUG=FILE (tracemalloc: slow) and "
                   "have it dump its allocation sites after each close (SIGUSR2)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output")
    p.add_argument("--workdir", type=Path, default=None, help="configs and logs (a temp dir)")
    return p.parse_args(argv)


def _start(args: argparse.Namespace, procs: ProcessSet, workdir: Path
           ) -> tuple[Managed, int, str]:
    port, backend_port = free_ports(2)
    backend = procs.start("backend", pinned(
        [sys.executable, "-m", "loadtest.bench.fastserver", "--host", HOST, "--port",
         str(backend_port), "--interval-ms", str(args.interval_ms)], args.backend_cpus),
        workdir / "backend.log")
    _ = backend
    os.environ["GATEWAY_ACCESS_LOG"] = "off"
    if args.memdebug is not None:
        os.environ["GATEWAY_MEMDEBUG"] = str(args.memdebug.resolve())
    for item in args.env:
        name, _, value = item.partition("=")
        os.environ[name] = value
    api_key = gateway.new_api_key()
    managed = gateway.start(procs, workdir, template=args.gateway_cmd or gateway.default_command(),
                            api_key=api_key, port=port, backend_port=backend_port,
                            cpus=args.gateway_cpus, label="streams")
    return managed, port, api_key


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _raise_nofile(2 * args.streams + 1024)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="streams-"))
    workdir.mkdir(parents=True, exist_ok=True)
    procs = ProcessSet()
    load_before = os.getloadavg()
    meta: dict[str, Any] = {
        "command": "python -m loadtest.bench.streams " + " ".join(argv if argv is not None
                                                            else sys.argv[1:]),
        "machine": f"{_cpu_model()}, {os.cpu_count()} cpus, "
                   f"{platform.python_implementation()} {platform.python_version()}",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_before": load_before, "streams": args.streams, "hold_s": args.hold,
        "interval_ms": args.interval_ms, "abort": args.abort, "env": args.env,
    }
    run = Run(meta)
    try:
        managed, port, api_key = _start(args, procs, workdir)
        meta["gateway_pid"] = managed.proc.pid
        asyncio.run(measure(args, managed.proc.pid, port, api_key, run))
    finally:
        procs.stop_all()
    meta["load_after"] = os.getloadavg()
    table = markdown(run)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "summary": summary(run),
                                    "samples": [asdict(s) for s in run.samples],
                                    "cycles": [asdict(s) for s in run.cycles],
                                    "soak": [asdict(s) for s in run.soak]}, indent=2) + "\n")
    _log(f"wrote {args.out}; load average before {load_before}, after {meta['load_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
