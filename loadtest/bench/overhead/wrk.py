"""Run wrk with a POST Lua script and parse its ``--latency`` report.

wrk's text report is parsed for Requests/sec and the 50/90/99% latencies (as asked of any
wrk harness); the Lua ``done`` hook additionally prints exact microsecond percentiles and the
error counters, which take precedence when present because the text rounds (``1.28ms``).
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .procs import pinned

SUMMARY_TAG = "OVERHEAD_JSON "

_DONE_HOOK = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "\n%s{\"requests\":%.0f,\"duration_us\":%.0f,\"bytes\":%.0f,\"connect\":%.0f,\"read\":%.0f," ..
    "\"write\":%.0f,\"status\":%.0f,\"timeout\":%.0f,\"mean_us\":%.3f,\"max_us\":%.0f," ..
    "\"p50_us\":%.0f,\"p90_us\":%.0f,\"p99_us\":%.0f,\"p999_us\":%.0f}\n",
    "OVERHEAD_JSON ", summary.requests, summary.duration, summary.bytes, e.connect, e.read,
    e.write, e.status, e.timeout, latency.mean, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9)))
end
"""

_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_LAT_RE = re.compile(r"^\s*(50|75|90|99)%\s+([\d.]+)(us|ms|s|m|h)\s*$", re.M)
_RPS_RE = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_TOTAL_RE = re.compile(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m|h)", re.M)
_NON2XX_RE = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")
_SOCKET_RE = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")


@dataclass
class WrkResult:
    """One wrk run. Latencies in milliseconds; ``errors`` counts failed/non-2xx requests."""

    requests: int
    duration_s: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float | None = None
    mean_ms: float | None = None
    max_ms: float | None = None
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def lua_script(body: str, headers: dict[str, str]) -> str:
    """A wrk script sending ``body`` as a POST with ``headers``, plus the ``done`` hook."""
    level = 1
    while f"]{'=' * level}]" in body:
        level += 1
    eq = "=" * level
    lines = ['wrk.method = "POST"', f"wrk.body = [{eq}[{body}]{eq}]"]
    for name, value in headers.items():
        lines.append(f"wrk.headers[{json.dumps(name)}] = {json.dumps(value)}")
    return "\n".join(lines) + "\n" + _DONE_HOOK


def parse_output(text: str) -> WrkResult:
    """Parse wrk's ``--latency`` report (and the ``done`` hook line if present)."""
    lat = {m.group(1): float(m.group(2)) * _UNITS_MS[m.group(3)] for m in _LAT_RE.finditer(text)}
    rps_m = _RPS_RE.search(text)
    total_m = _TOTAL_RE.search(text)
    if not rps_m or not total_m or not {"50", "90", "99"} <= lat.keys():
        raise ValueError(f"cannot parse wrk output:\n{text}")
    errors: dict[str, int] = {}
    if m := _NON2XX_RE.search(text):
        errors["non2xx"] = int(m.group(1))
    if m := _SOCKET_RE.search(text):
        for key, value in zip(("connect", "read", "write", "timeout"), m.groups(), strict=True):
            errors[key] = int(value)
    result = WrkResult(
        requests=int(total_m.group(1)),
        duration_s=float(total_m.group(2)) * _UNITS_MS[total_m.group(3)] / 1e3,
        rps=float(rps_m.group(1)),
        p50_ms=lat["50"],
        p90_ms=lat["90"],
        p99_ms=lat["99"],
    )
    result.errors = {k: v for k, v in errors.items() if v}
    for line in text.splitlines():
        if line.startswith(SUMMARY_TAG):
            _apply_summary(result, json.loads(line[len(SUMMARY_TAG) :]))
    return result


def _apply_summary(result: WrkResult, s: dict[str, Any]) -> None:
    result.requests = int(s["requests"])
    result.duration_s = s["duration_us"] / 1e6
    if result.duration_s > 0:
        result.rps = result.requests / result.duration_s
    result.p50_ms = s["p50_us"] / 1e3
    result.p90_ms = s["p90_us"] / 1e3
    result.p99_ms = s["p99_us"] / 1e3
    result.p999_ms = s["p999_us"] / 1e3
    result.mean_ms = s["mean_us"] / 1e3
    result.max_ms = s["max_us"] / 1e3
    # wrk's "status" counter is responses >= 400; non2xx (text) also covers 3xx and 5xx.
    errors = {k: int(s[k]) for k in ("connect", "read", "write", "timeout", "status") if s[k]}
    if "non2xx" in result.errors:
        errors.pop("status", None)
        errors["non2xx"] = result.errors["non2xx"]
    result.errors = errors


def run(
    wrk_bin: str,
    url: str,
    script: Path,
    *,
    connections: int,
    duration_s: int,
    cpus: str | None,
    timeout_s: int = 10,
) -> WrkResult:
    """One wrk run on one thread (the client core), ``connections`` keep-alive connections."""
    cmd = pinned(
        [
            wrk_bin,
            "-t1",
            f"-c{connections}",
            f"-d{duration_s}s",
            f"--timeout={timeout_s}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        cpus,
    )
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=duration_s + timeout_s + 30, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr}\n{proc.stdout}")
    return parse_output(proc.stdout)
