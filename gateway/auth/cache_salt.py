"""Each tenant's prompt-cache salt: HMAC-SHA256 of a server secret and the tenant's cache scope.

An engine's prefix cache answers a prompt whose beginning it has seen with a cache hit, and the
hit shows (``cached_tokens``, a shorter time to first token). Shared by tenants, it tells one
tenant whether another sent a guessed prompt. vLLM and SGLang take a ``cache_salt`` per request:
a prompt hits only blocks cached under the same salt. The salt comes from the authenticated
tenant and a secret the client never sees, so no client can choose, learn or guess another's.

The scope a salt covers is the tenant, or what the policy lets tenants share: a tenant's
``cache_group``, else its organization when that sets ``share_cache``. The secret is
``isolation.cache_salt_secret_env``'s value or, unset, one made once in ``store.data_dir``
(0600, shared by every worker of the host; replicas on several hosts set the variable).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.config.model import Policy

__all__ = ["SECRET_FILE", "CacheSalts", "load_secret"]

#: the secret's file under ``store.data_dir`` when the environment sets none
SECRET_FILE = "cache-salt.secret"
#: a salt's length in hex digits (128 bits)
_HEX = 32


def load_secret(policy: Policy) -> bytes:
    """The salts' secret: from the environment, else the data directory's file (made on first
    use, atomically, so that concurrent workers all read the one that won)."""
    value = os.environ.get(policy.isolation.cache_salt_secret_env)
    if value:
        return value.encode()
    directory = Path(policy.store.data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SECRET_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
            out.flush()
            os.fsync(out.fileno())
    for _ in range(100):  # another worker may be between its create and its write
        text = path.read_text().strip()
        if text:
            return text.encode()
    raise RuntimeError(f"{path} is empty: remove it, or set "
                       f"{policy.isolation.cache_salt_secret_env}")


class CacheSalts:
    """Tenant -> salt for one policy (memoised: a salt is an HMAC, computed once per tenant)."""

    def __init__(self, policy: Policy, secret: bytes | Callable[[], bytes]) -> None:
        #: the secret, or how to load it (on the first salt: a policy that sends none, or a
        #: process that serves no request, never touches the data directory)
        self._secret = secret
        teams = {t.name: t.organization for t in policy.teams}
        sharing = {o.name for o in policy.organizations if o.share_cache}
        self._scopes: dict[str, str] = {}
        for tenant in policy.tenants:
            organization = tenant.organization or teams.get(tenant.team or "")
            if tenant.cache_group is not None:
                self._scopes[tenant.name] = f"group:{tenant.cache_group}"
            elif organization is not None and organization in sharing:
                self._scopes[tenant.name] = f"organization:{organization}"
        self._salts: dict[str, str] = {}

    def scope(self, tenant: str | None) -> str:
        """What the tenant's salt covers: ``tenant:<name>``, ``group:<name>`` or
        ``organization:<name>`` (anonymous callers share ``anonymous``)."""
        if tenant is None:
            return "anonymous"
        return self._scopes.get(tenant) or f"tenant:{tenant}"

    def salt(self, tenant: str | None) -> str:
        """The tenant's salt: 128 bits of HMAC-SHA256(secret, scope), as hex."""
        key = tenant or ""
        found = self._salts.get(key)
        if found is None:
            if not isinstance(self._secret, bytes):
                self._secret = self._secret()
            digest = hmac.new(self._secret, b"gateway-cache-salt\0" + self.scope(tenant).encode(),
                              hashlib.sha256).hexdigest()
            found = self._salts[key] = digest[:_HEX]
        return found

    @property
    def secret(self) -> bytes | Callable[[], bytes]:
        """The secret (or its loader), for the next policy's salts after a reload."""
        return self._secret
