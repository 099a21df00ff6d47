"""``gateway usage export|reconcile`` as processes, on a SQLite file and on a real PostgreSQL:
export as CSV and JSON Lines gives back exactly the records in the database; reconcile is
quiet (exit 0) until a rollup is edited by hand, then names the tenant, hour, group and
counter with both figures (exit 1); bad arguments exit 2 with one line."""

from __future__ import annotations

import asyncio
import io
import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import pytest
import yaml

from gateway.ledger import LedgerSettings, decode_record
from gateway.ledger.export import parse_csv
from gateway.ledger.sql.postgres import PostgresLedger
from gateway.ledger.sql.sqlite import SqliteLedger
from tests.helpers import REPO, policy
from tests.ledger.usage_data import DAY, HOUR, sample_records

pytestmark = pytest.mark.process

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.ledger import UsageRecord
    from gateway.ledger.sql.store import SqlLedger

TODAY_MS = int(datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
               .timestamp() * 1000)
START_MS = TODAY_MS - 4 * DAY
FIRST_DAY = datetime.fromtimestamp(START_MS / 1000, UTC).strftime("%Y-%m-%d")
TODAY = datetime.fromtimestamp(TODAY_MS / 1000, UTC).strftime("%Y-%m-%d")


class Cli:
    def __init__(self, config: Path, env: dict[str, str], url: str,
                 records: list[UsageRecord]) -> None:
        self.config, self.env, self.url, self.records = config, env, url, records

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "usage", *args[:1], "--config", str(self.config),
             *args[1:]], capture_output=True, text=True, cwd=REPO, env=self.env, timeout=120,
            check=False)

    def execute(self, sql: str) -> None:
        if self.url.startswith("sqlite:///"):
            with sqlite3.connect(self.url[len("sqlite:///"):]) as conn:
                conn.execute(sql)
            return

        async def run() -> None:
            conn = await asyncpg.connect(self.url)
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        asyncio.run(run())


async def _seed(ledger: SqlLedger, records: Sequence[UsageRecord]) -> None:
    await ledger.start()
    try:
        for r in records:
            ledger.write_nowait(r)
        await ledger.flush()
    finally:
        await ledger.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    data = policy({"chat": ["http://127.0.0.1:9"]})
    data["store"] = {"spool_dir": str(tmp_path / "spool"), "data_dir": str(tmp_path / "data")}
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_LEDGER_URL"}
    records = sample_records(700, ("acme", "globex"), seed=31, start=START_MS, days=4)
    ledger: SqlLedger
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
        env["GATEWAY_LEDGER_URL"] = url
        ledger = PostgresLedger(url, spool_dir=tmp_path / "seed", migrate=True,
                                settings=LedgerSettings())
    else:
        path = tmp_path / "data" / "ledger.db"
        url = f"sqlite:///{path}"
        ledger = SqliteLedger(path, spool_dir=tmp_path / "seed")
    asyncio.run(_seed(ledger, records))
    return Cli(config, env, url, records)


def _sorted(records: Sequence[UsageRecord]) -> list[UsageRecord]:
    return sorted(records, key=lambda r: (r.tenant, r.ts_ms, r.request_id))


