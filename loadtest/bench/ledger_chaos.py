"""Chaos for the usage ledger: kill, stop, freeze and starve it under load, then count.

``python -m loadtest.bench.ledger_chaos [--scenarios all] [--duration 20] [--clients 16]
[--durability auto]`` starts a simulated engine (``gateway.sim.server.SimServer``), real
``gateway serve`` processes and, for the PostgreSQL scenarios, a throwaway PostgreSQL
(``pgserver``: fsync on), puts ``--clients`` clients on them sending chat requests (every
third one streamed), does one harm per scenario and counts what the ledger kept:

==================  ==========================================================================
scenario            the harm
==================  ==========================================================================
sqlite-kill9        SIGKILL the gateway (SQLite ledger), restart it at once (a supervisor)
pg-kill9            the same on PostgreSQL
pg-crash            SIGKILL PostgreSQL (postmaster and backends), restart it after
                    ``--pg-kill-seconds`` (10)
pg-stop             stop PostgreSQL (fast shutdown), start it after ``--pg-stop-seconds`` (20)
pg-freeze           SIGSTOP PostgreSQL (postmaster and every child), SIGCONT after
                    ``--freeze-seconds`` (15)
pg-two-gateways     two gateways on one PostgreSQL sharing one spool directory (one host),
                    the clients alternating between them; one is SIGKILLed and its clients go
                    to the other (a load balancer's failover); the survivor adopts the dead
                    one's journal
disk-full           the SQLite ledger and the spool on a ``--tmpfs-size`` (64m) tmpfs, filled to
                    the last byte for ``--disk-full-seconds`` (10), then freed (needs root and
                    a kernel that lets it mount: skipped with a note otherwise). 64m, not the
                    2m of the end-to-end test: under 16 clients SQLite's WAL (checkpointed at
                    4 MB) and the process journal's segment (deleted whole, at 4 MiB) fill 2m
                    by themselves within a second, and freeing the ballast then frees nothing
==================  ==========================================================================

The harm starts after a quarter of ``--duration`` and the load runs until ``--duration`` has
passed and at least a quarter of it after the harm ended. Then the clients stop (each finishes
the request it is in), every gateway still alive gets SIGTERM (it drains), and a ledger is
opened on the same database and each spool directory (``gateway.ledger.sql.open_ledger``):
it replays every spool segment and every dead process's journal, and its export gives the
records. Per scenario:

* **answered**: responses a client read to the end with status 200 (a stream: ended with
  ``data: [DONE]``); each client keeps the gateway's ``x-request-id`` of each;
* **recorded**: rows in ``usage_records`` for the tenant once everything is replayed;
* **in spool**: records still in a spool file that the replay could not store (the database
  refused them: a disk still full); kept, so not lost, but not in the database either;
* **lost**: answered request ids with no record, stored or spooled (the promise of every
  durability mode but ``buffered``: must be 0);
* **doubled**: request ids with more than one row (``SELECT request_id, count(*) ... GROUP BY
  request_id HAVING count(*) > 1`` on the database itself: must be 0);
* **interrupted**: records whose outcome is ``interrupted`` (0 while the gateway has no such
  outcome); **unfinished**: ``cancelled`` or ``failed`` records of requests no client read to
  the end (a cut stream, a 503);
* **errors**: what clients saw instead of an answer: ``503 usage_not_recorded`` (a record
  neither the database nor the spool could take within ``store.ledger_timeout``), a stream
  that ended without ``[DONE]`` (its error event's code), ``connect`` (refused: the gateway was
  down), ``cut`` (the connection died mid-response), ``timeout`` (30 s).

The JSON (``--out``) has every figure, the first lost and doubled ids with how their clients
saw them, records whose request id no client saw (``unknown``), answered requests whose record
is not ``completed``, spool segments left unreplayed, the gateways' exit codes and the number
of tracebacks in their logs. The exit status is 1 when a scenario lost or doubled a record
(2 when one could not run to its end).

``--durability``: the policy's ``store.ledger_durability`` (``auto``, the default: ``process``
where the spool is on a local disk, which it is here; ``commit``, ``journal``, ``process``;
``buffered`` may lose the last ~50 ms on a SIGKILL by design).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.ledger.journal import journal_is_local
from gateway.ledger.record import decode_records
from gateway.ledger.sql import open_ledger, parse_ledger_url
from gateway.sim.server import SimServer
from loadtest.bench.pgserver import PostgresNotFound, PostgresServer, free_port

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "loadtest" / "results" / "ledger_chaos.json"
TENANT = "chaos"
MODEL = "chat-model"
#: the raw usage records (``gateway/ledger/sql/migrations.py``), one row per request id
USAGE_TABLE = "usage_records"
#: the order of ``--scenarios all``: the operator's list
SCENARIOS: dict[str, str] = {
    "sqlite-kill9": "SIGKILL the gateway (SQLite), restart it",
    "pg-kill9": "SIGKILL the gateway (PostgreSQL), restart it",
    "pg-crash": "SIGKILL PostgreSQL for {pg_kill_seconds:g} s, restart it",
    "pg-stop": "stop PostgreSQL for {pg_stop_seconds:g} s, start it",
    "pg-freeze": "SIGSTOP PostgreSQL for {freeze_seconds:g} s, SIGCONT",
    "pg-two-gateways": "two gateways on one PostgreSQL, one SIGKILLed",
    "disk-full": "SQLite + spool on a {tmpfs_size} tmpfs, full for {disk_full_seconds:g} s",
}
DURABILITY = ("auto", "commit", "journal", "process", "buffered")
CLIENT_TIMEOUT = 30.0
#: how long a stopping client may take to finish its request before it is abandoned
STOP_GRACE = CLIENT_TIMEOUT + 15.0
_CODE = re.compile(rb'"code"\s*:\s*"([^"]{1,64})"')


# -- what the clients saw (pure) ---------------------------------------------------------------


def error_code(body: bytes) -> str | None:
    """The first OpenAI-style error ``code`` in a body or an SSE error event, if any."""
    found = _CODE.search(body)
    return found.group(1).decode(errors="replace") if found else None


def response_kind(status: int, stream: bool, body: bytes) -> str | None:
    """None when the response is an answer (200, read to its end; a stream ended with
    ``[DONE]``), else what the client saw instead: ``503 usage_not_recorded``, ``stream
    without [DONE] (usage_not_recorded)``, ..."""
    if status == 200:
        if not stream or body.rstrip().endswith(b"data: [DONE]"):
            return None
        return f"stream without [DONE] ({error_code(body) or 'no error event'})"
    code = error_code(body)
    return f"{status} {code}" if code else str(status)


def transport_kind(exc: BaseException, headers_seen: bool) -> str:
    """A client-side failure: refused connection, timeout, or a connection cut."""
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return "cut mid-response" if headers_seen else "cut before headers"


@dataclass
class ClientLog:
    """Every request of a scenario's clients: the ids answered, every id seen (any response
    with headers) and what each failure was."""

    requests: int = 0
    answered: list[str] = field(default_factory=list)
    #: request id -> what its client saw (None: answered)
    seen: dict[str, str | None] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)

    def note(self, request_id: str | None, kind: str | None) -> None:
        self.requests += 1
        if request_id is not None:
            self.seen[request_id] = kind
        if kind is None and request_id is not None:
            self.answered.append(request_id)
        elif kind is not None:
            self.errors[kind] += 1


@dataclass
class Tally:
    """The counts of one scenario (see the module's doc)."""

    answered: int
    recorded: int
    #: records left in a spool file that no replay could store (not in ``recorded``)
    pending: int
    #: of them, records of answered requests
    pending_answered: int
    lost: int
    doubled: int
    interrupted: int
    unfinished: int
    unknown: int
    answered_not_completed: int
    #: the outcomes of the records of requests a client saw but did not get whole (a 503, a
    #: cut stream): ``completed`` there means billed for an answer the client never had
    unanswered_outcomes: dict[str, int]
    lost_ids: list[str]
    doubled_ids: dict[str, int]
    not_completed: dict[str, str]


def tally(log: ClientLog, rows: Iterable[tuple[str, str]], doubles: Mapping[str, int],
          pending: Iterable[str] = (), sample: int = 20) -> Tally:
    """Count a scenario: ``rows`` are the records (request id, outcome) the database holds once
    everything is replayed, ``doubles`` the ids it holds more than once (from a GROUP BY on
    the table itself; a repeated id among ``rows`` counts too), ``pending`` the ids of records
    a replay could not store (still in a spool file: kept, so not lost, but not recorded)."""
    rows = list(rows)
    per_id = Counter(rid for rid, _ in rows)
    doubled = {rid: n for rid, n in per_id.items() if n > 1}
    doubled.update({rid: n for rid, n in doubles.items() if n > 1})
    answered = set(log.answered)
    spooled = set(pending) - per_id.keys()
    lost = sorted(answered - per_id.keys() - spooled)
    outcome = dict(rows)
    not_completed = {rid: outcome[rid] for rid in sorted(answered & outcome.keys())
                     if outcome[rid] != "completed"}
    return Tally(
        answered=len(log.answered),
        recorded=len(rows),
        pending=len(spooled),
        pending_answered=len(spooled & answered),
        lost=len(lost),
        doubled=len(doubled),
        interrupted=sum(1 for _, o in rows if o == "interrupted"),
        unfinished=sum(1 for rid, o in rows if o in ("cancelled", "failed")
                       and rid not in answered),
        unknown=sum(1 for rid in per_id if rid not in log.seen),
        answered_not_completed=len(not_completed),
        unanswered_outcomes=dict(Counter(o for rid, o in rows
                                         if rid in log.seen and rid not in answered)),
        lost_ids=lost[:sample],
        doubled_ids=dict(sorted(doubled.items())[:sample]),
        not_completed=dict(list(not_completed.items())[:sample]),
    )


def errors_text(errors: Mapping[str, int]) -> str:
    """``503 usage_not_recorded 12, connect 40``: most frequent first; ``-`` for none."""
    ordered = sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{kind} {n}" for kind, n in ordered) or "-"


COLUMNS = ("scenario", "store", "load s", "answered", "recorded", "in spool", "lost", "doubled",
           "interrupted", "unfinished", "errors seen by clients")


def format_table(results: Sequence[Mapping[str, Any]]) -> str:
    """The printed table: one row per scenario (a skipped one says why)."""
    rows: list[list[str]] = []
    for r in results:
        if r.get("skipped") or r.get("failed"):
            why = f"skipped: {r['skipped']}" if r.get("skipped") else f"FAILED: {r['failed']}"
            rows.append([r["scenario"], r.get("store", ""), *["-"] * 8, why])
            continue
        rows.append([r["scenario"], r["store"], f"{r['load_seconds']:.0f}",
                     *(str(r[k]) for k in ("answered", "recorded", "pending", "lost",
                                           "doubled", "interrupted", "unfinished")),
                     errors_text(r["errors"])])
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c)
              for i, c in enumerate(COLUMNS)]
    numeric = set(range(2, len(COLUMNS) - 1))

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if i in numeric else c.ljust(w)
               for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(out).rstrip()

    return "\n".join([line(COLUMNS), line(["-" * w for w in widths]),
                      *(line(row) for row in rows)])


