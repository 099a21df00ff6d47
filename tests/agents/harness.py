"""The gateway the coding agents talk to, and how each agent is found, set up and run.

The gateway is ``gateway serve`` (a real process) on the demo's policy (``demo_policy`` of
``gateway demo``: model ``demo-chat`` on the interactive simulator), with the test key as the
demo key, the admin token (to read usage records) and, for the limit tests, two tenants per
agent: ``tight-<agent>`` (``rpm: 1``) and ``narrow-<agent>`` (``concurrency: 1``). The agents
reach it through a :class:`~tests.agents.proxy.RecordingProxy`, so a test sees every request
they made.

Agents are installed by ``deploy/agents/install-agents.sh`` (pinned versions, a cache outside
the tree); ``agent_binaries`` asks it what is installed (``--check``), or installs under CI.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.cli.demo import demo_policy
from gateway.sim.server import SimServer
from tests.agents.proxy import Exchange, RecordingProxy
from tests.helpers import REPO, TEST_KEY_SHA, GatewayProcess, wait_usage_records

INSTALL_SCRIPT = REPO / "deploy" / "agents" / "install-agents.sh"
ADMIN_TOKEN = "admin-agents-e2e"
MODEL = "demo-chat"
AGENTS = ("claude", "codex", "opencode", "aider")


def must_install() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("GATEWAY_AGENTS_INSTALL") == "1"


@dataclass(frozen=True)
class Installed:
    name: str
    binary: Path
    version: str


def agent_binaries(install: bool) -> tuple[dict[str, Installed], str]:
    """The agents installed in the cache (installing them first when ``install``), and the
    script's stderr (what an install said)."""
    args = ["bash", str(INSTALL_SCRIPT)] + ([] if install else ["--check"])
    proc = subprocess.run(args, capture_output=True, text=True, timeout=1800, check=False)
    found: dict[str, Installed] = {}
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            found[parts[0]] = Installed(parts[0], Path(parts[1]), parts[2])
    return found, proc.stderr


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def limit_key(kind: str, agent: str) -> str:
    """The key of tenant ``<kind>-<agent>``: ``tight`` (plan rpm 1) or ``narrow`` (plan
    concurrency 1); one per agent, so each agent's test starts from an empty window."""
    return f"sk-gw-{kind}-{agent}-" + sha(f"{kind}-{agent}")[:32]


def agents_policy(interactive_url: str, batch_url: str) -> dict[str, Any]:
    """The demo's policy with the test key as the demo key, plus the ``tight-*`` and
    ``narrow-*`` tenants."""
    data = demo_policy(interactive_url, batch_url, TEST_KEY_SHA)
    data["plans"] += [{"name": "tight", "limits": {"rpm": 1}},
                      {"name": "narrow", "limits": {"concurrency": 1}}]
    for kind in ("tight", "narrow"):
        for agent in AGENTS:
            tenant = f"{kind}-{agent}"
            data["auth"]["keys"].append(
                {"id": tenant, "sha256": sha(limit_key(kind, agent)), "tenant": tenant})
            data["tenants"].append({"name": tenant, "plan": kind})
    return data


@contextmanager
def demo_gateway(tmp: Path, speedup: float = 20.0) -> Iterator[GatewayProcess]:
    """The demo's two simulators (in this process) and ``gateway serve`` in front of them."""
    # as ``gateway demo`` runs them: answers end by themselves below a large max_tokens
    with SimServer("interactive", speedup=speedup, natural_length=True) as interactive, \
            SimServer("batch", speedup=speedup, natural_length=True) as batch, \
            admin_gateway(tmp, agents_policy(interactive.url, batch.url)) as gateway:
        yield gateway


@contextmanager
def admin_gateway(tmp: Path, data: dict[str, Any]) -> Iterator[GatewayProcess]:
    """``gateway serve`` on ``data``, with the admin token (for the usage export) in its
    environment only."""
    gateway = GatewayProcess(tmp, data)
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN_TOKEN
    try:
        gateway.start()
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)
    try:
        yield gateway
    finally:
        gateway.stop()


def usage_records(gw: GatewayProcess, request_ids: set[str], timeout: float = 15.0
                  ) -> dict[str, dict[str, Any]]:
    """The usage records of ``request_ids`` from the admin export; polled until all are there
    (a record may reach the ledger just after its answer) or ``timeout``."""
    rows = wait_usage_records(
        gw.url, ADMIN_TOKEN, lambda rows: {row.get("request_id") for row in rows} >= request_ids,
        within=timeout, every=0.2)
    return {row["request_id"]: row for row in rows if row.get("request_id") in request_ids}


