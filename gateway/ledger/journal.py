"""The local journal of ``ledger_durability: journal``: a record is durable once fsync'd here.

Why: with ``commit`` a response's last bytes wait for a database round trip, the insert and
its rollup upserts, and the database's WAL flush (0.7-1.0 ms for one record on a 2-vCPU VM,
against 0.27 ms for a journal write: docs/benchmarks/one-connection.md); an append to a
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
record stored by the ledger (committed or spooled). A write that fails (a full disk) is cut
back to the segment's last whole record, logs an error once per failing spell and stops the
journal for ``RETRY_AFTER`` seconds (``broken``): its waiting writers then complete when the
ledger stores their records, the ledger sends writers meanwhile to ``write_durable``, and the
next attempt starts a new segment.

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

from gateway.ledger.record import decode_records, encode_lines
from gateway.ledger.spool import create_locked, fsync_dir, write_all

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gateway.ledger.record import UsageRecord
    from gateway.ledger.spool import Spool

__all__ = [
    "DEFAULT_JOURNAL_SEGMENT_BYTES", "NETWORK_FILESYSTEMS", "Journal", "adopt_orphans",
    "filesystem_of", "journal_is_local",
]

log = logging.getLogger(__name__)

DEFAULT_JOURNAL_SEGMENT_BYTES = 4 * 1024 * 1024
#: seconds a journal that failed a write waits before it tries again
RETRY_AFTER = 5.0
#: ``write_now``: the longest a written record waits for its fdatasync (what a host crash,
#: not a killed process, can lose), so one fdatasync covers every record of that window
SYNC_DELAY = 0.1
PREFIX = "journal"
#: the provisional records of streams under way (``Ledger.provisional``): adopted after the
#: journal's, a request's last line only, so a final record replayed first wins
INFLIGHT_PREFIX = "inflight"


class _Segment:
    """One journal file: what is assigned to it, written to it, and not yet stored."""

    __slots__ = ("fd", "outstanding", "path", "sealed", "size", "unwritten", "written")

    def __init__(self) -> None:
        self.fd = -1  # opened by the writer thread at its first write
        self.path: Path | None = None
        self.size = 0  # bytes assigned (an estimate until written: records are encoded there)
        self.written = 0  # bytes written and fdatasync'd: a failed write is cut back to this
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
                 max_segment_bytes: int = DEFAULT_JOURNAL_SEGMENT_BYTES,
                 prefix: str = PREFIX) -> None:
        self.prefix = prefix
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
        #: a write failed (a full disk): records wait for the ledger's store instead, until
        #: ``_retry_at``, when the journal tries again (with a new segment)
        self.broken = False
        self._retry_at = 0.0
        self._failures = 0
        self._failing_since = 0.0
        #: segments written to by ``write_now`` and not fdatasync'd since, and whether their
        #: fdatasync is scheduled
        self._unsynced: list[_Segment] = []
        self._sync_due = False
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
        if self.broken and not self.usable():  # completes when the ledger stores it
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

    def write_now(self, record: UsageRecord) -> bool:
        """Write one record to the journal file on the loop (one ``write`` into the page
        cache: a killed process cannot lose it) and leave its ``fdatasync`` to the writer
        thread within ``SYNC_DELAY`` (a host crash before it may); True once written.
        False: the journal cannot take it now (broken, or this write failed), and the caller
        must wait for the store.

        Why: the ``fdatasync`` a ``journal`` writer waits for is 0.25-0.3 ms of a VM's disk,
        most of what that mode adds to a response; what kills a gateway process (SIGKILL, the
        OOM killer, a crash) leaves the page cache to the kernel, which writes it out."""
        if self.broken and not self.usable():
            return False
        segment = self._active
        if segment.size and segment.size + self._RECORD_BYTES > self._max:
            segment.sealed = True
            segment = self._active = _Segment()
            self._segments.append(segment)
        data = encode_lines((record,))
        try:
            if segment.fd < 0:
                self._open(segment)
            write_all(segment.fd, data)
        except OSError as exc:
            if segment.fd >= 0:
                with contextlib.suppress(OSError):
                    os.ftruncate(segment.fd, segment.written)
            self._failed(exc, [])
            return False
        segment.size += len(data)
        segment.written += len(data)
        segment.outstanding += 1
        self._where[id(record)] = (record, segment)
        self.appended += 1
        if segment not in self._unsynced:
            self._unsynced.append(segment)
        if not self._syncing and not self._sync_due:
            # one fdatasync per SYNC_DELAY at most, for everything written meanwhile: no
            # hand-off to the thread (and wake-up back) per request
            self._sync_due = True
            asyncio.get_running_loop().call_later(SYNC_DELAY, self._sync_next)
        return True

    def _sync_next(self) -> None:
        """``fdatasync`` the segments written to since the last one, in the writer thread;
        one at a time, each covering every write made before it started."""
        self._sync_due = False
        segments, self._unsynced = self._unsynced, []
        if not segments or self._closed:
            return
        self._syncing = True
        done = asyncio.get_running_loop().run_in_executor(self._thread(), _datasync, segments)

        def synced(future: asyncio.Future[None]) -> None:
            self._syncing = False
            self._in_flight = None
            if future.cancelled() or future.exception() is not None:
                self._failed(None if future.cancelled() else future.exception(), [])
                return
            self.fsyncs += 1
            if self._unsynced and not self._sync_due:  # written while this one ran
                self._sync_due = True
                asyncio.get_running_loop().call_later(SYNC_DELAY, self._sync_next)

        done.add_done_callback(synced)
        self._in_flight = done

    def journaled(self, records: Iterable[UsageRecord]) -> set[int]:
        """The ``id``s of those of ``records`` written to a journal file (not yet stored)."""
        where = self._where
        return {id(r) for r in records if id(r) in where}

    def replaced(self, old: UsageRecord, new: UsageRecord) -> None:
        """The ledger corrected ``old`` into ``new`` before storing it: the journal's entry
        follows (written again when its copy is already on disk, so a replay after a crash
        finds the correction last; the replay keeps a request's last line)."""
        entry = self._where.pop(id(old), None)
        future = self._futures.pop(id(old), None)
        if future is not None:
            self._futures[id(new)] = future
        if entry is None:
            return
        segment = entry[1]
        self._where[id(new)] = (new, segment)
        if segment.fd >= 0 and not self.broken:
            with contextlib.suppress(OSError):
                write_all(segment.fd, encode_lines((new,)))
                segment.written += 0  # the size is re-read by the next write's truncation
                segment.written = os.lseek(segment.fd, 0, os.SEEK_END)

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

    def usable(self) -> bool:
        """Whether records may be journaled now: not broken, or broken long enough ago that
        a new attempt is due (then it is no longer broken)."""
        if self.broken and time.monotonic() >= self._retry_at:
            self.broken = False
        return not self.broken

    def _write_here(self) -> None:
        """The pending records written and fsync'd on the loop (blocking)."""
        groups, self._pending = self._pending, []
        try:
            self._write(groups)
        except OSError as exc:
            self._failed(exc, groups)
            return
        self._completed(groups)

    def _written(self, groups: list[tuple[_Segment, list[UsageRecord]]],
                 done: asyncio.Future[None]) -> None:
        self._syncing = False
        self._in_flight = None
        exc = None if done.cancelled() else done.exception()
        if done.cancelled() or exc is not None:
            self._failed(exc, groups)
            return
        self._completed(groups)
        self._write_next()

    def _failed(self, exc: BaseException | None,
                groups: list[tuple[_Segment, list[UsageRecord]]]) -> None:
        """A write failed (its segments were cut back to their last whole record): stop
        journaling for ``RETRY_AFTER`` seconds; the writers waiting, and those meanwhile,
        complete when the ledger stores their records. The segments written to are sealed
        (the next attempt starts a new one); the failed records are no longer theirs to
        write. One log line per failing spell."""
        self._failures += 1
        if not self.broken and self._failures == 1:
            self._failing_since = time.monotonic()
            log.error("ledger journal: write failed (%s); responses wait for the ledger's "
                      "store instead, and the journal is tried again every %g s",
                      exc or "cancelled", RETRY_AFTER)
        self.broken = True
        self._retry_at = time.monotonic() + RETRY_AFTER
        for segment, records in groups:
            segment.unwritten -= len(records)
            segment.sealed = True
            self._retire_if_done(segment)
        for segment, _ in self._pending:
            segment.sealed = True
        if self._active.sealed:
            self._active = _Segment()
            self._segments.append(self._active)
        # records assigned but not yet written wait for the store too
        for segment, records in self._pending:
            segment.unwritten -= len(records)
            self._retire_if_done(segment)
        self._pending = []

    def _completed(self, groups: list[tuple[_Segment, list[UsageRecord]]]) -> None:
        if self._failures:
            log.warning("ledger journal: writing again after %d failed writes over %.1f s",
                        self._failures, time.monotonic() - self._failing_since)
            self._failures = 0
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
            if segment in self._unsynced:
                self._unsynced.remove(segment)
            self._segments.remove(segment)
            self._thread().submit(_delete, path, fd)

    def _thread(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-journal")
        return self._executor

    # -- the writer thread ---------------------------------------------------------------

    def _write(self, groups: list[tuple[_Segment, list[UsageRecord]]]) -> None:
        """Write and fdatasync each group to its segment, or raise having cut every segment
        touched back to its last whole record (a torn line would glue onto the next)."""
        touched: dict[_Segment, int] = {}  # segment -> bytes written to it now
        try:
            for segment, records in groups:
                if segment.fd < 0:
                    self._open(segment)
                data = encode_lines(records)
                touched[segment] = touched.get(segment, 0)
                write_all(segment.fd, data)
                touched[segment] += len(data)
            for segment in touched:
                os.fdatasync(segment.fd)
        except OSError:
            for segment in touched:
                with contextlib.suppress(OSError):
                    os.ftruncate(segment.fd, segment.written)
            raise
        for segment, size in touched.items():
            segment.written += size

    def _open(self, segment: _Segment) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.prefix}-{time.time_ns():020d}-{os.getpid()}.jsonl"
        segment.fd, segment.path = create_locked(path), path  # never adoptable while live


#: file systems whose fsync may not mean "on this host's disk" (a network share): a journal
#: there keeps no promise the database's commit would not keep better
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "ceph", "glusterfs",
    "fuse.glusterfs", "lustre", "gpfs", "afs", "fuse.s3fs", "fuse.rclone", "virtiofs",
})


