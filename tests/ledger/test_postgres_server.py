"""The tests' own PostgreSQL: it starts, keeps data across a restart, recovers from SIGKILL,
keeps the durability settings on, and a machine without it fails with the package to install."""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg
import pytest

from tests.ledger.postgres import PostgresNotFound, PostgresServer, find_bindir

TIMEOUT = 30.0


async def connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(url, timeout=TIMEOUT)


async def test_table_round_trip(postgres_url: str) -> None:
    conn = await connect(postgres_url)
    try:
        await conn.execute("CREATE TABLE t (id text PRIMARY KEY, n bigint NOT NULL)")
        await conn.executemany("INSERT INTO t VALUES ($1, $2)", [("a", 1), ("b", 2**40)])
        rows = await conn.fetch("SELECT id, n FROM t ORDER BY id")
        assert [tuple(r) for r in rows] == [("a", 1), ("b", 2**40)]
    finally:
        await conn.close()


async def test_each_test_gets_an_empty_database(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    """The database is new (no tables of an earlier test) and not the server's default one."""
    assert postgres_url != postgres_server.url
    conn = await connect(postgres_url)
    try:
        tables = await conn.fetchval(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        )
        assert tables == 0
    finally:
        await conn.close()


async def test_durability_settings_stay_on(postgres_url: str) -> None:
    """The durability tests count what survives a kill: the server must really sync."""
    conn = await connect(postgres_url)
    try:
        assert await conn.fetchval("SHOW fsync") == "on"
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
        assert await conn.fetchval("SHOW listen_addresses") == "127.0.0.1"
    finally:
        await conn.close()


def test_not_the_machine_postgres(postgres_server: PostgresServer) -> None:
    """Its own port and directory, and not running as root (PostgreSQL refuses to)."""
    assert postgres_server.port != 5432
    assert postgres_server.proc is not None
    status = Path(f"/proc/{postgres_server.proc.pid}/status").read_text()
    uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
    assert int(uid) != 0
    if os.geteuid() != 0:
        assert int(uid) == os.geteuid()
    assert postgres_server.data.is_relative_to(postgres_server.dir)


async def _count(url: str) -> int:
    conn = await connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM t"))
    finally:
        await conn.close()


async def _insert(url: str, ids: range) -> None:
    """Each row in its own transaction: every ``execute`` that returned is a commit."""
    conn = await connect(url)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY)")
        for i in ids:
            await conn.execute("INSERT INTO t VALUES ($1)", i)
    finally:
        await conn.close()


async def test_stop_and_start_keep_the_data(own_postgres: PostgresServer) -> None:
    port = own_postgres.port
    await _insert(own_postgres.url, range(100))
    own_postgres.stop()
    assert not own_postgres.running
    with pytest.raises(OSError):
        await connect(own_postgres.url)
    own_postgres.start()
    assert own_postgres.port == port
    assert await _count(own_postgres.url) == 100


async def test_kill_and_start_recover(own_postgres: PostgresServer) -> None:
    """SIGKILL (no shutdown checkpoint): the next start replays the WAL and every committed
    row is there."""
    await _insert(own_postgres.url, range(200))
    conn = await connect(own_postgres.url)  # a client left hanging by the crash
    own_postgres.kill()
    assert not own_postgres.running
    # how the dead server shows depends on where asyncpg was when the socket closed (an
    # InternalClientError when the close arrived between two protocol states)
    with pytest.raises((OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                        asyncpg.InternalClientError)):
        await conn.fetchval("SELECT 1")
    conn.terminate()
    own_postgres.start()
    assert "automatic recovery in progress" in own_postgres.log_text()
    assert await _count(own_postgres.url) == 200
    await _insert(own_postgres.url, range(200, 210))  # and it takes writes again
    assert await _count(own_postgres.url) == 210


@pytest.mark.process
def test_close_removes_the_directory() -> None:
    server = PostgresServer().start()
    directory = server.dir
    assert (directory / "data" / "PG_VERSION").is_file()
    server.close()
    assert not directory.exists()
    assert not server.running


def test_missing_binaries_name_the_package(tmp_path: Path) -> None:
    """A machine with no PostgreSQL: the error says what to install."""
    with pytest.raises(PostgresNotFound, match=r"install the package `postgresql`"):
        find_bindir(path=str(tmp_path), roots=[tmp_path])


def test_finds_the_debian_layout(tmp_path: Path) -> None:
    """Not on PATH, only under <root>/<version>/bin: the newest version is picked."""
    for version in ("13", "15"):
        bindir = tmp_path / version / "bin"
        bindir.mkdir(parents=True)
        for name in ("initdb", "postgres"):
            (bindir / name).write_text("")
    assert find_bindir(path=str(tmp_path / "empty"), roots=[tmp_path]) == tmp_path / "15" / "bin"