# --- each agent: how it is pointed at the gateway ------------------------------------------
#
# These are the settings of README's "Coding agents" section, as the tests run them. Each run
# gets a HOME of its own (no user config, no login), the gateway's URL, key and model and the
# switches that keep the agent off every network but the gateway; nothing else is set.

#: what an agent is told besides the gateway, to keep the simulator's answers short: the
#: simulator answers exactly the request's output limit, and agents ask for 32,000 tokens
OUTPUT_LIMIT = 256
CONTEXT_WINDOW = 131_072


@dataclass
class AgentRun:
    argv: list[str]
    env: dict[str, str]


def _base_env(home: Path, path_dirs: list[Path]) -> dict[str, str]:
    node = shutil.which("node")  # Codex's launcher is a node script
    dirs = [str(d) for d in path_dirs] + ([str(Path(node).parent)] if node else [])
    dirs += ["/usr/local/bin", "/usr/bin", "/bin"]
    return {"HOME": str(home), "PATH": ":".join(dict.fromkeys(dirs)), "TERM": "dumb",
            "NO_COLOR": "1", "LANG": "C.UTF-8", "TMPDIR": str(home)}


def claude_run(binary: Path, base_url: str, key: str, prompt: str, home: Path,
               path_dirs: list[Path], tools: str) -> AgentRun:
    """Claude Code: ``claude -p`` with the gateway as its Anthropic endpoint (Messages)."""
    env = _base_env(home, path_dirs) | {
        "ANTHROPIC_BASE_URL": base_url,           # no /v1: it posts to /v1/messages
        "ANTHROPIC_AUTH_TOKEN": key,              # Authorization: Bearer (no login, no prompt)
        "ANTHROPIC_MODEL": MODEL,                 # the gateway's model for the main loop
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,   # ... and for its small background requests
        "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
        "CLAUDE_CODE_SUBAGENT_MODEL": MODEL,
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(CONTEXT_WINDOW),  # the model's context window
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, error reports, updates
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(OUTPUT_LIMIT),  # short simulator answers
    }
    argv = [str(binary), "-p", prompt, "--tools", tools]
    if tools:
        argv += ["--allowedTools", tools]  # run them without asking (print mode asks nobody)
    return AgentRun(argv, env)


def codex_config(base_url: str) -> str:
    """``$CODEX_HOME/config.toml``: the gateway as a model provider speaking Responses."""
    return f'''model = "{MODEL}"
model_provider = "gateway"
model_context_window = {CONTEXT_WINDOW}
check_for_update_on_startup = false
# the test's `sim` command is on PATH; a login shell would reset PATH from /etc/profile
allow_login_shell = false

[analytics]
enabled = false

[history]
persistence = "none"

# no plugin catalogue, apps or update checks from the network (api.github.com, chatgpt.com)
[features]
plugins = false
remote_plugin = false
apps = false
in_app_updates = false

[model_providers.gateway]
name = "llm-gateway"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "GATEWAY_API_KEY"
'''


def codex_run(binary: Path, base_url: str, key: str, prompt: str, home: Path,
              path_dirs: list[Path]) -> AgentRun:
    """Codex CLI: ``codex exec`` with ``CODEX_HOME`` holding the provider config."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url))
    env = _base_env(home, path_dirs) | {"CODEX_HOME": str(codex_home), "GATEWAY_API_KEY": key}
    argv = [str(binary), "exec", "--strict-config", "--skip-git-repo-check", "--ephemeral",
            "--color", "never", prompt]
    return AgentRun(argv, env)


def opencode_config(base_url: str) -> dict[str, Any]:
    """opencode's config: the gateway as an OpenAI-compatible provider (chat completions)."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "gateway": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "llm-gateway",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": "{env:GATEWAY_API_KEY}"},
                "models": {MODEL: {"name": MODEL, "limit": {"context": CONTEXT_WINDOW,
                                                            "output": OUTPUT_LIMIT}}},
            }
        },
        "model": f"gateway/{MODEL}",
        "small_model": f"gateway/{MODEL}",
        "autoupdate": False,
        "share": "disabled",
    }


