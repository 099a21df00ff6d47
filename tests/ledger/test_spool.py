"""The spool file: durable appends, rotation, locks between writer and replayers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gateway.ledger import Spool

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
