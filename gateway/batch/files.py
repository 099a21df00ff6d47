"""Where file contents live: the ``FileStore`` interface and its local-disk implementation.

Metadata (owner, name, size) lives in the batch state store; a ``FileStore`` only keeps bytes
by file id. Several gateway processes share one ``batch.files_dir`` (one host, or a shared
volume). Writes go to a temporary name, are fsync'd, then renamed: a reader never sees half a
file, and a crash leaves either the whole file or none.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import re
from pathlib import Path

__all__ = ["FileStore", "LocalFileStore"]

_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


class FileStore(abc.ABC):
    """Bytes by file id. Implementations must make ``put`` atomic and durable."""

    @abc.abstractmethod
    async def put(self, file_id: str, data: bytes) -> None:
        """Store ``data`` under ``file_id`` (replacing it), durable on return."""

    @abc.abstractmethod
    async def get(self, file_id: str) -> bytes:
        """The file's bytes; raises ``FileNotFoundError``."""

    @abc.abstractmethod
    async def delete(self, file_id: str) -> None:
        """Remove the file; no error if it is gone already."""


class LocalFileStore(FileStore):
    """Files in one directory, ``<id>.jsonl``; blocking I/O runs in a worker thread."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)  # created by the first put

    def _path(self, file_id: str) -> Path:
        if not _ID.match(file_id):
            raise FileNotFoundError(file_id)
        return self.directory / f"{file_id}.jsonl"

    def _put(self, file_id: str, data: bytes) -> None:
        path = self._path(file_id)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    async def put(self, file_id: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, file_id, data)

    async def get(self, file_id: str) -> bytes:
        return await asyncio.to_thread(self._path(file_id).read_bytes)

    def _delete(self, file_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(file_id).unlink()

    async def delete(self, file_id: str) -> None:
        await asyncio.to_thread(self._delete, file_id)

    def __repr__(self) -> str:
        return f"<LocalFileStore {self.directory}>"