def opencode_run(binary: Path, base_url: str, key: str, prompt: str, home: Path,
                 path_dirs: list[Path]) -> AgentRun:
    """opencode: ``opencode run`` with ``OPENCODE_CONFIG`` naming the config file."""
    config = home / "opencode.json"
    config.write_text(json.dumps(opencode_config(base_url), indent=2))
    env = _base_env(home, path_dirs) | {
        "OPENCODE_CONFIG": str(config),
        "GATEWAY_API_KEY": key,
        "OPENCODE_DISABLE_MODELS_FETCH": "1",     # no models.dev catalogue
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",  # no plugin installs from npm at start
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",      # read no ~/.claude settings
    }
    return AgentRun([str(binary), "run", prompt], env)


def aider_metadata() -> dict[str, Any]:
    """``.aider.model.metadata.json``: the model's window and prices, so aider fetches no
    model list from the web at start."""
    return {f"openai/{MODEL}": {
        "max_input_tokens": CONTEXT_WINDOW, "max_output_tokens": 32_768,
        "input_cost_per_token": 0.15e-6, "output_cost_per_token": 0.60e-6,
        "litellm_provider": "openai", "mode": "chat"}}


def aider_run(binary: Path, base_url: str, key: str, prompt: str, home: Path,
              path_dirs: list[Path]) -> AgentRun:
    """aider: ``aider --message`` with the gateway as its OpenAI endpoint (chat completions)."""
    metadata = home / ".aider.model.metadata.json"
    metadata.write_text(json.dumps(aider_metadata(), indent=2))
    env = _base_env(home, path_dirs) | {
        "OPENAI_API_BASE": f"{base_url}/v1",
        "OPENAI_API_KEY": key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",   # litellm: no price list from the web
    }
    argv = [str(binary), "--model", f"openai/{MODEL}", "--model-metadata-file", str(metadata),
            "--no-git", "--yes-always", "--analytics-disable", "--no-check-update",
            "--no-show-model-warnings", "--no-show-release-notes", "--no-pretty",
            "--no-fancy-input", "--message", prompt]
    return AgentRun(argv, env)


def agent_run(name: str, binary: Path, base_url: str, key: str, prompt: str, home: Path,
              path_dirs: list[Path], *, tools: bool) -> AgentRun:
    """The command and environment that run agent ``name`` once on ``prompt``. ``tools``:
    offer tools (only Claude Code can be run with none; the others always offer theirs, and
    aider offers none)."""
    if name == "claude":
        return claude_run(binary, base_url, key, prompt, home, path_dirs,
                          "Bash" if tools else "")
    if name == "codex":
        return codex_run(binary, base_url, key, prompt, home, path_dirs)
    if name == "opencode":
        return opencode_run(binary, base_url, key, prompt, home, path_dirs)
    if name == "aider":
        return aider_run(binary, base_url, key, prompt, home, path_dirs)
    raise ValueError(name)


# --- running an agent, and reading what it exchanged ----------------------------------------


@dataclass(repr=False)
class Finished:
    """One agent run: its exit status (None: stopped by the test), output and requests."""

    name: str
    returncode: int | None
    stdout: str
    stderr: str
    exchanges: list[Exchange]
    seconds: float
    stopped: str | None = None

    def __repr__(self) -> str:
        return f"<{self.name}: exit {self.returncode}, {len(self.exchanges)} requests>"

    def report(self, limit: int = 1500) -> str:
        """What a failure message shows: the exit, the output's tail and every request."""
        lines = [f"{self.name}: exit {self.returncode} after {self.seconds:.1f} s"
                 + (f" (stopped: {self.stopped})" if self.stopped else "")]
        lines += [f"  #{i} {describe(ex)}" for i, ex in enumerate(self.exchanges[:40])]
        if len(self.exchanges) > 40:
            lines.append(f"  ... {len(self.exchanges) - 40} more requests")
        lines.append("--- stdout (tail) ---\n" + self.stdout[-limit:])
        lines.append("--- stderr (tail) ---\n" + self.stderr[-limit:])
        return "\n".join(lines)


