"""Managed API keys: records stored by their keyed hash, in Redis or in a local JSON file.

Only ``HMAC-SHA256(secret, key)`` is stored and looked up; the key itself is shown once at
creation and never kept. The secret lives in the environment (``auth.key_secret_env``), so a
copy of Redis or of the file does not let anyone check guesses offline.

Redis layout (single-key commands, so it works on Redis Cluster as is):
``gw:k:d:<digest>`` -> the record (JSON); ``gw:k:i:<id>`` -> its digest; ``gw:k:ids`` -> set of ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.auth.static import KEY_PREFIX

if TYPE_CHECKING:
    from gateway.redis import RedisLike

__all__ = [
    "FileKeyStore",
    "KeyRecord",
    "KeyStore",
    "RedisKeyStore",
    "digest_for",
    "new_managed_key",
]


class KeyRecord(msgspec.Struct, kw_only=True):
    """What is stored about one managed key (never the key)."""

    id: str
    tenant: str
    digest: str
    name: str = ""
    created: float = 0.0
    expires: float | None = None  # unix time
    revoked: float | None = None  # unix time of revocation
    default_class: str | None = None
    allow_class_header: bool = False
    limits: dict[str, int] | None = None

    def usable(self, now: float) -> bool:
        return self.revoked is None and (self.expires is None or now < self.expires)


def digest_for(secret: bytes, key: str) -> str:
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()


def new_managed_key() -> tuple[str, str]:
    """(key id, key): the id is embedded so logs and revocations can name a key safely."""
    key_id = secrets.token_hex(6)
    return key_id, f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


class KeyStore:
    """Interface of key stores."""

    async def get(self, digest: str) -> KeyRecord | None:
        raise NotImplementedError

    async def put(self, record: KeyRecord) -> None:
        raise NotImplementedError

    async def list(self, tenant: str | None = None) -> list[KeyRecord]:
        raise NotImplementedError

    async def revoke(self, key_id: str) -> KeyRecord | None:
        raise NotImplementedError

    async def by_id(self, key_id: str) -> KeyRecord | None:
        """The record of a key by its id (low rate: background checks, never per request)."""
        return next((r for r in await self.list() if r.id == key_id), None)

    async def aclose(self) -> None:
        return None


class FileKeyStore(KeyStore):
    """Records in one JSON file (the embedded default); every process re-reads it on change."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._mtime = -1.0
        self._by_digest: dict[str, KeyRecord] = {}

    def _load(self) -> None:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self._by_digest, self._mtime = {}, -1.0
            return
        if mtime == self._mtime:
            return
        records = msgspec.json.decode(self.path.read_bytes() or b"[]", type=list[KeyRecord])
        self._by_digest = {r.digest: r for r in records}
        self._mtime = mtime

    def _write(self, records: list[KeyRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(msgspec.json.format(msgspec.json.encode(records)))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def _locked(self) -> Any:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self._mtime = -1.0
                self._load()
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    async def get(self, digest: str) -> KeyRecord | None:
        self._load()
        return self._by_digest.get(digest)

    async def put(self, record: KeyRecord) -> None:
        with self._locked():
            self._by_digest[record.digest] = record
            self._write(list(self._by_digest.values()))

    async def list(self, tenant: str | None = None) -> list[KeyRecord]:
        self._load()
        return [r for r in self._by_digest.values() if tenant is None or r.tenant == tenant]

    async def revoke(self, key_id: str) -> KeyRecord | None:
        with self._locked():
            for record in self._by_digest.values():
                if record.id == key_id:
                    record.revoked = record.revoked or time.time()
                    self._write(list(self._by_digest.values()))
                    return record
        return None


class RedisKeyStore(KeyStore):
    """Records in Redis, shared by every replica.

    Args:
        client: any Redis client of ``gateway.redis`` (``open_redis``; the pipelined one on a
            single node): plain commands only, so each client answers the same.
        timeout: bound of a lookup (the request path); admin calls are not bounded here.
    """

    def __init__(self, client: RedisLike, timeout: float = 0.25) -> None:
        self.client = client
        self.timeout = timeout

    async def get(self, digest: str) -> KeyRecord | None:
        async with asyncio.timeout(self.timeout):
            raw = await self.client.execute_command("GET", f"gw:k:d:{digest}")
        return None if raw is None else msgspec.json.decode(raw, type=KeyRecord)

    async def put(self, record: KeyRecord) -> None:
        client = self.client
        await client.execute_command("SET", f"gw:k:d:{record.digest}",
                                     msgspec.json.encode(record))
        await client.execute_command("SET", f"gw:k:i:{record.id}", record.digest)
        await client.execute_command("SADD", "gw:k:ids", record.id)

    async def list(self, tenant: str | None = None) -> list[KeyRecord]:
        out = []
        for key_id in sorted(await self.client.execute_command("SMEMBERS", "gw:k:ids")):
            kid = key_id.decode() if isinstance(key_id, bytes) else key_id
            digest = await self.client.execute_command("GET", f"gw:k:i:{kid}")
            if digest is None:
                continue
            d = digest.decode() if isinstance(digest, bytes) else digest
            record = await self.get(d)
            if record is not None and (tenant is None or record.tenant == tenant):
                out.append(record)
        return out

    async def by_id(self, key_id: str) -> KeyRecord | None:
        digest = await self.client.execute_command("GET", f"gw:k:i:{key_id}")
        if digest is None:
            return None
        return await self.get(digest.decode() if isinstance(digest, bytes) else digest)

    async def revoke(self, key_id: str) -> KeyRecord | None:
        digest = await self.client.execute_command("GET", f"gw:k:i:{key_id}")
        if digest is None:
            return None
        d = digest.decode() if isinstance(digest, bytes) else digest
        record = await self.get(d)
        if record is None:
            return None
        record.revoked = record.revoked or time.time()
        await self.client.execute_command("SET", f"gw:k:d:{d}", msgspec.json.encode(record))
        return record

    async def aclose(self) -> None:
        await self.client.aclose()
