"""`gateway demo` starts two simulated pools and the gateway, prints a working key, and stops."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import openai

from tests.helpers import REPO, free_port, wait_http


def test_demo_serves_and_stops() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, text=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", timeout=30, proc=proc)  # type: ignore[arg-type]
        assert proc.stdout is not None
        banner = ""
        deadline = time.monotonic() + 10
        while "Ctrl-C" not in banner and time.monotonic() < deadline:
            banner += proc.stdout.readline()
        key = re.search(r"sk-gw-[A-Za-z0-9_-]{40,}", banner)
        assert key, banner
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key.group(0))
        for model, cls in (("demo-chat", "interactive"), ("demo-bulk", "batch")):
            raw = client.chat.completions.with_raw_response.create(
                model=model, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
            assert raw.headers["x-gateway-class"] == cls
            reply = raw.parse()
            assert reply.usage is not None and reply.usage.completion_tokens == 5
        assert len(client.embeddings.create(model="demo-embed", input="x").data) == 1
        assert f"curl -sN http://127.0.0.1:{port}/v1/chat/completions" in banner
        assert "from openai import OpenAI" in banner
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