def run_agent(name: str, run: AgentRun, proxy: RecordingProxy, workdir: Path, *,
              timeout: float, max_requests: int = 40,
              on_poll: Callable[[list[Exchange]], None] | None = None) -> Finished:
    """Run the agent to its end in ``workdir`` (no stdin), or stop it (its whole process
    group) after ``timeout`` seconds or once it has made more than ``max_requests`` requests
    (an agent in a loop). ``on_poll`` sees the requests so far, every 0.1 s."""
    proxy.clear()
    out, err = workdir / f".{name}.stdout", workdir / f".{name}.stderr"
    started = time.monotonic()
    stopped = None
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(run.argv, cwd=workdir, env=run.env, stdin=subprocess.DEVNULL,
                                stdout=fo, stderr=fe, start_new_session=True)
        try:
            while proc.poll() is None:
                if time.monotonic() - started > timeout:
                    stopped = f"still running after {timeout:.0f} s"
                elif len(proxy.snapshot()) > max_requests:
                    stopped = f"more than {max_requests} requests"
                if stopped:
                    break
                if on_poll is not None:
                    on_poll(proxy.snapshot())
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # a process it left in its group (a tool's child) goes too
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return Finished(name, None if stopped else proc.returncode,
                    out.read_text(errors="replace"), err.read_text(errors="replace"),
                    proxy.snapshot(), time.monotonic() - started, stopped)


API_OF_PATH = {"/v1/messages": "messages", "/v1/responses": "responses",
               "/v1/chat/completions": "chat"}


def api_of(ex: Exchange) -> str | None:
    return API_OF_PATH.get(ex.path.split("?", 1)[0])


def sse_events(text: str) -> list[dict[str, Any]]:
    """The JSON ``data:`` payloads of an SSE body (``[DONE]`` and non-JSON left out)."""
    events = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                with contextlib.suppress(ValueError):
                    events.append(json.loads(data))
    return events


def _payloads(ex: Exchange) -> list[dict[str, Any]]:
    text = ex.answer_text()
    if ex.answer_headers.get("content-type", "").startswith("text/event-stream"):
        return sse_events(text)
    try:
        body = json.loads(text)
    except ValueError:
        return []
    return [body] if isinstance(body, dict) else []


def answer_text(ex: Exchange) -> str:
    """The text the answer carried (streamed deltas joined, or the whole answer's text)."""
    api, parts = api_of(ex), []
    for ev in _payloads(ex):
        if api == "messages":
            if ev.get("type") == "content_block_delta" and ev["delta"].get("type") == "text_delta":
                parts.append(ev["delta"]["text"])
            elif ev.get("type") == "message":
                parts += [b.get("text", "") for b in ev.get("content", []) if b["type"] == "text"]
        elif api == "responses":
            if ev.get("type") == "response.output_text.delta":
                parts.append(ev["delta"])
            elif ev.get("object") == "response":
                parts.append(ev.get("output_text") or "")
        elif api == "chat":
            for choice in ev.get("choices") or []:
                content = (choice.get("delta") or choice.get("message") or {}).get("content")
                if content:
                    parts.append(content)
    return "".join(parts)


def answer_end(ex: Exchange) -> str | None:
    """Why the answer ended: Messages' ``stop_reason``, Responses' ``status``, chat's
    ``finish_reason``."""
    api, end = api_of(ex), None
    for ev in _payloads(ex):
        if api == "messages":
            end = (ev.get("delta") or ev).get("stop_reason") or end
        elif api == "responses":
            resp = ev.get("response") if "response" in ev else ev
            if isinstance(resp, dict) and resp.get("status") not in (None, "in_progress"):
                end = resp["status"]
        elif api == "chat":
            for choice in ev.get("choices") or []:
                end = choice.get("finish_reason") or end
    return end


def describe(ex: Exchange) -> str:
    """One request in a line: what was sent and how it was answered."""
    body = ex.json()
    sent = ""
    if isinstance(body, dict):
        items = body.get("messages") or body.get("input") or []
        sent = (f" [{len(items) if isinstance(items, list) else 1} items, "
                f"{len(body.get('tools') or [])} tools]")
    head = f"{ex.method} {ex.path}{sent} -> {ex.status}"
    if ex.status != 200:
        return f"{head} {ex.answer_text()[:300]!r}"
    calls = answer_calls(ex)
    text = answer_text(ex)
    what = f"calls {calls}" if calls else f"text {text[:40]!r}... ({len(text.split())} words)"
    return f"{head} {what}, ended {answer_end(ex)}"


def answer_calls(ex: Exchange) -> list[str]:
    """Names of the tools the answer called."""
    api, names = api_of(ex), []
    for ev in _payloads(ex):
        if api == "messages" and ev.get("type") == "content_block_start":
            if ev["content_block"].get("type") == "tool_use":
                names.append(ev["content_block"]["name"])
        elif api == "responses" and ev.get("type") == "response.output_item.added":
            if ev["item"].get("type") == "function_call":
                names.append(ev["item"]["name"])
        elif api == "chat":
            for choice in ev.get("choices") or []:
                for call in (choice.get("delta") or choice.get("message") or {}).get(
                        "tool_calls") or []:
                    name = (call.get("function") or {}).get("name")
                    if name:
                        names.append(name)
    return names