def filesystem_of(path: str | os.PathLike[str], mounts: str = "/proc/self/mounts") -> str:
    """The type of the file system ``path`` lives on (the longest mount point above it, from
    ``mounts``); "" when it cannot be told."""
    target = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open(mounts) as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return ""
    return kind


def journal_is_local(directory: str | os.PathLike[str]) -> bool:
    """Whether a journal in ``directory`` survives a killed process on this host's own disk
    (``ledger_durability: auto`` journals there, else waits for the database's commit)."""
    return filesystem_of(directory) not in NETWORK_FILESYSTEMS


def _datasync(segments: list[_Segment]) -> None:
    """fdatasync each segment still open (one retired meanwhile is deleted: nothing to do)."""
    for segment in segments:
        fd = segment.fd
        if fd >= 0:
            os.fdatasync(fd)


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
    (its replay stores the records), then each such segment of provisional records (a dead
    process's streams under way: ``interrupted``) after them, so a request whose final record
    was journaled keeps that one (the stores drop a second record of a request id); returns
    how many were adopted. Blocking and cheap: one directory listing when there is nothing."""
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
    for path in sorted(spool.directory.glob(f"{INFLIGHT_PREFIX}-*.jsonl")):
        adopted += _adopt_provisional(spool, path)
    return adopted


def _adopt_provisional(spool: Spool, path: Path) -> int:
    """A dead process's provisional records, the last of each request (its output counted
    latest), as a new spool segment; the file goes. 0 for a live process's file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            return 0
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        last = {r.request_id: r for r in decode_records(b"".join(chunks))[0]}
        if last:
            target = spool.new_segment_path(suffix="interrupted")
            making = target.with_name("." + target.name + ".new")
            out = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(out, encode_lines(last.values()))
                os.fsync(out)
            finally:
                os.close(out)
            os.rename(making, target)
        path.unlink()
        fsync_dir(spool.directory)
        return 1
    except (BlockingIOError, FileNotFoundError):
        return 0
    finally:
        os.close(fd)
