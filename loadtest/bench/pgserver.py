"""A throwaway PostgreSQL server on a free loopback port, for the tests and the benchmarks.

Never the machine's own PostgreSQL (5432): ``initdb`` into a fresh temporary directory, then
``postgres`` on a free 127.0.0.1 port with its unix socket inside that directory, trust
authentication, and the durability defaults left alone (``fsync`` and ``synchronous_commit``
stay on: the ledger's durability tests kill the server and count what survived). ``stop`` is a
fast shutdown, ``kill`` SIGKILLs the postmaster and all its processes at once (a crash: the
next ``start`` runs WAL recovery), and ``start`` again reuses the port and the data.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` system user
(the Debian package creates it); otherwise as the current user. The binaries are looked up on
``PATH``, then through ``pg_config --bindir``, then under ``/usr/lib/postgresql/*/bin`` (where
Debian puts them); none found raises ``PostgresNotFound`` naming the package to install.

It lives here, not under ``tests/``, because ``loadtest.bench.ledger_drivers`` needs the same
server and ``loadtest`` does not import the tests; ``tests/ledger/postgres.py`` re-exports it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType

__all__ = ["PostgresError", "PostgresNotFound", "PostgresServer", "find_bindir", "free_port"]

DEBIAN_ROOT = Path("/usr/lib/postgresql")
#: the Debian (and Ubuntu) package with the server binaries
PACKAGE = "postgresql"
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class PostgresNotFound(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


class PostgresError(RuntimeError):
    """The server did not start, or an admin statement failed (with PostgreSQL's words)."""


def free_port() -> int:
    """A free loopback port (free now; the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _version_key(bindir: Path) -> tuple[int, ...]:
    """``/usr/lib/postgresql/15/bin`` -> (15,): the newest installed version wins."""
    return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name)) or (0,)


def find_bindir(path: str | None = None, roots: Iterable[Path] = (DEBIAN_ROOT,)) -> Path:
    """The directory holding ``initdb`` and ``postgres`` (and ``psql``, ``pg_isready``).

    ``path`` replaces ``PATH`` for the lookup and ``roots`` the Debian directory (the
    self-test uses both to show the error a bare machine gets).
    """
    candidates: list[Path] = []
    initdb = shutil.which("initdb", path=path)
    if initdb is not None:
        # /usr/local/bin/initdb may be a symlink into the real bindir, next to postgres
        candidates.append(Path(os.path.realpath(initdb)).parent)
    pg_config = shutil.which("pg_config", path=path)
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(Path(out.stdout.strip()))
    for root in roots:
        candidates += sorted(root.glob("*/bin"), key=_version_key, reverse=True)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    where = ", ".join(str(root / "*" / "bin") for root in roots) or "no other directory"
    raise PostgresNotFound(
        f"PostgreSQL server binaries (initdb, postgres) not found on PATH or under {where}: "
        f"install the package `{PACKAGE}` (Debian/Ubuntu: apt-get install {PACKAGE}; "
        "`make system-deps` does it)"
    )


def _clean_env() -> dict[str, str]:
    """The environment without ``PG*`` variables, so only our arguments pick the server."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _alive_in_group(pgid: int) -> bool:
    """Whether a process of this group still runs (zombies do not count: the container's
    PID 1 may never reap the orphaned backends, and a zombie holds no shared memory)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parens, so split after it
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _children(parent: int) -> list[int]:
    """Pids of the processes whose parent is ``parent`` (from /proc)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parens, so split after it
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
            found.append(int(entry.name))
    return found


class PostgresServer:
    """One PostgreSQL cluster in its own temporary directory, on one port for its lifetime."""

    def __init__(
        self,
        *,
        port: int | None = None,
        database: str = "gateway",
        user: str = "postgres",
        bindir: Path | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        for name in (database, user):
            if not _NAME.fullmatch(name):
                raise ValueError(f"not a plain SQL identifier: {name!r}")
        self.bindir = bindir or find_bindir()
        self.port = port or free_port()
        self.database = database
        self.user = user
        #: extra ``-c name=value`` settings after the defaults below
        self.settings = dict(settings or {})
        self.dir = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
        self.data = self.dir / "data"
        self.socket_dir = self.dir / "sock"
        self.log_path = self.dir / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._initialized = False
        # as root, initdb and postgres run as the postgres system user
        self._uid: int | None = None
        self._gid: int | None = None
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise PostgresNotFound(
                    "running as root, and there is no `postgres` system user to run "
                    f"PostgreSQL as (the package `{PACKAGE}` creates it)"
                ) from None
            self._uid, self._gid = account.pw_uid, account.pw_gid
        self.socket_dir.mkdir()
        if self._uid is not None and self._gid is not None:
            for directory in (self.dir, self.socket_dir):
                os.chown(directory, self._uid, self._gid)

    # -- addresses -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``postgresql://user@127.0.0.1:port/database`` (trust auth: no password)."""
        return self.url_for(self.database)

    def url_for(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- life cycle ------------------------------------------------------------------------

    @property
    def _extra_groups(self) -> list[int] | None:
        """As root, the child drops root's supplementary groups along with its uid."""
        return [] if self._uid is not None else None

    def _initdb(self) -> None:
        args = [str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust"]
        args += ["-U", self.user, "-E", "UTF8", "--locale=C", "--no-sync"]
        out = subprocess.run(
            args, capture_output=True, text=True, cwd=self.dir, env=_clean_env(), timeout=120,
            user=self._uid, group=self._gid, extra_groups=self._extra_groups,
        )
        if out.returncode != 0:
            raise PostgresError(f"initdb failed ({out.returncode}): {out.stderr or out.stdout}")

    def start(self, timeout: float = 60.0) -> PostgresServer:
        """Start the server (``initdb`` and the database on the first call); returns once it
        accepts connections."""
        if self.running:
            return self
        first = not self._initialized
        if first:
            self._initdb()
            self._initialized = True
        config = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.socket_dir),
            "max_connections": "100",
            "shared_buffers": "32MB",
            "logging_collector": "off",
            **self.settings,
        }
        args = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        for name, value in config.items():
            args += ["-c", f"{name}={value}"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.dir, env=_clean_env(),
                # its own process group: kill() takes the postmaster and its backends at once
                start_new_session=True,
                # as root: setuid in the child itself (no runuser in between, whose pid
                # would not be the postmaster's)
                user=self._uid, group=self._gid, extra_groups=self._extra_groups,
            )
        self.wait_ready(timeout)
        if first:
            self.create_database(self.database)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until ``pg_isready`` says the server accepts connections (recovery done)."""
        deadline = time.monotonic() + timeout
        args = [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)]
        args += ["-U", self.user, "-d", "postgres", "-t", "2"]
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise PostgresError(f"postgres exited while starting:\n{self.log_tail()}")
            if subprocess.run(args, env=_clean_env(), timeout=10).returncode == 0:
                return
            time.sleep(0.05)
        raise PostgresError(f"postgres on {self.port} not ready in {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 60.0) -> None:
        """Fast shutdown (SIGINT): clients are disconnected, a checkpoint is written."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test froze it
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return
        self.proc = None

    def kill(self) -> None:
        """SIGKILL to the postmaster and every backend: no shutdown checkpoint, no goodbye
        to clients; the next ``start`` recovers from the WAL."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None
        # the next postmaster refuses to start while an old backend is still attached to
        # the shared memory; SIGKILLed processes go within milliseconds
        deadline = time.monotonic() + 10
        while _alive_in_group(pgid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def signal_all(self, sig: signal.Signals) -> None:
        """A signal to the postmaster and each of its children (SIGSTOP / SIGCONT: a hung
        server). The children one by one: each backend and auxiliary process calls
        ``setsid`` at its start, so none is in the postmaster's process group."""
        if self.proc is not None:
            for pid in (self.proc.pid, *_children(self.proc.pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def close(self) -> None:
        """Stop the server and remove its directory (data, socket, log). A fast shutdown, not
        a kill: the postmaster reaps its backends (killed ones are orphans, and a container's
        PID 1 may leave them as zombies)."""
        self.stop(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- admin -----------------------------------------------------------------------------

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL with ``psql`` over TCP; returns unaligned, tuples-only output."""
        args = [str(self.bindir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
        args += ["-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", database]
        args += ["-c", sql]
        env = _clean_env() | {"PGCONNECT_TIMEOUT": "10"}
        out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
        if out.returncode != 0:
            raise PostgresError(f"psql failed on {sql!r}: {out.stderr.strip()}")
        return out.stdout

    def create_database(self, name: str, template: str = "template0") -> str:
        """A new, empty database; returns its URL."""
        if not (_NAME.fullmatch(name) and _NAME.fullmatch(template)):
            raise ValueError(f"not a plain SQL identifier: {name!r} / {template!r}")
        self.psql(f"CREATE DATABASE {name} TEMPLATE {template}")
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting whoever is still in it."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a plain SQL identifier: {name!r}")
        self.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def log_text(self) -> str:
        """The server's log so far (all starts)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])
