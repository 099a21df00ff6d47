"""The spool under disk faults: a batch is acknowledged only when all of it is written and
fsync'd, and a failed batch leaves no torn line for the next one to glue onto.

Two ways in: ``os.write`` and ``os.fsync`` replaced by versions that take a random part of
the data or fail with ENOSPC at a random offset (a property over many schedules), and a real
1 MiB tmpfs filled to the last byte (where the machine lets the test mount one).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.ledger import Spool
from gateway.ledger.record import decode_records, encode_lines
from gateway.ledger.sql.sqlite import SqliteLedger
from tests.helpers import tmpfs
from tests.process_marker import starts_process

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.ledger.conftest import RecordFactory

_real_write = os.write
_real_fsync = os.fsync


class FlakyDisk:
    """``os.write``/``os.fsync`` stand-ins driven by a seeded schedule: each write takes the
    whole buffer, a random part of it (a short write), or a random part and then ENOSPC."""

    def __init__(self, seed: int, fail_rate: float) -> None:
        self.rng = random.Random(seed)
        self.fail_rate = fail_rate
        self.failures = 0

    def write(self, fd: int, data: bytes | memoryview) -> int:
        roll = self.rng.random()
        if roll < self.fail_rate:  # room for part of it, then the disk is full
            part = self.rng.randrange(0, len(data))
            if part:
                _real_write(fd, bytes(data[:part]))
            self.failures += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        if roll < 2 * self.fail_rate:  # a short write: the caller must come back for the rest
            return _real_write(fd, bytes(data[: self.rng.randrange(1, len(data) + 1)]))
        return _real_write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.rng.random() < self.fail_rate / 4:
            self.failures += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        _real_fsync(fd)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        with mock.patch("os.write", self.write), mock.patch("os.fsync", self.fsync):
            yield


def _all_lines(directory: Path) -> tuple[list[str], int]:
    """Request ids of every record in every segment, and the lines that did not parse."""
    ids: list[str] = []
    bad = 0
    for path in sorted(directory.glob("spool-*.jsonl")):
        records, torn = decode_records(path.read_bytes())
        ids.extend(r.request_id for r in records)
        bad += torn
    return ids, bad


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), fail_rate=st.sampled_from([0.05, 0.2, 0.5]),
       segment=st.sampled_from([1500, 8000, 1 << 20]))
def test_short_writes_and_enospc_never_lose_an_acknowledged_record(
    tmp_path_factory: pytest.TempPathFactory, make_record: RecordFactory,
    seed: int, fail_rate: float, segment: int,
) -> None:
    directory = tmp_path_factory.mktemp("spool")
    spool = Spool(directory, max_segment_bytes=segment)
    disk = FlakyDisk(seed, fail_rate)
    acknowledged: list[str] = []
    rng = random.Random(seed)
    with disk.installed():
        for _ in range(40):
            batch = [make_record("t") for _ in range(rng.randrange(1, 6))]
            try:
                spool.append_sync(batch)
            except OSError as exc:
                assert exc.errno in (errno.ENOSPC, errno.EIO)
                continue
            acknowledged.extend(r.request_id for r in batch)
    spool.close()
    ids, bad = _all_lines(directory)
    # every acknowledged record once, nothing of a failed batch, no torn line anywhere
    assert sorted(ids) == sorted(acknowledged)
    assert bad == 0
    assert spool.appended == len(acknowledged)


@pytest.fixture
@starts_process
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (skipped where it cannot be mounted)."""
    with tmpfs(tmp_path, "1m") as mount:
        yield mount


def test_a_full_tmpfs_loses_no_acknowledged_record(
    tiny_disk: Path, make_record: RecordFactory
) -> None:
    """Fill a real 1 MiB disk until appends fail, free the space, append again: every
    acknowledged record reads back, and the first record after the space returns too."""
    spool = Spool(tiny_disk / "spool")
    ballast = tiny_disk / "ballast"
    acknowledged: list[str] = []
    failed = 0
    with ballast.open("wb") as f, contextlib.suppress(OSError):  # room for a few batches
        f.write(b"\0" * (1024 * 1024 - 24 * 1024))
    for _ in range(120):
        batch = [make_record("t") for _ in range(8)]
        try:
            spool.append_sync(batch)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            failed += 1
            continue
        acknowledged.extend(r.request_id for r in batch)
    assert failed > 0, "the disk never filled: the test proves nothing"
    ballast.unlink()  # space returns
    after = [make_record("t") for _ in range(8)]
    spool.append_sync(after)
    acknowledged.extend(r.request_id for r in after)
    spool.close()
    ids, bad = _all_lines(tiny_disk / "spool")
    assert sorted(ids) == sorted(acknowledged)
    assert bad == 0


async def test_replay_reports_what_it_could_not_parse(
    tmp_path: Path, make_record: RecordFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A segment with a torn line (and a line of garbage) is replayed: its whole records are
    stored, the skipped lines are counted, and one log line says so."""
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    records = [make_record("t-replay") for _ in range(5)]
    whole = encode_lines(records)
    (spool_dir / "spool-00000000000000000001-1.jsonl").write_bytes(
        whole + b"not json at all\n" + encode_lines([make_record("t-replay")])[:40])
    ledger = SqliteLedger(tmp_path / "ledger.db", spool_dir=spool_dir)
    caplog.set_level("INFO", logger="gateway.ledger.sql.store")
    await ledger.start()
    try:
        await ledger.replay()
        assert ledger.stats.replayed == 5
        assert ledger.stats.spool_bad_lines == 2
        lines = [r for r in caplog.records if "spool replayed" in r.getMessage()]
        assert len(lines) == 1
        assert "5 records (5 new, 0 duplicates), 2 lines skipped" in lines[0].getMessage()
        assert lines[0].levelname == "WARNING"
    finally:
        await ledger.close()
