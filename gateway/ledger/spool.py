"""The local spool: append-only JSON Lines files that hold records the database could not take.

Durability is the point, so each ``append`` writes the whole batch (looping over short
writes) and ``fsync``s it; when it returns, the records survive a crash of the process (and of
the machine, as far as the disk keeps its promises). When it raises (a full disk, an I/O
error) none of the batch is acknowledged, and the segment is cut back to its last whole record
so the next append starts on a clean line. It runs in a worker thread so an outage costs the
event loop nothing.

Files (*segments*) are named ``<prefix>-<ns>-<pid>.jsonl`` and rotated by size. The segment a
process is appending to carries an exclusive ``flock``; a replayer takes the same lock
(non-blocking) before reading a segment and deletes it only once all its records are stored.
So a segment is replayed by one process at a time, never while it is still being written,
and one left by a crashed process (its lock died with it) is picked up by the next start.
Replaying twice is harmless: the stores drop records whose request id they have seen.

A torn last line (a crash inside ``write``) is skipped on read and counted (the replay logs
and counts every line it could not parse): its records were never acknowledged as durable.
Records a store refuses outright (not an outage: a bug) go to a ``dead-*.jsonl`` file that
replay ignores, so one poison record cannot block the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.ledger.record import UsageRecord, decode_records, encode_lines

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["DEFAULT_SEGMENT_BYTES", "Claim", "Spool", "write_all"]

DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024


def fsync_dir(directory: Path) -> None:
    """Make the names in ``directory`` (a file created or renamed there) survive a crash."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def create_locked(path: Path) -> int:
    """Create ``path`` for appending, under an exclusive ``flock``; returns its fd.

    The file is created and locked under a hidden name that no replay or adoption reads, then
    renamed: a segment is never seen unlocked under its own name (a replayer would claim it
    empty and delete it, and the records appended afterwards would go to an unlinked file).
    """
    making = path.with_name("." + path.name + ".new")
    fd = os.open(making, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(making, path)
    fsync_dir(path.parent)  # the new name must survive a crash too
    return fd


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` or raise: ``os.write`` may take only part of it (a disk
    with room for part of a batch), and a batch counts as written only when all of it is."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # not seen from a regular file; never loop on it
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]


class Claim:
    """A segment locked by this process for replay; ``done`` deletes it, ``release`` keeps it."""

    __slots__ = ("_fd", "bad_lines", "path", "records")

    def __init__(self, path: Path, fd: int, records: list[UsageRecord], bad_lines: int) -> None:
        self.path = path
        self.records = records
        self.bad_lines = bad_lines
        self._fd = fd

    def done(self) -> None:
        """Every record is stored: delete the segment, then drop the lock."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.release()

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Spool:
    """Append-only, fsync'd, size-rotated record files in ``directory``.

    Args:
        directory: created if missing; give each ledger kind its own.
        max_segment_bytes: a segment is sealed once it would grow past this.
        prefix: file name prefix of the segments this spool writes and replays.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        prefix: str = "spool",
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._max = max_segment_bytes
        self._prefix = prefix
        self._lock = threading.Lock()
        self._fd = -1
        self._path: Path | None = None
        self._size = 0
        self.appended = 0
        self.fsyncs = 0

    def __repr__(self) -> str:
        return (
            f"<Spool [{self.directory} | segments: {len(self.segment_paths())} | "
            f"active: {self._size} bytes | appended: {self.appended}]>"
        )

    # -- writing --------------------------------------------------------------------------

    async def append(self, records: list[UsageRecord]) -> None:
        """Write and fsync ``records`` (in a thread); durable when this returns."""
        if records:
            await asyncio.to_thread(self.append_sync, records)

    def append_sync(self, records: list[UsageRecord]) -> None:
        """The blocking form, for shutdown paths that have no event loop to spare."""
        data = encode_lines(records)
        with self._lock:
            if self._fd >= 0 and self._size and self._size + len(data) > self._max:
                self._seal()
            if self._fd < 0:
                self._open()
            try:
                write_all(self._fd, data)
                os.fsync(self._fd)
            except OSError:
                self._cut_torn_tail()
                raise
            self._size += len(data)
            self.appended += len(records)
            self.fsyncs += 1

    def quarantine(self, records: list[UsageRecord]) -> Path:
        """Keep records a store refused (not replayed); returns the file written."""
        path = self.directory / f"dead-{time.time_ns()}-{os.getpid()}.jsonl"
        with path.open("ab") as f:
            f.write(encode_lines(records))
            f.flush()
            os.fsync(f.fileno())
        return path

    def rotate(self) -> None:
        """Seal the active segment so it can be replayed (a no-op when there is none)."""
        with self._lock:
            self._seal()

    def close(self) -> None:
        self.rotate()

    def new_segment_path(self, suffix: str = "") -> Path:
        """A fresh segment name of this spool (``suffix`` tells where it came from)."""
        tail = f"-{suffix}" if suffix else ""
        return self.directory / f"{self._prefix}-{time.time_ns():020d}-{os.getpid()}{tail}.jsonl"

    def _open(self) -> None:
        path = self.new_segment_path()
        self._fd, self._path, self._size = create_locked(path), path, 0

    def _cut_torn_tail(self) -> None:
        """After a failed write (a full disk, an I/O error), cut the active segment back to its
        last whole record: the next append must not glue its first line onto a torn one. If
        even that fails, seal the segment (its torn tail is then its last line, which a read
        counts as bad and skips) so the next append starts a new one."""
        try:
            os.ftruncate(self._fd, self._size)
        except OSError:
            self._seal()

    def _seal(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops the flock: replayers may take it now
        self._fd, self._path, self._size = -1, None, 0

    # -- reading --------------------------------------------------------------------------

    def segment_paths(self) -> list[Path]:
        """All segments of this prefix, oldest first (including one still being written)."""
        return sorted(self.directory.glob(f"{self._prefix}-*.jsonl"))

    def claim(self, path: Path) -> Claim | None:
        """Lock and read one segment, or None if another process holds it (or it is gone)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                raise FileNotFoundError(path)  # replayed and deleted while we waited
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            return None
        records, bad = decode_records(b"".join(chunks))
        return Claim(path, fd, records, bad)

    def claims(self) -> Iterator[Claim]:
        """Claim each free segment in turn (the caller must ``done`` or ``release`` each)."""
        for path in self.segment_paths():
            claim = self.claim(path)
            if claim is not None:
                yield claim

    def read_all(self) -> list[UsageRecord]:
        """Every record in every segment, without locking (for the memory ledger's start)."""
        out: list[UsageRecord] = []
        for path in self.segment_paths():
            with contextlib.suppress(FileNotFoundError):
                out.extend(decode_records(path.read_bytes())[0])
        return out
