"""Shadow comparison benchmark: what comparing shadow answers costs the primary.

``python -m loadtest.bench.shadow_bench [--requests 60] [--tokens 64]``

Two parts, each a ratio measured within one run:

- ``micro``: in-process costs of the pieces. Per chunk of a primary stream, the scanner alone
  against the scanner inside the comparison's ``Tap`` (the only work added on the primary's
  path while it streams); per shadow chunk, ``StreamCapture.feed``; off the path, reading a
  16 KB chat body and judging two 16 KB texts.
- ``http``: a real gateway, one primary and one shadow simulator (subprocesses); the same
  primary pool serves three public models: ``plain`` (no shadow), ``mirrored`` (every request
  mirrored, ``compare: false``: what mirroring cost before comparisons) and ``compared``
  (mirrored and compared). A sequential client takes them in turn, so all three see the same
  machine load; the table gives client TTFT and duration p50/p90 of each and the ratios
  compared / mirrored (the comparison's own cost) and mirrored / plain.

Prints markdown tables; the machine is shared, so read the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import yaml

from gateway.accounting import StreamScanner
from gateway.sim.server import spawn
from gateway.upstream.shadow_answer import TEXT_CAP, Answer, StreamCapture, Tap, read_body
from gateway.upstream.shadow_compare import judge

ROOT = Path(__file__).resolve().parents[2]
_MODELS = ("plain", "mirrored", "compared")


def _events(tokens: int) -> list[bytes]:
    """A chat stream as a backend writes it: one event per chunk."""
    out = [b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
           b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
           b'"finish_reason":null}]}\n\n']
    for i in range(tokens):
        event = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": {"content": f" word{i % 97}"},
                              "finish_reason": None if i < tokens - 1 else "stop"}]}
        out.append(b"data: " + msgspec.json.encode(event) + b"\n\n")
    out.append(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n'
               % tokens)
    out.append(b"data: [DONE]\n\n")
    return out


def _per_chunk_ns(make: Any, chunks: list[bytes], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        feed = make()
        t0 = time.perf_counter_ns()
        for chunk in chunks:
            feed(chunk)
        best = min(best, (time.perf_counter_ns() - t0) / len(chunks))
    return best


def _once_us(call: Any, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        call()
        best = min(best, (time.perf_counter_ns() - t0) / 1e3)
    return best


def micro(tokens: int) -> list[tuple[str, str]]:
    chunks = _events(tokens)
    scanner = _per_chunk_ns(lambda: StreamScanner(strip_usage=False).feed, chunks, 200)
    tapped = _per_chunk_ns(lambda: Tap(StreamScanner(strip_usage=False)).feed, chunks, 200)
    capture = _per_chunk_ns(lambda: StreamCapture().feed, chunks, 200)
    words = [f"w{i % 500}" for i in range(TEXT_CAP // 5)]
    a = " ".join(words)[:TEXT_CAP]
    b = " ".join(reversed(words))[:TEXT_CAP]
    body = msgspec.json.encode({"choices": [{"index": 0, "message": {"content": a},
                                             "finish_reason": "stop"}],
                                "usage": {"completion_tokens": len(words)}})
    pa, sa = Answer(status=200, ok=True, text=a), Answer(status=200, ok=True, text=b)
    return [
        ("primary chunk: scanner alone (ns)", f"{scanner:.0f}"),
        ("primary chunk: scanner in Tap (ns)", f"{tapped:.0f}"),
        ("Tap / scanner", f"{tapped / scanner:.3f}"),
        ("shadow chunk: StreamCapture.feed (ns)", f"{capture:.0f}"),
        ("read_body, 16 KB chat body (us, off the path)",
         f"{_once_us(lambda: read_body(body), 50):.0f}"),
        ("judge, two 16 KB texts (us, off the path)",
         f"{_once_us(lambda: judge(pa, sa, 0.9), 50):.0f}"),
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=20)[int(q * 20) - 1] if len(values) > 1 else values[0]


def http(requests: int, tokens: int) -> list[tuple[str, ...]]:
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            urls = []
            for _ in range(2):
                port = _free_port()
                procs.append(spawn(port, "interactive", "--speedup", "10", "--jitter", "0"))
                urls.append(f"http://127.0.0.1:{port}")
                _wait(urls[-1] + "/health", procs[-1])
            pools = [{"name": n, "backends": [{"name": n, "url": u, "max_in_flight": 64}]}
                     for n, u in zip(("chat", "shadow"), urls, strict=True)]
            models = [{"name": "plain", "pool": "chat", "backend_model": "sim-model"},
                      {"name": "mirrored", "pool": "chat", "backend_model": "sim-model",
                       "shadow": {"pool": "shadow", "share": 1.0, "compare": False}},
                      {"name": "compared", "pool": "chat", "backend_model": "sim-model",
                       "shadow": {"pool": "shadow", "share": 1.0}}]
            policy = {"auth": {"required": False}, "pools": pools, "models": models,
                      "store": {"data_dir": f"{tmp}/data", "spool_dir": f"{tmp}/spool"}}
            config = Path(tmp) / "policy.yaml"
            config.write_text(yaml.safe_dump(policy))
            port = _free_port()
            gw = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config",
                                   str(config), "--port", str(port)], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={**os.environ, "GATEWAY_ADMIN_TOKEN": "bench"})
            procs.append(gw)
            base = f"http://127.0.0.1:{port}"
            _wait(base + "/healthz", gw)
            times: dict[str, list[tuple[float, float]]] = {m: [] for m in _MODELS}
            with httpx.Client(timeout=60) as client:
                for i in range(requests * 3 + 6):
                    model = _MODELS[i % 3]
                    body = {"model": model, "stream": True, "max_tokens": tokens,
                            "messages": [{"role": "user", "content": f"question {i // 3}"}]}
                    t0 = time.perf_counter()
                    first = None
                    with client.stream("POST", base + "/v1/chat/completions",
                                       json=body) as r:
                        for _ in r.iter_raw():
                            first = first or time.perf_counter()
                    if i >= 6:  # the first two of each warm up
                        times[model].append(((first or t0) - t0, time.perf_counter() - t0))
            report = httpx.get(base + "/admin/shadow/compared",
                               headers={"Authorization": "Bearer bench"}).json()
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=20)
    rows: list[tuple[str, ...]] = []
    for name, index in (("TTFT", 0), ("duration", 1)):
        for q in (0.5, 0.9):
            plain, mirrored, compared = (_quantile([t[index] for t in times[m]], q) * 1e3
                                         for m in _MODELS)
            rows.append((f"client {name} p{int(q * 100)}", f"{plain:.1f}", f"{mirrored:.1f}",
                         f"{compared:.1f}", f"{compared / mirrored:.3f}",
                         f"{mirrored / plain:.3f}"))
    print("shadow report:", json.dumps({k: report[k] for k in ("compared", "agreement_rate")}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60, help="per model")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| micro | value |\n| --- | --- |")
    for name, value in micro(args.tokens):
        print(f"| {name} | {value} |")
    rows = http(args.requests, args.tokens)
    print("| http (ms) | plain | mirrored | compared | compared / mirrored | mirrored / plain |"
          "\n| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