def exit_status(results: Iterable[Mapping[str, Any]]) -> int:
    """1 when any scenario lost or doubled a record, else 2 when one could not run to its
    end (it proved nothing), else 0; a skipped one (no root, no PostgreSQL) counts as none."""
    results = list(results)
    if any(r.get("lost", 0) or r.get("doubled", 0) for r in results):
        return 1
    return 2 if any(r.get("failed") for r in results) else 0


# -- the gateway --------------------------------------------------------------------------------


def policy(sim_url: str, key: str, *, data_dir: Path, spool_dir: Path,
           durability: str) -> dict[str, Any]:
    """One key of tenant ``chaos`` (limits far above the load), one pool with the simulator,
    ``chat-model`` priced, the ledger's files where the scenario wants them."""
    return {
        "server": {"drain_timeout": 10},
        "auth": {"keys": [{"id": "chaos", "tenant": TENANT,
                           "sha256": hashlib.sha256(key.encode()).hexdigest()}]},
        "pools": [{"name": "chat", "class": "interactive",
                   "backends": [{"name": "sim", "url": sim_url, "max_in_flight": 512}]}],
        "models": [{"name": MODEL, "pool": "chat", "backend_model": "sim-model"}],
        "plans": [{"name": "chaos", "limits": {"rpm": 100_000_000}}],
        "tenants": [{"name": TENANT, "plan": "chaos"}],
        "prices": {"models": {MODEL: {"input": "1", "output": "2"}}},
        "store": {"data_dir": str(data_dir), "spool_dir": str(spool_dir),
                  "ledger_durability": durability},
    }


