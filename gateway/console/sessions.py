"""Console sessions: kept on the server, named by a random 128-bit id that only the browser's
cookie holds.

A session says who signed in (a tenant, through one of its API keys, or the operator, through
the admin token), its CSRF token and when it expires (``console.session_minutes`` after the
sign-in: an absolute bound, not renewed by use). The id itself is never stored: a session is
kept under the SHA-256 of its id, so a listing of the store gives nobody a cookie.

Two stores with one interface: :class:`MemorySessions` (one process; tests) and
:class:`FileSessions`, one small file per session under ``<store.data_dir>/console-sessions``,
so every worker of ``gateway serve --workers N`` on a host sees the same sessions. File work
runs in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Literal

import msgspec

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

__all__ = ["FileSessions", "MemorySessions", "Session", "Sessions", "new_token"]

Role = Literal["tenant", "operator"]
#: how often a store looks for expired sessions to drop (seconds)
_SWEEP_EVERY = 60.0


def new_token() -> str:
    """128 random bits, URL-safe (a session id, a CSRF token)."""
    return secrets.token_urlsafe(16)


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """One signed-in browser. ``tenant`` and ``key_id`` are set for a tenant's session only."""

    role: Role
    csrf: str
    expires: float  # unix seconds
    tenant: str | None = None
    key_id: str | None = None
    #: the signing-in key's own limits, if it has any
    key_limits: dict[str, int] | None = None

    def expired(self, now: float) -> bool:
        return now >= self.expires


class Sessions(ABC):
    """Where sessions live. ``clock``: unix seconds (a test passes its own)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    async def create(self, role: Role, minutes: float, *, tenant: str | None = None,
                     key_id: str | None = None,
                     key_limits: dict[str, int] | None = None) -> tuple[str, Session]:
        """A new session and its id (for the cookie; not kept anywhere else)."""
        session = Session(role=role, csrf=new_token(), expires=self.clock() + minutes * 60,
                          tenant=tenant, key_id=key_id, key_limits=key_limits)
        session_id = new_token()
        await self._put(_digest(session_id), session)
        return session_id, session

    async def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie's id; None for none, an unknown or an expired one
        (which is dropped)."""
        if not session_id or len(session_id) > 64:
            return None
        key = _digest(session_id)
        session = await self._get(key)
        if session is not None and session.expired(self.clock()):
            await self._delete(key)
            return None
        return session

    async def delete(self, session_id: str | None) -> None:
        """Sign a session out (nothing happens for an unknown id)."""
        if session_id and len(session_id) <= 64:
            await self._delete(_digest(session_id))

    @abstractmethod
    async def _put(self, key: str, session: Session) -> None: ...

    @abstractmethod
    async def _get(self, key: str) -> Session | None: ...

    @abstractmethod
    async def _delete(self, key: str) -> None: ...


class MemorySessions(Sessions):
    """Sessions of one process."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self._sessions: dict[str, Session] = {}
        self._swept = 0.0

    async def _put(self, key: str, session: Session) -> None:
        now = self.clock()
        if now - self._swept >= _SWEEP_EVERY:
            self._swept = now
            self._sessions = {k: s for k, s in self._sessions.items() if not s.expired(now)}
        self._sessions[key] = session

    async def _get(self, key: str) -> Session | None:
        return self._sessions.get(key)

    async def _delete(self, key: str) -> None:
        self._sessions.pop(key, None)

    def __repr__(self) -> str:
        return f"<MemorySessions [{len(self._sessions)} sessions]>"


class FileSessions(Sessions):
    """One file per session (mode 0600, written whole by rename) in ``directory``."""

    def __init__(self, directory: Path, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self.directory = directory
        self._swept = 0.0

    async def _put(self, key: str, session: Session) -> None:
        now = self.clock()
        sweep = now - self._swept >= _SWEEP_EVERY
        if sweep:
            self._swept = now
        await asyncio.to_thread(self._write, key, msgspec.json.encode(session), sweep, now)

    def _write(self, key: str, data: bytes, sweep: bool, now: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if sweep:
            self._sweep(now)
        temp = self.directory / f".{key}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(temp, self.directory / key)

    def _sweep(self, now: float) -> None:
        for path in self.directory.iterdir():
            if path.name.startswith("."):  # another worker's write in progress
                continue
            session = self._read_path(path)
            if session is None or session.expired(now):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    async def _get(self, key: str) -> Session | None:
        return await asyncio.to_thread(self._read_path, self.directory / key)

    @staticmethod
    def _read_path(path: Path) -> Session | None:
        try:
            return msgspec.json.decode(path.read_bytes(), type=Session)
        except (OSError, msgspec.DecodeError):  # gone, or not one of ours
            return None

    async def _delete(self, key: str) -> None:
        await asyncio.to_thread(self._unlink, self.directory / key)

    @staticmethod
    def _unlink(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def __repr__(self) -> str:
        return f"<FileSessions {self.directory}>"
