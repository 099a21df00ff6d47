"""The spool file: durable appends, rotation, locks between writer and replayers."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gateway.ledger import Spool
from gateway.ledger import spool as spool_module

if TYPE_CHECKING:
    from tests.ledger.conftest import RecordFactory


async def test_append_is_one_fsync_per_batch(tmp_path: Path, make_record: RecordFactory) -> None:
    """A batch costs one write + one fsync, whatever its size."""
    spool = Spool(tmp_path)
    await spool.append([make_record("t") for _ in range(100)])
    await spool.append([make_record("t") for _ in range(50)])
    assert (spool.appended, spool.fsyncs) == (150, 2)
    assert len(spool.read_all()) == 150


def test_rotates_by_size(tmp_path: Path, make_record: RecordFactory) -> None:
    spool = Spool(tmp_path, max_segment_bytes=2000)
    for _ in range(10):
        spool.append_sync([make_record("t") for _ in range(3)])
    assert len(spool.segment_paths()) > 3
    assert len(spool.read_all()) == 30


def test_active_segment_cannot_be_claimed(tmp_path: Path, make_record: RecordFactory) -> None:
    """A segment still being written is locked: no replayer takes it until it is sealed."""
    writer = Spool(tmp_path)
    writer.append_sync([make_record("t")])
    replayer = Spool(tmp_path)
    assert list(replayer.claims()) == []
    writer.rotate()
    (claim,) = list(replayer.claims())
    assert len(claim.records) == 1
    assert list(Spool(tmp_path).claims()) == []  # claimed: a second replayer skips it
    claim.done()
    assert writer.segment_paths() == []


def test_a_new_segment_is_never_claimed_before_its_lock(
    tmp_path: Path, make_record: RecordFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replayer that runs between a segment's creation and its lock finds nothing to take.

    The replay is run at the worst instant: inside the writer's blocking ``flock``, before
    the lock is taken. Had it found the new (empty) segment, it would have deleted it, and
    the record appended next would have gone to an unlinked file.
    """
    writer, replayer = Spool(tmp_path), Spool(tmp_path)
    real_flock = fcntl.flock
    taken: list[int] = []

    def replay_first(fd: int, operation: int) -> Any:
        if operation == fcntl.LOCK_EX:  # the writer's lock of a new segment
            for claim in replayer.claims():
                taken.append(len(claim.records))
                claim.done()
        return real_flock(fd, operation)

    monkeypatch.setattr(spool_module.fcntl, "flock", replay_first)
    writer.append_sync([make_record("t")])
    monkeypatch.setattr(spool_module.fcntl, "flock", real_flock)
    assert taken == []
    writer.rotate()
    assert len(replayer.read_all()) == 1


def test_released_claim_keeps_the_segment(tmp_path: Path, make_record: RecordFactory) -> None:
    spool = Spool(tmp_path)
    spool.append_sync([make_record("t")])
    spool.rotate()
    (claim,) = list(spool.claims())
    claim.release()
    assert len(spool.segment_paths()) == 1
    assert len(next(spool.claims()).records) == 1


def test_torn_last_line_is_skipped(tmp_path: Path, make_record: RecordFactory) -> None:
    """A crash inside ``write`` leaves half a line: the rest of the segment still replays."""
    spool = Spool(tmp_path)
    spool.append_sync([make_record("t"), make_record("t")])
    spool.rotate()
    (path,) = spool.segment_paths()
    with path.open("ab") as f:
        f.write(b'{"request_id":"half')
    (claim,) = list(spool.claims())
    assert (len(claim.records), claim.bad_lines) == (2, 1)


def test_quarantine_is_not_replayed(tmp_path: Path, make_record: RecordFactory) -> None:
    spool = Spool(tmp_path)
    path = spool.quarantine([make_record("t")])
    assert path.exists() and spool.segment_paths() == []