def test_export_csv_and_jsonl_give_back_the_records_exactly(cli: Cli) -> None:
    out = cli.run("export", "--from", FIRST_DAY, "--to", TODAY, "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert list(parse_csv(io.StringIO(out.stdout))) == _sorted(cli.records)
    out = cli.run("export", "--from", FIRST_DAY, "--to", TODAY)  # jsonl by default
    assert out.returncode == 0, out.stderr
    assert [decode_record(line) for line in out.stdout.splitlines()] == _sorted(cli.records)
    lo, hi = START_MS + DAY + 3 * HOUR, START_MS + 2 * DAY + 30 * 60_000
    frm = datetime.fromtimestamp(lo / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    to = datetime.fromtimestamp(hi / 1000 + 3600, UTC).strftime("%Y-%m-%dT%H:%M:%S+01:00")
    out = cli.run("export", "--from", frm, "--to", to, "--tenant", "globex")
    assert out.returncode == 0, out.stderr
    assert [decode_record(line) for line in out.stdout.splitlines()] == _sorted(
        [r for r in cli.records if r.tenant == "globex" and lo <= r.ts_ms < hi])


def test_export_into_a_closed_pipe_ends_quietly(cli: Cli) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "usage", "export", "--config", str(cli.config),
         "--from", FIRST_DAY, "--to", TODAY, "--format", "csv"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=cli.env)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"request_id,ts_ms,tenant,")
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_reconcile_reports_a_hand_made_drift_with_both_figures(cli: Cli) -> None:
    clean = cli.run("reconcile")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "consistent" in clean.stdout and "x 2 tenants" in clean.stdout
    victim = next(r for r in cli.records if r.tenant == "acme" and r.history > 0)
    hour = victim.ts_ms - victim.ts_ms % HOUR
    cli.execute(
        f"UPDATE usage_hourly SET history = history - 1 WHERE tenant = 'acme' AND "
        f"hour_ms = {hour} AND model = '{victim.model}' AND request_class = "
        f"'{victim.request_class}' AND key_id = '{victim.key_id or ''}' AND version = "
        f"'{victim.version or ''}' AND batch_id = '{victim.batch_id or ''}' AND team = "
        f"'{victim.team or ''}' AND organization = '{victim.organization or ''}'")
    drift = cli.run("reconcile", "--from", FIRST_DAY, "--to", TODAY)
    assert drift.returncode == 1, drift.stdout + drift.stderr
    (line,) = [ln for ln in drift.stdout.splitlines() if ln.startswith("acme ")]
    summed = sum(r.history for r in cli.records if r.tenant == "acme" and
                 r.ts_ms - r.ts_ms % HOUR == hour and
                 (r.model, r.request_class, r.key_id, r.version, r.batch_id, r.team,
                  r.organization) == (victim.model, victim.request_class, victim.key_id,
                                      victim.version, victim.batch_id, victim.team,
                                      victim.organization))
    hour_text = datetime.fromtimestamp(hour / 1000, UTC).strftime("%Y-%m-%dT%H:00:00Z")
    assert line.startswith(f"acme {hour_text} key_id={victim.key_id or ''!r} "
                           f"model={victim.model!r}"), line
    assert f"history rollup={summed - 1} records={summed} (diff -1)" in line, line
    assert "drift: 1 counters differ in 1 (tenant, day)" in drift.stdout
    day = datetime.fromtimestamp(hour / 1000, UTC).strftime("%Y-%m-%d")
    assert cli.run("reconcile", "--tenant", "globex").returncode == 0
    assert cli.run("reconcile", "--tenant", "acme", "--day", day).returncode == 1
    old = cli.run("reconcile", "--tenant", "globex", "--from", "2000-01-01", "--to", TODAY)
    assert old.returncode == 0 and "past retention" in old.stderr, old.stderr


@pytest.mark.parametrize("args", [
    ("export", "--from", "yesterday", "--to", "2024-01-01"),
    ("export", "--from", "2024-01-02", "--to", "2024-01-01"),
    ("reconcile", "--from", "May 1"),
    ("reconcile", "--day", "2024-01-01", "--from", "2024-01-01"),
    ("reconcile", "--from", "2024-01-02", "--to", "2024-01-01"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    data = policy({"chat": ["http://127.0.0.1:9"]})
    data["store"] = {"spool_dir": str(tmp_path / "spool"), "data_dir": str(tmp_path / "data")}
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_LEDGER_URL"}
    out = subprocess.run([sys.executable, "-m", "gateway", "usage", args[0], "--config",
                          str(config), *args[1:]], capture_output=True, text=True, cwd=REPO,
                         env=env, timeout=120, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("gateway usage: ") and out.stderr.count("\n") == 1, out.stderr


def test_help_says_what_the_commands_do() -> None:
    for action, words in (("export", ("--format", "--tenant", "chunks", "exclusive")),
                          ("reconcile", ("--tenant", "--from", "--to", "--day", "Exit 0",
                                         "retention"))):
        out = subprocess.run([sys.executable, "-m", "gateway", "usage", action, "--help"],
                             capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
        text = " ".join(out.stdout.split())
        for word in words:
            assert word in text, (action, word)
