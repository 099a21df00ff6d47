"""A tenant's managed API keys on its page: the list, and the forms to create and revoke one.

- ``POST /console/tenants/{tenant}/keys`` (``name``, ``expires_days``: blank for never): a new
  key through :func:`gateway.auth.manage.create_key`, the admin API's own function, into the
  gateway's key store; the answer is a page showing the key once (never in a URL, a log or
  the audit log, which name its id only).
- ``POST /console/tenants/{tenant}/keys/{key_id}/revoke``: the key revoked through the key
  store's ``revoke``, as ``POST /admin/keys/<id>/revoke`` does, if it is ``tenant``'s; any
  other id answers 404 and nothing is revoked.

A tenant's session acts on its own tenant only (403 for another's URL, as its pages), the
operator's on any; every POST carries the session's CSRF token. Managed keys are offered when
the gateway has a key store and its key secret (``auth.key_secret_env``) and the tenant is
one of the policy's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from litestar import Response, post

from gateway.auth.manage import KeyAdminError, create_key, public_view, secret_for
from gateway.console.kit import AnyRequest, Kit
from gateway.console.sessions import Session

if TYPE_CHECKING:
    from gateway.auth.keystore import KeyStore

__all__ = ["KeySection", "key_handlers", "key_section"]

#: the longest key name the form takes
MAX_NAME = 100
#: the longest expiry the form takes (days)
MAX_DAYS = 3650
_log = logging.getLogger("gateway.console")


@dataclass(frozen=True, slots=True)
class KeySection:
    """The keys part of a tenant's page: whether managed keys are offered, why not, the keys
    (newest first)."""

    enabled: bool
    reason: str = ""
    keys: list[dict[str, Any]] = field(default_factory=list)


def _when(unix: float | None) -> str:
    return "" if unix is None else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(unix))


def _store_for(kit: Kit, tenant: str) -> KeyStore | str:
    """The key store to act in for ``tenant``, or why there is none."""
    runtime = kit.current()
    if kit.services.keystore is None:
        return "This gateway keeps no managed keys (no store.keys_file, no Redis)."
    try:
        secret_for(runtime.policy)
    except KeyAdminError:
        return "This gateway has no managed-key secret configured."
    if tenant not in runtime.tenants:
        return "This tenant is not in the policy: it cannot hold managed keys."
    return kit.services.keystore


async def key_section(kit: Kit, tenant: str) -> KeySection:
    """``tenant``'s managed keys for its page."""
    store = _store_for(kit, tenant)
    if isinstance(store, str):
        return KeySection(False, store)
    try:
        records = sorted(await store.list(tenant), key=lambda r: r.created, reverse=True)
    except Exception as exc:  # a store away (Redis): the rest of the page still answers
        _log.warning("console: the keys of %s not listed: %r", tenant, exc)
        return KeySection(False, "The key store is not answering; try again shortly.")
    return KeySection(True, keys=[
        {**public_view(r), "created_at": _when(r.created), "expires_at": _when(r.expires),
         "revoked_at": _when(r.revoked)} for r in records])


def _days(text: str) -> float | str | None:
    """The form's ``expires_days``: None for never, a unix time, or what is wrong with it."""
    text = text.strip()
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= MAX_DAYS:
        return f"Expiry: a whole number of days from 1 to {MAX_DAYS}, or blank for never."
    return time.time() + int(text) * 86_400


def key_handlers(kit: Kit) -> list[Any]:
    """The key actions of the tenant page."""

    async def acting(request: AnyRequest, tenant: str
                     ) -> tuple[Session, dict[str, str], KeyStore] | Response[Any]:
        posted = await kit.posted(request)
        if not isinstance(posted, tuple):
            return posted
        session, form = posted
        own = kit.own_tenant(session, tenant)
        if not isinstance(own, Session):
            return own
        store = _store_for(kit, tenant)
        if isinstance(store, str):
            return kit.refuse(409, store, session)
        return session, form, store

    def actor(session: Session) -> str:
        return "operator" if session.role == "operator" else f"tenant {session.tenant}"

    @post("/console/tenants/{tenant:str}/keys", status_code=200)
    async def create(request: AnyRequest, tenant: str) -> Response[Any]:
        allowed = await acting(request, tenant)
        if not isinstance(allowed, tuple):
            return allowed
        session, form, store = allowed
        name = form.get("name", "").strip()
        expires = _days(form.get("expires_days", ""))
        if isinstance(expires, str) or len(name) > MAX_NAME:
            message = expires if isinstance(expires, str) else \
                f"Name: at most {MAX_NAME} characters."
            return kit.refuse(400, message, session)
        try:
            record, key = await create_key(store, kit.current().policy, tenant, name=name,
                                           expires=expires)
        except KeyAdminError as exc:
            return kit.refuse(400, str(exc), session)
        _log.info("console: key %s created for tenant %s", record.id, tenant)
        kit.services.audit.record(f"/console/tenants/{tenant}/keys", kit.client(request),
                                  actor(session), f"created key {record.id} of {tenant}", 200)
        return kit.page("key_created.html", session=session, tenant=tenant, key=key,
                        record={**public_view(record), "expires_at": _when(record.expires)})

    @post("/console/tenants/{tenant:str}/keys/{key_id:str}/revoke", status_code=303)
    async def revoke(request: AnyRequest, tenant: str, key_id: str) -> Response[Any]:
        allowed = await acting(request, tenant)
        if not isinstance(allowed, tuple):
            return allowed
        session, _, store = allowed
        path = f"/console/tenants/{tenant}/keys/{key_id}/revoke"
        record = await store.by_id(key_id)
        if record is None or record.tenant != tenant:
            _log.warning("console: %s tried to revoke key %s, not one of tenant %s",
                         actor(session), key_id[:64], tenant)
            kit.services.audit.record(path, kit.client(request), actor(session),
                                      f"revoke of key {key_id[:64]} refused: not {tenant}'s",
                                      404)
            return kit.refuse(404, "No such key of this tenant.", session)
        await store.revoke(key_id)
        _log.info("console: key %s of tenant %s revoked", key_id, tenant)
        kit.services.audit.record(path, kit.client(request), actor(session),
                                  f"revoked key {key_id} of {tenant}", 303)
        return Response("", status_code=303,
                        headers={"location": f"/console/tenants/{tenant}#keys"})

    return [create, revoke]