class Gateway:
    """``gateway serve`` (one worker: one process) on a fixed port, restartable on it."""

    def __init__(self, workdir: Path, name: str, policy_data: dict[str, Any],
                 ledger_url: str | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / f"policy-{name}.yaml"
        self.config.write_text(yaml.safe_dump(policy_data))
        self.log_path = workdir / f"gateway-{name}.log"
        self.env = {k: v for k, v in os.environ.items() if k != "GATEWAY_LEDGER_URL"}
        self.env["PYTHONUNBUFFERED"] = "1"
        if ledger_url is not None:
            self.env["GATEWAY_LEDGER_URL"] = ledger_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_codes: list[int] = []

    def start(self, timeout: float = 60.0) -> Gateway:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(self.config),
                 "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                env=self.env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway {self.name} exited ({self.proc.returncode}) while "
                                   f"starting:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"gateway {self.name} not up in {timeout}s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL (the OOM killer, ``kill -9``): no drain, no flush."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.exit_codes.append(self.proc.wait())
        self.proc = None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: drain in-flight requests, flush the ledger; SIGKILL past ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return
        self.exit_codes.append(self.proc.returncode)
        self.proc = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


# -- the clients ----------------------------------------------------------------------------


class Load:
    """``clients`` clients on one event loop in a thread of their own, each with its own
    connection, sending chat requests back to back (every ``stream_every``-th streamed) to
    the URLs in ``targets`` in turn (``targets`` may be replaced while it runs: a load
    balancer taking a dead replica out)."""

    def __init__(self, targets: Sequence[str], clients: int, key: str, *,
                 stream_every: int = 3, max_tokens: int = 8) -> None:
        self.targets = list(targets)
        self.clients = clients
        self.headers = {"Authorization": f"Bearer {key}"}
        self.stream_every = stream_every
        self.max_tokens = max_tokens
        self.log = ClientLog()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(STOP_GRACE + 5)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        tasks = [asyncio.create_task(self._client(i)) for i in range(self.clients)]
        while not self._stop.is_set():
            await asyncio.sleep(0.05)
        done, pending = await asyncio.wait(tasks, timeout=STOP_GRACE)
        for task in pending:
            task.cancel()
            self.log.errors["abandoned at stop"] += 1
        for task in done:  # a client that died of something else than HTTP: a bug here
            if task.exception() is not None:
                self.log.errors[f"client crashed: {task.exception()!r}"] += 1

    async def _client(self, i: int) -> None:
        timeout = httpx.Timeout(CLIENT_TIMEOUT, connect=5.0)
        async with httpx.AsyncClient(headers=self.headers, timeout=timeout,
                                     limits=httpx.Limits(max_connections=1)) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                targets = self.targets
                url = targets[(i + n) % len(targets)]
                stream = n % self.stream_every == 0
                body = {"model": MODEL, "max_tokens": self.max_tokens, "stream": stream,
                        "messages": [{"role": "user", "content": f"client {i} request {n}"}]}
                rid, kind = await self._one(client, url, body, stream)
                self.log.note(rid, kind)
                if kind is not None:
                    await asyncio.sleep(0.05)  # no tight loop against a dead port

    async def _one(self, client: httpx.AsyncClient, url: str, body: dict[str, Any],
                   stream: bool) -> tuple[str | None, str | None]:
        rid: str | None = None
        headers_seen = False
        try:
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                headers_seen = True
                rid = r.headers.get("x-request-id")
                data = b"".join([chunk async for chunk in r.aiter_raw()])
        except httpx.HTTPError as exc:  # raised too when a response is cut short
            return rid, transport_kind(exc, headers_seen)
        kind = response_kind(r.status_code, stream, data)
        if kind is None and rid is None:
            kind = "200 without x-request-id"
        return rid, kind


# -- counting --------------------------------------------------------------------------------


@dataclass
class LedgerContents:
    rows: list[tuple[str, str]]
    doubles: dict[str, int]
    #: spool segments (and journals) still on disk after the replays
    unreplayed: int
    #: the request ids of the records in them (kept, not in the database: not lost)
    pending: list[str] = field(default_factory=list)


async def read_ledger(url: str, spools: Sequence[Path]) -> LedgerContents:
    """Replay each spool directory (its segments and any dead process's journal) into the
    database at ``url``, then read the tenant's records and the ids held twice."""
    left = 0
    rows: list[tuple[str, str]] = []
    pending: list[str] = []
    for i, spool in enumerate(spools):
        spool.mkdir(parents=True, exist_ok=True)
        ledger = open_ledger(url, spool_dir=spool, migrate=True)
        await ledger.start()
        try:
            for _ in range(40):
                await ledger.replay()
                if not _waiting(spool):
                    break
                await asyncio.sleep(0.5)
            left += _waiting(spool)
            pending += _spooled_ids(spool)
            if i == len(spools) - 1:
                rows = [(r.request_id, r.outcome)
                        async for r in ledger.export(0, 2**62, TENANT)]
        finally:
            await ledger.close()
    return LedgerContents(rows, await doubled_ids(url), left, pending)


def _waiting(spool: Path) -> int:
    return sum(1 for p in spool.glob("*.jsonl") if p.stat().st_size > 0)


def _spooled_ids(spool: Path) -> list[str]:
    """The request ids of the records still in a spool directory's segments and journals
    (torn lines skipped, as a replay skips them)."""
    ids: list[str] = []
    for path in sorted(spool.glob("*.jsonl")):
        with contextlib.suppress(FileNotFoundError):
            ids += [r.request_id for r in decode_records(path.read_bytes())[0]]
    return ids


async def doubled_ids(url: str) -> dict[str, int]:
    """Request ids with more than one row, asked of the database itself."""
    sql = (f"SELECT request_id, count(*) FROM {USAGE_TABLE} GROUP BY request_id "
           "HAVING count(*) > 1")
    parsed = parse_ledger_url(url)
    if parsed.dialect == "sqlite":
        with contextlib.closing(sqlite3.connect(parsed.target, timeout=30)) as db:
            return {str(rid): int(n) for rid, n in db.execute(sql)}
    import asyncpg

    conn = await asyncpg.connect(parsed.target, timeout=30)
    try:
        return {str(r[0]): int(r[1]) for r in await conn.fetch(sql)}
    finally:
        await conn.close()


# -- scenarios -------------------------------------------------------------------------------


@dataclass
class Options:
    duration: float = 20.0
    clients: int = 16
    durability: str = "auto"
    pg_kill_seconds: float = 10.0
    pg_stop_seconds: float = 20.0
    freeze_seconds: float = 15.0
    disk_full_seconds: float = 10.0
    tmpfs_size: str = "64m"
    restart_delay: float = 0.5
    speedup: float = 20.0
    max_tokens: int = 8


class Skip(Exception):
    """The scenario cannot run on this machine (no root for the tmpfs, no PostgreSQL)."""


@dataclass
class Stage:
    """What a scenario set up: the gateways the clients start on, the ledger to count, and
    the harm (blocking for as long as it lasts; it may change the load's targets)."""

    store: str
    url: str
    spools: list[Path]
    gateways: list[Gateway]
    harm: Callable[[Load], str]


def _fill(path: Path) -> int:
    """Write until the disk refuses one more byte; the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1 << 8, 1):
            with contextlib.suppress(OSError):
                while n := os.write(fd, b"\0" * size):
                    written += n
    finally:
        os.close(fd)
    return written


class Run:
    """All scenarios of one invocation: one simulator, one PostgreSQL (a database per
    scenario), a work directory."""

    def __init__(self, options: Options, workdir: Path) -> None:
        self.o = options
        self.workdir = workdir
        self.key = f"sk-gw-chaos-{secrets.token_hex(16)}"
        self.stack = contextlib.ExitStack()
        self.sim = self.stack.enter_context(
            SimServer("interactive", speedup=options.speedup, jitter=0.0))
        self._pg: PostgresServer | None = None
        self._databases = 0

    def close(self) -> None:
        self.stack.close()

    def pg(self) -> PostgresServer:
        if self._pg is None:
            try:
                server = PostgresServer()
            except PostgresNotFound as exc:
                raise Skip(str(exc)) from None
            self._pg = server
            self.stack.callback(server.close)
        if not self._pg.running:
            self._pg.start()
        return self._pg

    def pg_database(self) -> tuple[PostgresServer, str]:
        pg = self.pg()
        self._databases += 1
        url = pg.create_database(f"chaos_{self._databases}")
        asyncio.run(_migrate(url, self.workdir / f"migrate-{self._databases}"))
        return pg, url

    def gateway(self, sdir: Path, name: str, url: str | None, *, data_dir: Path,
                spool_dir: Path) -> Gateway:
        data = policy(self.sim.url, self.key, data_dir=data_dir, spool_dir=spool_dir,
                      durability=self.o.durability)
        return Gateway(sdir, name, data, ledger_url=url)

    # -- each scenario's stage ---------------------------------------------------------------

    def stage(self, name: str, sdir: Path, stack: contextlib.ExitStack) -> Stage:
        o = self.o
        if name in ("sqlite-kill9", "pg-kill9"):
            if name == "pg-kill9":
                store, (_, url) = "postgresql", self.pg_database()
                gw_url: str | None = url
            else:
                store, url = "sqlite", f"sqlite:///{sdir / 'data-a' / 'ledger.db'}"
                gw_url = None
            gw = self.gateway(sdir, "a", gw_url, data_dir=sdir / "data-a",
                              spool_dir=sdir / "spool-a")

            def kill_restart(load: Load) -> str:
                gw.kill()
                time.sleep(o.restart_delay)
                t = time.monotonic()
                gw.start()
                return f"gateway SIGKILLed, restarted ({time.monotonic() - t:.1f} s to healthy)"

            return Stage(store, url, [sdir / "spool-a"], [gw], kill_restart)

        if name in ("pg-crash", "pg-stop", "pg-freeze"):
            pg, url = self.pg_database()
            gw = self.gateway(sdir, "a", url, data_dir=sdir / "data-a",
                              spool_dir=sdir / "spool-a")

            def harm(load: Load) -> str:
                if name == "pg-crash":
                    pg.kill()
                    time.sleep(o.pg_kill_seconds)
                    pg.start()
                    return f"PostgreSQL SIGKILLed for {o.pg_kill_seconds:g} s, restarted"
                if name == "pg-stop":
                    pg.stop()
                    time.sleep(o.pg_stop_seconds)
                    pg.start()
                    return f"PostgreSQL stopped for {o.pg_stop_seconds:g} s, started"
                pg.signal_all(signal.SIGSTOP)
                try:
                    time.sleep(o.freeze_seconds)
                finally:
                    pg.signal_all(signal.SIGCONT)
                return f"PostgreSQL SIGSTOPped for {o.freeze_seconds:g} s, SIGCONT"

            stack.callback(pg.signal_all, signal.SIGCONT)  # never leave it frozen
            return Stage("postgresql", url, [sdir / "spool"], [gw], harm)

        if name == "pg-two-gateways":
            _, url = self.pg_database()
            spool = sdir / "spool"  # one host: one spool directory, as workers share one
            a = self.gateway(sdir, "a", url, data_dir=sdir / "data-a", spool_dir=spool)
            b = self.gateway(sdir, "b", url, data_dir=sdir / "data-b", spool_dir=spool)

            def kill_one(load: Load) -> str:
                b.kill()
                load.targets = [a.url]
                return "gateway b SIGKILLed; its clients moved to a"

            return Stage("postgresql", url, [spool], [a, b], kill_one)

        if name == "disk-full":
            mount = sdir / "tmpfs"
            mount.mkdir(parents=True)
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={o.tmpfs_size}",
                                   "tmpfs", str(mount)], capture_output=True, check=False)
            if done.returncode != 0:
                why = (done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}")
                raise Skip(f"cannot mount a tmpfs ({why}): needs root")
            stack.callback(subprocess.run, ["umount", "-l", str(mount)], check=False)
            url = f"sqlite:///{mount / 'data' / 'ledger.db'}"
            gw = self.gateway(sdir, "a", None, data_dir=mount / "data",
                              spool_dir=mount / "spool")
            ballast = mount / "ballast"

            def fill(load: Load) -> str:
                disk = os.statvfs(mount)
                used = (disk.f_blocks - disk.f_bfree) * disk.f_frsize
                size = _fill(ballast)
                try:
                    time.sleep(o.disk_full_seconds)
                finally:
                    ballast.unlink()
                return (f"tmpfs ({used} B in use) filled with {size} B of ballast for "
                        f"{o.disk_full_seconds:g} s, freed")

            stack.callback(lambda: ballast.unlink(missing_ok=True))
            return Stage("sqlite", url, [mount / "spool"], [gw], fill)

        raise ValueError(f"unknown scenario {name!r}")

    # -- one scenario -------------------------------------------------------------------------

    def scenario(self, name: str) -> dict[str, Any]:
        o = self.o
        sdir = self.workdir / name
        sdir.mkdir(parents=True)
        result: dict[str, Any] = {"scenario": name, "durability": o.durability,
                                  "clients": o.clients,
                                  "harm": SCENARIOS[name].format(**asdict(o))}
        with contextlib.ExitStack() as stack:
            try:
                stage = self.stage(name, sdir, stack)
            except Skip as exc:
                return result | {"store": "", "skipped": str(exc)}
            result["store"] = stage.store
            result["effective"] = _effective(o.durability, stage.spools[0])
            for gw in stage.gateways:
                stack.callback(gw.stop)
                gw.start()
            load = Load([gw.url for gw in stage.gateways], o.clients, self.key,
                        max_tokens=o.max_tokens)
            warmup = tail = max(1.0, o.duration / 4)
            t0 = time.monotonic()
            load.start()
            stack.callback(load.stop)
            time.sleep(warmup)
            h0 = time.monotonic()
            result["what_happened"] = stage.harm(load)
            h1 = time.monotonic()
            time.sleep(max(0.0, t0 + o.duration - h1, tail))
            load.stop()
            result["load_seconds"] = round(time.monotonic() - t0, 1)
            result["harm_window_s"] = [round(h0 - t0, 1), round(h1 - t0, 1)]
            for gw in stage.gateways:
                gw.stop()
            contents = asyncio.run(read_ledger(stage.url, stage.spools))
        counts = tally(load.log, contents.rows, contents.doubles, contents.pending)
        logs = [gw.log_text() for gw in stage.gateways]
        result |= {
            "requests": load.log.requests,
            **asdict(counts),
            "errors": dict(load.log.errors),
            "unreplayed_segments": contents.unreplayed,
            "gateway_exit_codes": {gw.name: gw.exit_codes for gw in stage.gateways},
            "tracebacks": sum(text.count("Traceback") for text in logs),
            "lost_seen_as": {rid: load.log.seen.get(rid) for rid in counts.lost_ids},
            "workdir": str(sdir),
        }
        return result


async def _migrate(url: str, spool: Path) -> None:
    """``gateway db migrate`` for a fresh database (a gateway refuses an empty one)."""
    ledger = open_ledger(url, spool_dir=spool, migrate=True)
    await ledger.start()
    await ledger.close()


def _effective(durability: str, spool: Path) -> str:
    """``auto`` resolved as the gateway resolves it (its spool directory's file system)."""
    if durability != "auto":
        return durability
    spool.mkdir(parents=True, exist_ok=True)
    return "process" if journal_is_local(str(spool)) else "commit"


# -- the command -----------------------------------------------------------------------------


def run(names: Sequence[str], options: Options, workdir: Path,
        progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """Run the scenarios one after another; their results, in order."""
    results: list[dict[str, Any]] = []
    chaos = Run(options, workdir)
    try:
        for name in names:
            progress(f"{name}: {SCENARIOS[name].format(**asdict(options))} ...")
            t = time.monotonic()
            try:
                result = chaos.scenario(name)
            except Exception as exc:  # the scenario could not run to its end: proves nothing
                result = {"scenario": name, "store": "", "failed": f"{type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}",
                          "detail": str(exc)}
            result["wall_seconds"] = round(time.monotonic() - t, 1)
            results.append(result)
            if result.get("skipped"):
                progress(f"{name}: skipped: {result['skipped']}")
            elif result.get("failed"):
                progress(f"{name}: FAILED: {result['detail']}")
            else:
                progress(f"{name}: answered {result['answered']} recorded {result['recorded']}"
                         f" lost {result['lost']} doubled {result['doubled']}")
    finally:
        chaos.close()
    return results


def parse_scenarios(text: str) -> list[str]:
    names = list(SCENARIOS) if text.strip() == "all" else [
        n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown scenario(s) {', '.join(unknown) or '(none)'}; choose from "
            f"{', '.join(SCENARIOS)} or all")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.ledger_chaos",
        description="Kill, stop, freeze and starve the usage ledger under load; count "
        "answered / recorded / lost / doubled / interrupted per scenario.")
    p.add_argument("--scenarios", type=parse_scenarios, default=list(SCENARIOS),
                   help=f"comma list of {', '.join(SCENARIOS)}, or all (default)")
    p.add_argument("--duration", type=float, default=20.0,
                   help="seconds of load per scenario, at least (20); the harm starts after a "
                   "quarter of it and a quarter of it follows the harm")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (16)")
    p.add_argument("--durability", choices=DURABILITY, default="auto",
                   help="store.ledger_durability of the gateways (auto)")
    p.add_argument("--pg-kill-seconds", type=float, default=10.0,
                   help="pg-crash: PostgreSQL stays dead this long (10)")
    p.add_argument("--pg-stop-seconds", type=float, default=20.0,
                   help="pg-stop: PostgreSQL stays stopped this long (20)")
    p.add_argument("--freeze-seconds", type=float, default=15.0,
                   help="pg-freeze: PostgreSQL stays SIGSTOPped this long (15)")
    p.add_argument("--disk-full-seconds", type=float, default=10.0,
                   help="disk-full: the tmpfs stays full this long (10)")
    p.add_argument("--tmpfs-size", default="64m",
                   help="disk-full: the tmpfs's size (64m: room for the ledger's own files, "
                   "so that the ballast is what fills it; at 2m the SQLite WAL and the "
                   "journal segment fill it by themselves within a second of load)")
    p.add_argument("--speedup", type=float, default=20.0,
                   help="the simulated engine's speed-up over real time (20)")
    p.add_argument("--max-tokens", type=int, default=8, help="output tokens a request (8)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the gateways' policies, logs, spools and SQLite files go "
                   "(default: a new directory under /tmp, kept for inspection)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results ({DEFAULT_OUT})")
    args = p.parse_args(argv)
    options = Options(
        duration=args.duration, clients=args.clients, durability=args.durability,
        pg_kill_seconds=args.pg_kill_seconds, pg_stop_seconds=args.pg_stop_seconds,
        freeze_seconds=args.freeze_seconds, disk_full_seconds=args.disk_full_seconds,
        tmpfs_size=args.tmpfs_size, speedup=args.speedup, max_tokens=args.max_tokens)
    workdir = args.workdir or Path(f"/tmp/ledger-chaos-{time.strftime('%Y%m%d-%H%M%S')}")
    workdir.mkdir(parents=True, exist_ok=True)

    def progress(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results = run(args.scenarios, options, workdir, progress)
    load = os.getloadavg()
    report = {"started": started, "options": asdict(options), "workdir": str(workdir),
              "load_average": [round(x, 2) for x in load], "scenarios": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    effective = next((r["effective"] for r in results if r.get("effective")), "")
    mode = f"{options.durability} ({effective})" if effective != options.durability else effective
    print(f"ledger chaos: durability {mode}, {options.clients} clients, "
          f"{options.duration:g} s of load a scenario (every 3rd request streamed); "
          f"load average {load[0]:.1f}")
    print(format_table(results))
    for r in results:
        extra = [r["what_happened"]] if r.get("what_happened") else []
        billed = (r.get("unanswered_outcomes") or {}).get("completed", 0)
        if billed:
            extra.append(f"{billed} requests no client got whole are recorded as completed")
        if r.get("answered_not_completed"):
            extra.append(f"{r['answered_not_completed']} answered requests recorded as not "
                         f"completed {r['not_completed']}")
        if r.get("unreplayed_segments"):
            extra.append(f"{r['unreplayed_segments']} spool segments left unreplayed")
        if r.get("tracebacks"):
            extra.append(f"{r['tracebacks']} tracebacks in the gateway logs")
        if r.get("lost"):
            extra.append(f"lost {r['lost_ids']} (clients saw {r['lost_seen_as']})")
        if r.get("doubled"):
            extra.append(f"doubled {r['doubled_ids']}")
        for line in extra:
            print(f"  {r['scenario']}: {line}")
    print(f"JSON: {args.out}; logs and ledgers: {workdir}")
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
