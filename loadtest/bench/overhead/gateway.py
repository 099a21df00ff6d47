"""The gateway under test: its policy file, its command line, and starting it.

The gateway is restarted per mode (non-stream, stream) with the matching backend port in its
config: the fixture backend serves one response per port, and the gateway has one backend URL.
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from .procs import HOST, Managed, ProcessSet, pinned, wait_http_ok

HEALTH_PATH = "/healthz"


def new_api_key() -> str:
    """A random key with the gateway's ``sk-gw-`` prefix; only its sha256 goes in the config."""
    return f"sk-gw-bench-{secrets.token_hex(16)}"


QUOTAS = """\
plans:
  - name: bench
    limits: {rpm: 100000000, tpm: 100000000000, concurrency: 100000,
             tokens_per_day: 100000000000000, tokens_per_month: 100000000000000}
tenants:
  - {name: bench, plan: bench}
"""


def config_yaml(api_key: str, backend_port: int, *, quotas: bool = False,
                spool_dir: Path | None = None, store: dict[str, str] | None = None,
                data_dir: Path | None = None) -> str:
    """The gateway policy: one key, one pool with the nginx fixture backend, one model; with
    ``quotas`` the key's tenant has a plan with every limit set (high enough never to refuse,
    so every request pays for the full check-and-reserve and the settle). ``store``: more
    ``store:`` options, written as given (``{"ledger_durability": "buffered"}``). ``data_dir``:
    the gateway's own data directory (its SQLite ledger), so two gateways of one run never
    share a ledger file, nor one left by an earlier run in the working directory."""
    digest = hashlib.sha256(api_key.encode()).hexdigest()
    extra = QUOTAS if quotas else ""
    options = {"spool_dir": str(spool_dir)} if spool_dir is not None else {}
    if data_dir is not None:
        options["data_dir"] = str(data_dir)
    options |= store or {}
    if options:
        extra += "store:\n" + "".join(f"  {k}: {v}\n" for k, v in options.items())
    return extra + f"""\
server:
  max_body_bytes: 8388608
auth:
  keys:
    - id: bench
      tenant: bench
      sha256: {digest}
pools:
  - name: bench
    class: interactive
    backends:
      - name: nginx
        url: http://{HOST}:{backend_port}
        max_in_flight: 4096
models:
  - name: bench-model
    pool: bench
    max_output_tokens: 1000000   # the streams bench's streams never end by themselves
"""


def default_command() -> str:
    """``gateway serve`` from this interpreter's venv (falling back to PATH)."""
    exe = Path(sys.executable).parent / "gateway"
    binary = str(exe) if exe.exists() else (shutil.which("gateway") or "gateway")
    return (
        f"{shlex.quote(binary)} serve --config {{config}} --host {{host}} --port {{port}} "
        "--workers 1"
    )


def command(template: str, *, config: Path, port: int, backend_port: int) -> list[str]:
    """Expand ``{config}``, ``{host}``, ``{port}``, ``{backend_port}`` in a command template."""
    words = shlex.split(template)
    fields = {
        "config": str(config),
        "host": HOST,
        "port": str(port),
        "backend_port": str(backend_port),
    }
    return [w.format(**fields) for w in words]


def add_log_sink_option(parser: argparse.ArgumentParser) -> None:
    """``--log-sink pipe|file``, shared by the overhead tool and the A/B tool."""
    parser.add_argument(
        "--log-sink", choices=("pipe", "file"), default="pipe",
        help="the gateway's output: 'pipe' (default) to a log shim on the client core that "
        "appends it to the log file, as a container runtime's shim does; 'file' straight "
        "into the file (its file system cost on the proxy core)")


def start(
    procs: ProcessSet,
    workdir: Path,
    *,
    template: str,
    api_key: str,
    port: int,
    backend_port: int,
    cpus: str | None,
    label: str,
    health_path: str = HEALTH_PATH,
    ready_timeout: float = 60.0,
    quotas: bool = False,
    log_shim: bool = False,
    log_shim_cpus: str | None = None,
    store: dict[str, str] | None = None,
) -> Managed:
    """Write the config, start the gateway pinned to ``cpus``, wait for ``GET /healthz`` 200.

    ``log_shim``: send its output through a pipe to a log shim (pinned to ``log_shim_cpus``),
    as under a container runtime, instead of straight into the log file; see
    ``ProcessSet.start``. ``store``: extra ``store:`` options of the policy.
    """
    config = workdir / f"gateway-{label}.yaml"
    config.write_text(config_yaml(api_key, backend_port, quotas=quotas,
                                  spool_dir=workdir / f"spool-{label}", store=store,
                                  data_dir=workdir / f"data-{label}"))
    cmd: Sequence[str] = command(template, config=config, port=port, backend_port=backend_port)
    managed = procs.start(f"gateway-{label}", pinned(cmd, cpus), workdir / f"gateway-{label}.log",
                          log_shim=log_shim, shim_cpus=log_shim_cpus)
    try:
        wait_http_ok(managed, port, health_path, timeout=ready_timeout)
    except BaseException:
        procs.stop(managed)
        raise
    return managed