def answer_usage(ex: Exchange) -> dict[str, int]:
    """The usage the answer reported at its end, in the record's terms: ``prompt`` (all input
    tokens, cached ones included), ``output``, ``cached``, ``cache_write``, ``reasoning``; only
    the figures the answer gave, and none for an answer cut short (the agent stopped)."""
    api, usage, ended = api_of(ex), {}, False
    for ev in _payloads(ex):
        kind = ev.get("type")
        if api == "messages":
            u = (ev.get("message") or {}).get("usage") if kind == "message_start" else (
                ev.get("usage"))
            if isinstance(u, dict):
                usage.update({k: v for k, v in u.items() if isinstance(v, int)})
            ended = ended or kind in ("message_delta", "message")
        elif api == "responses":
            resp = ev.get("response") if "response" in ev else ev
            if isinstance(resp, dict) and isinstance(resp.get("usage"), dict):
                usage, ended = resp["usage"], True
        elif api == "chat" and isinstance(ev.get("usage"), dict):
            usage, ended = ev["usage"], True
    if not ended:
        return {}
    if api == "messages":
        read = usage.get("cache_read_input_tokens", 0)
        write = usage.get("cache_creation_input_tokens", 0)
        return {"prompt": usage.get("input_tokens", 0) + read + write,
                "output": usage.get("output_tokens", 0), "cached": read, "cache_write": write}
    if api == "responses":
        return {"prompt": usage.get("input_tokens", 0), "output": usage.get("output_tokens", 0),
                "cached": (usage.get("input_tokens_details") or {}).get("cached_tokens", 0),
                "reasoning": (usage.get("output_tokens_details") or {}).get(
                    "reasoning_tokens", 0)}
    return {"prompt": usage.get("prompt_tokens", 0),
            "output": usage.get("completion_tokens", 0),
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "reasoning": (usage.get("completion_tokens_details") or {}).get(
                "reasoning_tokens", 0)}


def tool_results(ex: Exchange) -> list[str]:
    """The tool results the request sent back (their text), in its API's shape."""
    body, api, out = ex.json(), api_of(ex), []
    if not isinstance(body, dict):
        return out

    def text(value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return "".join(text(v.get("text", "") if isinstance(v, dict) else v) for v in value)
        return json.dumps(value)

    if api == "messages":
        for message in body.get("messages", []):
            if isinstance(message.get("content"), list):
                out += [text(b.get("content", "")) for b in message["content"]
                        if b.get("type") == "tool_result"]
    elif api == "responses" and isinstance(body.get("input"), list):
        out += [text(item.get("output", "")) for item in body["input"]
                if item.get("type") in ("function_call_output", "custom_tool_call_output")]
    elif api == "chat":
        out += [text(m.get("content", "")) for m in body.get("messages", [])
                if m.get("role") == "tool"]
    return out


def chat_request(gw: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": MODEL, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "Say hello"}]})


def fill_rpm(gw: GatewayProcess, key: str) -> httpx.Response:
    """Use up an ``rpm: 1`` key's minute; the refusal that shows it is full."""
    for _ in range(3):
        r = chat_request(gw, key)
        if r.status_code == 429:
            return r
        assert r.status_code == 200, r.text
    raise AssertionError(f"{key[:20]}... is never refused")


class Holder:
    """Holds a ``concurrency: 1`` key's only slot: a request the simulator stalls for 15 s
    (its ``x-sim-stall-ms``, which the gateway forwards) on a raw socket, until :meth:`release`
    closes it (the gateway then cancels it and frees the slot at once)."""

    def __init__(self, gw: GatewayProcess, key: str) -> None:
        self.gw, self.key = gw, key
        self.sock: socket.socket | None = None

    def __enter__(self) -> Holder:
        body = json.dumps({"model": MODEL, "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hold"}]}).encode()
        self.sock = socket.create_connection(("127.0.0.1", self.gw.port), timeout=10)
        self.sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: Bearer {self.key}\r\n".encode()
            + b"x-sim-stall-ms: 15000\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 10
        while chat_request(self.gw, self.key).status_code != 429:  # admitted and holding
            assert time.monotonic() < deadline, "the holding request never took the slot"
            time.sleep(0.05)
        return self

    def release(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __exit__(self, *exc: object) -> None:
        self.release()
