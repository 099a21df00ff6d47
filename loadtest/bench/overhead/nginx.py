"""nginx configs and processes: the fixture backend and the plain reverse-proxy baseline.

Both run from generated configs in the benchmark's temp dir (``nginx -p DIR -c CONF -e LOG``,
``daemon off``) on free loopback ports; the system nginx service is never used.

Stream and non-stream responses are served by two server blocks (two ports) at the same path
``/v1/chat/completions``, because nginx cannot cheaply choose a response by request body.
The fixtures are static files (``return 200 '...'`` is limited to 4 KiB config tokens, the
SSE body is ~12 KiB); POST to a static file is a 405 in nginx, so ``error_page 405 =200 $uri``
re-serves the file with status 200 via an internal GET redirect.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import payloads
from .procs import HOST, Managed, ProcessSet, pinned, wait_http_ok

KEEPALIVE_REQUESTS = 100_000_000  # default is 1000: wrk would otherwise reconnect constantly


@dataclass(frozen=True)
class PortPair:
    """A server exposing the non-stream fixture on ``json`` and the SSE fixture on ``sse``."""

    json: int
    sse: int

    def for_mode(self, stream: bool) -> int:
        return self.sse if stream else self.json


def _main_block(workdir: Path, name: str, cpus: str | None) -> str:
    lines = [
        # Workers of a root master default to 'nobody', which cannot read our 0700 temp dir.
        "user root root;" if os.geteuid() == 0 else "",
        "worker_processes 1;",
        f"worker_cpu_affinity {1 << int(cpus):b};" if cpus and cpus.isdigit() else "",
        "daemon off;",
        "master_process on;",
        f"pid {workdir}/{name}.pid;",
        f"error_log {workdir}/{name}-error.log warn;",
        "events { worker_connections 8192; multi_accept on; }",
    ]
    return "\n".join(ln for ln in lines if ln)


def _http_common(workdir: Path, name: str) -> str:
    temp = workdir / f"{name}-temp"
    return f"""
    access_log off;
    server_tokens off;
    sendfile on;
    tcp_nopush off;
    tcp_nodelay on;
    etag off;
    keepalive_timeout 300s;
    keepalive_requests {KEEPALIVE_REQUESTS};
    client_max_body_size 16m;
    client_body_buffer_size 64k;
    open_file_cache max=16 inactive=600s;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
"""


def backend_config(workdir: Path, ports: PortPair, cpus: str | None) -> str:
    """The fixture backend: fixed chat.completion on ``ports.json``, fixed SSE on ``ports.sse``.

    Both also accept OTLP/HTTP span exports at ``/v1/traces`` (answered 200, body discarded), so
    a gateway with tracing on exports to a live collector, as in production."""
    completion = workdir / "completion.json"
    stream = workdir / "stream.sse"
    completion.write_text(payloads.completion_body())
    stream.write_text(payloads.sse_body())

    def server(port: int, path: Path, ctype: str) -> str:
        return f"""
    server {{
        listen {HOST}:{port} backlog=4096;
        location = /v1/chat/completions {{
            default_type {ctype};
            alias {path};
            error_page 405 =200 $uri;
        }}
        location = /v1/traces {{
            # an OTLP/HTTP sink: accepts span batches (an empty ExportTraceServiceResponse)
            default_type application/x-protobuf;
            return 200;
        }}
        location / {{
            default_type application/json;
            return 200 '{{"object":"list","data":[]}}';
        }}
    }}"""

    return (
        _main_block(workdir, "backend", cpus)
        + "\nhttp {"
        + _http_common(workdir, "backend")
        + server(ports.json, completion, "application/json")
        + server(ports.sse, stream, "text/event-stream")
        + "\n}\n"
    )


def proxy_config(workdir: Path, ports: PortPair, backend: PortPair, cpus: str | None) -> str:
    """A plain keep-alive reverse proxy: the cheapest possible hop, the floor for the gateway."""

    def upstream(name: str, port: int) -> str:
        return f"""
    upstream {name} {{
        server {HOST}:{port};
        keepalive 64;
        keepalive_requests {KEEPALIVE_REQUESTS};
        keepalive_timeout 300s;
    }}"""

    def server(port: int, name: str, stream: bool) -> str:
        buffering = "proxy_buffering off;" if stream else ""
        return f"""
    server {{
        listen {HOST}:{port} backlog=4096;
        location / {{
            proxy_pass http://{name};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            {buffering}
        }}
    }}"""

    return (
        _main_block(workdir, "proxy", cpus)
        + "\nhttp {"
        + _http_common(workdir, "proxy")
        + upstream("backend_json", backend.json)
        + upstream("backend_sse", backend.sse)
        + server(ports.json, "backend_json", stream=False)
        + server(ports.sse, "backend_sse", stream=True)
        + "\n}\n"
    )


def start(
    procs: ProcessSet,
    nginx_bin: str,
    workdir: Path,
    name: str,
    config: str,
    ports: PortPair,
    cpus: str | None,
) -> Managed:
    """Validate (``nginx -t``) and start one nginx instance; return once both ports answer."""
    conf = workdir / f"{name}.conf"
    conf.write_text(config)
    (workdir / f"{name}-temp").mkdir(exist_ok=True)
    base = [nginx_bin, "-p", str(workdir), "-c", str(conf), "-e", str(workdir / f"{name}.log")]
    test = subprocess.run([*base, "-t", "-q"], capture_output=True, text=True, check=False)
    if test.returncode != 0:
        raise RuntimeError(f"nginx -t failed for {name}:\n{test.stderr}\n--- config ---\n{config}")
    managed = procs.start(f"nginx-{name}", pinned(base, cpus), workdir / f"{name}.out")
    for port in (ports.json, ports.sse):
        wait_http_ok(managed, port, "/", timeout=10.0)
    return managed


def start_hop(procs: ProcessSet, nginx_bin: str, workdir: Path, backend: PortPair,
              cpus: str | None) -> tuple[Managed, PortPair]:
    """The nginx hop (``proxy_config``) in front of ``backend``, on two free ports."""
    from .procs import free_ports

    hop = PortPair(*free_ports(2))
    managed = start(procs, nginx_bin, workdir, "proxy",
                    proxy_config(workdir, hop, backend, cpus), hop, cpus)
    return managed, hop

