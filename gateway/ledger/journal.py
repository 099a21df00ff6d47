"""The local journal of ``ledger_durability: journal``: a record is durable once fsync'd here.

Why: with ``commit`` a response's last bytes wait for a database round trip, the insert and
its rollup upserts, and the database's WAL flush (0.7-1.0 ms for one record on a 2-vCPU VM,
against 0.27 ms for a journal write: README, "One connection, everything on"); an append to a
local file and one ``fdatasync`` (0.25-0.3 ms of that VM's disk) keeps the same promise
against a killed process (SIGKILL, an OOM kill): no record of a response its client received
is lost. The record also goes into the ledger's buffer and
reaches the database in the background batches of ``buffered``; the journal's copy matters
only if the process dies before that. It is not a promise against losing the disk: ``commit``
keeps that one.

Group commit: one write + ``fdatasync`` at a time, in a thread of the journal's own; records
appended meanwhile go in the next, so one fsync serves every response that ended during the
previous. A record appended ``alone`` (no other request in flight) while no write is under way
is written on the loop itself: there is nothing to overlap the fsync with, and the hand-off to
the thread and back costs two cross-CPU wake-ups (~0.25 ms on this 2-vCPU VM, more than the
fsync). A writer's future completes at whichever comes first: its journal fsync, or its
record stored by the ledger (committed or spooled). A journal that fails (a full disk) logs an
error once and stops taking records (``broken``): its waiting writers then complete when the
ledger stores their records, and the ledger sends later writers to ``write_durable``.

Segments ``journal-<ns>-<pid>.jsonl`` (the spool's JSON Lines) are held under an exclusive
``flock`` from creation until every record in them is stored, then deleted; a segment is
sealed (no more appends) past ``max_segment_bytes``. A process that dies leaves its segments
unlocked: :func:`adopt_orphans` (the SQL store's replayer runs it at start and every
``replay_interval``) renames each into a spool segment, which the spool replay stores;
records already stored are duplicates the stores drop, so adopting is always safe. A torn last
line (a crash inside ``write``) was never acknowledged and is skipped on read.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.ledger.record import encode_lines
from gateway.ledger.spool import create_locked, fsync_dir

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gateway.ledger.record import UsageRecord
    from gateway.ledger.spool import Spool

__all__ = ["DEFAULT_JOURNAL_SEGMENT_BYTES", "Journal", "adopt_orphans"]

log = logging.getLogger(__name__)

DEFAULT_JOURNAL_SEGMENT_BYTES = 4 * 1024 * 1024
PREFIX = "journal"


class _Segment:
    """One journal file: what is assigned to it, written to it, and not yet stored."""

    __slots__ = ("fd", "outstanding", "path", "sealed", "size", "unwritten")

    def __init__(self) -> None:
        self.fd = -1  # opened by the writer thread at its first write
        self.path: Path | None = None
        self.size = 0  # bytes assigned (an estimate until written: records are encoded there)
        self.outstanding = 0  # records in it the ledger has not stored yet
        self.unwritten = 0  # records assigned to it and not yet fsync'd
        self.sealed = False


class Journal:
    """Group-committed, fsync'd local copies of usage records until the ledger stores them.

    Args:
        directory: the ledger's spool directory (orphans are adopted into its spool).
        max_segment_bytes: a segment is sealed once it has grown past this.
    """

    #: a record's size in a segment, for rotation before it is encoded (encoding happens in
    #: the writer thread); the spool's lines run ~400-700 bytes
    _RECORD_BYTES = 600

    def __init__(self, directory: str | os.PathLike[str], *,
                 max_segment_bytes: int = DEFAULT_JOURNAL_SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self._max = max_segment_bytes
        self._active = _Segment()
        self._segments: list[_Segment] = [self._active]
        #: id of a record -> (the record, its segment); the record is kept so the id stays its
        self._where: dict[int, tuple[UsageRecord, _Segment]] = {}
        #: id of a record -> its writer's future, until fsync'd or stored
        self._futures: dict[int, asyncio.Future[None]] = {}
        #: records waiting for the next write, by segment, in order
        self._pending: list[tuple[_Segment, list[UsageRecord]]] = []
        self._syncing = False
        self._in_flight: asyncio.Future[None] | None = None
        self._closed = False
        self._executor: ThreadPoolExecutor | None = None
        self.broken = False
        self.appended = 0
        self.fsyncs = 0

    def __repr__(self) -> str:
        return (f"<Journal [{self.directory} | segments: {len(self._segments)} | "
                f"unstored: {len(self._where)} | fsyncs: {self.fsyncs}]>")

    # -- the loop's side -----------------------------------------------------------------

    def append(self, record: UsageRecord, *, alone: bool = False) -> asyncio.Future[None]:
        """Journal one record the ledger has just buffered; the future completes once it is
        fsync'd here or stored by the ledger, whichever is first (never with an error).
        ``alone``: the caller has no other request in flight, so a write due now runs on the
        loop (the future is done on return)."""
        future = asyncio.get_running_loop().create_future()
        key = id(record)
        self._futures[key] = future
        if self.broken:  # completes when the ledger stores it
            return future
        segment = self._active
        if segment.size and segment.size + self._RECORD_BYTES > self._max:
            segment.sealed = True
            segment = self._active = _Segment()
            self._segments.append(segment)
        segment.size += self._RECORD_BYTES
        segment.outstanding += 1
        segment.unwritten += 1
        self._where[key] = (record, segment)
        pending = self._pending
        if pending and pending[-1][0] is segment:
            pending[-1][1].append(record)
        else:
            pending.append((segment, [record]))
        if not self._syncing:
            if alone:
                self._write_here()
            else:
                self._write_next()
        return future

    def stored(self, records: Iterable[UsageRecord]) -> None:
        """The ledger stored (or spooled) these records: their journal copies may go."""
        if not self._futures and not self._where:
            return
        where, futures = self._where, self._futures
        for record in records:
            key = id(record)
            future = futures.pop(key, None)
            if future is not None and not future.done():
                future.set_result(None)
            entry = where.pop(key, None)
            if entry is not None:
                segment = entry[1]
                segment.outstanding -= 1
                self._retire_if_done(segment)

    @property
    def unstored(self) -> int:
        """Records journaled and not yet stored by the ledger."""
        return len(self._where)

    async def close(self) -> None:
        """For the ledger's close, after its drain: complete every writer still waiting (their
        records are durable in the store now), let the write under way finish, then delete
        the segments whose records are all stored and unlock the rest (a later start adopts
        them)."""
        self._closed = True
        for future in self._futures.values():
            if not future.done():
                future.set_result(None)
        self._futures.clear()
        self._pending = []
        if self._in_flight is not None:
            with contextlib.suppress(BaseException):
                await self._in_flight  # its done callback (``_written``) runs first
        await asyncio.to_thread(self._close_files)

    def _close_files(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for segment in self._segments:
            if segment.fd < 0:
                continue
            if segment.outstanding == 0:
                with contextlib.suppress(FileNotFoundError):
                    if segment.path is not None:
                        segment.path.unlink()
            os.close(segment.fd)
            segment.fd = -1
        self._segments = []
        self._active = _Segment()
        self._segments.append(self._active)
        self._pending = []
        self._where.clear()

    def _write_next(self) -> None:
        groups, self._pending = self._pending, []
        if not groups or self._closed:
            return
        self._syncing = True
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._thread(), self._write, groups)
        done.add_done_callback(lambda f: self._written(groups, f))
        self._in_flight = done

    def _write_here(self) -> None:
        """The pending records written and fsync'd on the loop (blocking)."""
        groups, self._pending = self._pending, []
        try:
            self._write(groups)
        except OSError as exc:
            self._failed(exc)
            return
        self._completed(groups)

    def _written(self, groups: list[tuple[_Segment, list[UsageRecord]]],
                 done: asyncio.Future[None]) -> None:
        self._syncing = False
        self._in_flight = None
        exc = None if done.cancelled() else done.exception()
        if done.cancelled() or exc is not None:
            self._failed(exc)
            return
        self._completed(groups)
        self._write_next()

    def _failed(self, exc: BaseException | None) -> None:
        """A write failed: stop journaling; the writers waiting complete when the ledger
        stores their records."""
        if not self.broken:
            log.error("ledger journal: write failed (%s); responses now wait for the "
                      "database instead", exc or "cancelled")
        self.broken = True
        self._pending = []

    def _completed(self, groups: list[tuple[_Segment, list[UsageRecord]]]) -> None:
        self.fsyncs += 1
        futures = self._futures
        for segment, records in groups:
            segment.unwritten -= len(records)
            self.appended += len(records)
            for record in records:
                future = futures.pop(id(record), None)
                if future is not None and not future.done():
                    future.set_result(None)
            self._retire_if_done(segment)

    def _retire_if_done(self, segment: _Segment) -> None:
        """Delete a sealed segment once every record in it is written and stored."""
        if (segment.sealed and segment.outstanding == 0 and segment.unwritten == 0
                and segment.fd >= 0 and not self._closed):
            fd, path = segment.fd, segment.path
            segment.fd = -1
            self._segments.remove(segment)
            self._thread().submit(_delete, path, fd)

    def _thread(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-journal")
        return self._executor

    # -- the writer thread ---------------------------------------------------------------

    def _write(self, groups: list[tuple[_Segment, list[UsageRecord]]]) -> None:
        touched: list[_Segment] = []
        for segment, records in groups:
            if segment.fd < 0:
                self._open(segment)
            data = encode_lines(records)
            view = memoryview(data)
            while view:
                view = view[os.write(segment.fd, view):]
            if segment not in touched:
                touched.append(segment)
        for segment in touched:
            os.fdatasync(segment.fd)

    def _open(self, segment: _Segment) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{PREFIX}-{time.time_ns():020d}-{os.getpid()}.jsonl"
        segment.fd, segment.path = create_locked(path), path  # never adoptable while live


def _delete(path: Path | None, fd: int) -> None:
    """Unlink a segment whose records are all stored, then drop its lock."""
    try:
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    finally:
        os.close(fd)


def adopt_orphans(spool: Spool) -> int:
    """Rename each journal segment no live process holds into a spool segment of ``spool``
    (its replay stores the records); returns how many were adopted. Blocking and cheap: one
    directory listing when there is nothing to adopt."""
    adopted = 0
    for path in sorted(spool.directory.glob(f"{PREFIX}-*.jsonl")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                continue  # adopted and renamed by another process meanwhile
            os.rename(path, spool.new_segment_path(suffix="adopted"))
            fsync_dir(spool.directory)
            adopted += 1
        except (BlockingIOError, FileNotFoundError):
            continue  # a live process's segment, or gone
        finally:
            os.close(fd)
    return adopted
