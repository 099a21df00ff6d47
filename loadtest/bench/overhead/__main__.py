"""CLI: ``python -m loadtest.bench.overhead [options]``.

See README.md (beside this file) for what is measured and why.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from . import gateway, nginx, payloads, report, wrk
from .procs import HOST, ProcessSet, check_endpoint, ensure_tools, free_ports

BUSY_LOADAVG = 0.5  # above this before the run, warn that other work skews the numbers
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "results" / "overhead.json"


def _log(msg: str) -> None:
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.overhead",
        description="Per-request overhead of the gateway's proxy hop vs. direct and vs. a plain "
        "nginx reverse proxy, measured with wrk against an nginx fixture backend.",
    )
    p.add_argument("--duration", type=int, default=10, help="seconds per measured cell (10)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up seconds per cell (2)")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 s cells, 1 s warm-up")
    p.add_argument("--connections", default="1,64", help="comma-separated wrk -c values (1,64)")
    p.add_argument("--modes", default="non-stream,stream", help="non-stream,stream (both)")
    p.add_argument("--skip-gateway", action="store_true", help="measure direct and nginx only")
    p.add_argument("--quotas", action="store_true",
                   help="give the bench key's tenant a plan with every limit set (never "
                   "refusing), so each request is admitted and settled; set GATEWAY_REDIS_URL "
                   "in the environment to keep the counters in Redis")
    p.add_argument(
        "--gateway-cmd",
        default=None,
        help="command template to start the proxy under test; placeholders {config} {host} "
        "{port} {backend_port}; it is prefixed with 'taskset -c PROXY_CPU' "
        f"(default: {gateway.default_command()})",
    )
    p.add_argument(
        "--gateway-health",
        default=gateway.HEALTH_PATH,
        help="readiness path polled until 200 (/healthz)",
    )
    p.add_argument("--gateway-ready-timeout", type=float, default=60.0, metavar="SECONDS")
    p.add_argument("--proxy-cpu", default="0", help="taskset CPU list for nginx hop and gateway")
    p.add_argument("--client-cpu", default="1", help="taskset CPU list for wrk")
    p.add_argument(
        "--backend-cpu", default="1", help="taskset CPU list for the backend nginx ('' = unpinned)"
    )
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"JSON result file ({DEFAULT_OUT})"
    )
    gateway.add_log_sink_option(p)
    p.add_argument("--strict", action="store_true", help="exit 1 if a target fails")
    p.add_argument("--keep-temp", action="store_true", help="keep the temp dir (configs, logs)")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.warmup = 2, 1
    args.connections = [int(c) for c in str(args.connections).split(",") if c.strip()]
    args.modes = [m.strip() for m in str(args.modes).split(",") if m.strip()]
    if bad := set(args.modes) - set(report.MODES):
        p.error(f"unknown modes {sorted(bad)}; choose from {report.MODES}")
    if args.duration < 1 or args.warmup < 0 or not args.connections:
        p.error("--duration must be >= 1, --warmup >= 0, --connections non-empty")
    return args


def _version(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    return out[0] if out else "?"


def _meta(args: argparse.Namespace, tools: dict[str, str], gw_cmd: str | None) -> dict[str, Any]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": {
            "cpus": os.cpu_count(),
            "cpu_model": cpu,
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "nginx": _version([tools["nginx"], "-v"]),
        "wrk": _version([tools["wrk"], "-v"]),
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "connections": args.connections,
        "modes": args.modes,
        "pinning": {
            "proxy": args.proxy_cpu,
            "client": args.client_cpu,
            "backend": args.backend_cpu or None,
        },
        "gateway_cmd": gw_cmd,
        "stream_chunks": payloads.STREAM_CHUNKS,
        "loadavg_start": os.getloadavg(),
    }


def _measure(
    args: argparse.Namespace,
    wrk_bin: str,
    script: Path,
    port: int,
    mode: str,
    conns: int,
    target: str,
) -> report.Cell:
    url = f"http://{HOST}:{port}/v1/chat/completions"
    cell = report.Cell(mode, conns, target)
    try:
        if args.warmup:
            wrk.run(
                wrk_bin,
                url,
                script,
                connections=conns,
                duration_s=args.warmup,
                cpus=args.client_cpu or None,
            )
        cell.result = wrk.run(
            wrk_bin,
            url,
            script,
            connections=conns,
            duration_s=args.duration,
            cpus=args.client_cpu or None,
        )
        r = cell.result
        _log(
            f"{mode:10} c={conns:<3} {target:8} {r.rps:>10,.0f} req/s  p50 {r.p50_ms:.3f} ms  "
            f"p99 {r.p99_ms:.3f} ms" + (f"  ERRORS {r.errors}" if r.errors else "")
        )
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        cell.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        _log(f"{mode} c={conns} {target}: {exc}")
    return cell


def run(args: argparse.Namespace, procs: ProcessSet, workdir: Path) -> report.Results:
    tools = ensure_tools()
    gw_cmd = None if args.skip_gateway else (args.gateway_cmd or gateway.default_command())
    args.meta = _meta(args, tools, gw_cmd)
    bj, bs, pj, ps = free_ports(4)
    backend_ports, proxy_ports = nginx.PortPair(bj, bs), nginx.PortPair(pj, ps)
    cpu = {"proxy": args.proxy_cpu or None, "backend": args.backend_cpu or None}

    _log(f"backend nginx on :{bj} (json) :{bs} (sse), cpu {cpu['backend'] or 'unpinned'}")
    nginx.start(
        procs,
        tools["nginx"],
        workdir,
        "backend",
        nginx.backend_config(workdir, backend_ports, cpu["backend"]),
        backend_ports,
        cpu["backend"],
    )
    _log(f"proxy nginx on :{pj} (json) :{ps} (sse), cpu {cpu['proxy'] or 'unpinned'}")
    nginx.start(
        procs,
        tools["nginx"],
        workdir,
        "proxy",
        nginx.proxy_config(workdir, proxy_ports, backend_ports, cpu["proxy"]),
        proxy_ports,
        cpu["proxy"],
    )

    api_key = gateway.new_api_key()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    cells: list[report.Cell] = []
    for mode in args.modes:
        stream = mode == "stream"
        script = workdir / f"{mode}.lua"
        script.write_text(wrk.lua_script(payloads.request_body(stream=stream), headers))
        ports = {"direct": backend_ports.for_mode(stream), "nginx": proxy_ports.for_mode(stream)}
        for port in ports.values():
            check_endpoint(port, stream=stream, headers=headers)

        gw = None
        gw_error = None
        if gw_cmd:
            (gw_port,) = free_ports(1)
            _log(f"starting gateway ({mode}) on :{gw_port}, cpu {cpu['proxy'] or 'unpinned'}")
            try:
                gw = gateway.start(
                    procs,
                    workdir,
                    template=gw_cmd,
                    api_key=api_key,
                    port=gw_port,
                    backend_port=ports["direct"],
                    cpus=cpu["proxy"],
                    label=mode,
                    health_path=args.gateway_health,
                    ready_timeout=args.gateway_ready_timeout,
                    quotas=args.quotas,
                    log_shim=args.log_sink == "pipe",
                    log_shim_cpus=args.client_cpu or None,
                )
                check_endpoint(gw_port, stream=stream, headers=headers)
                ports["gateway"] = gw_port
            except (RuntimeError, OSError) as exc:
                gw_error = str(exc)
                _log(f"gateway ({mode}) unusable: {exc}")
                if gw is not None:
                    _log(f"gateway log tail:\n{gw.log_tail()}")

        for conns in args.connections:
            for target in report.TARGETS:
                if target in ports:
                    cells.append(
                        _measure(args, tools["wrk"], script, ports[target], mode, conns, target)
                    )
                elif target == "gateway" and gw_error:
                    first = gw_error.splitlines()[0].rstrip(":") if gw_error else "failed"
                    cells.append(report.Cell(mode, conns, target, error=first))
        if gw is not None:
            if gw.proc.poll() is not None:
                _log(f"gateway ({mode}) died during the run:\n{gw.log_tail()}")
            procs.stop(gw)
    return report.Results(cells)


def _on_sigterm(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Explicit handlers: a shell may start us with SIGINT ignored (background jobs), and
    # SIGTERM must also unwind through the cleanup below instead of orphaning nginx/gateway.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_sigterm)
    workdir = Path(tempfile.mkdtemp(prefix="overhead-"))
    procs = ProcessSet()
    try:
        results = run(args, procs, workdir)
    except KeyboardInterrupt:
        _log("interrupted")
        return 130
    finally:
        procs.stop_all()
        if args.keep_temp:
            _log(f"kept temp dir {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    table = report.markdown(results)
    args.meta["loadavg_end"] = os.getloadavg()
    busy = args.meta["loadavg_start"][0]
    if busy > BUSY_LOADAVG:
        # Pinning cannot keep other work off our cores; say so next to the numbers.
        table += (
            f"\nNote: 1-min load average was {busy:.2f} before the run: other processes were "
            "competing for the CPUs, so the numbers are noisy. Re-run on an idle machine.\n"
        )
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report.to_json(results, args.meta), indent=2) + "\n")
    args.out.with_suffix(".md").write_text(table)
    _log(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    failed = [t for t in results.targets() if t.status == "FAIL"]
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
