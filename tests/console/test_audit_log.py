"""The console's audit trail: its actions go to the admin audit logger as the admin API's
entries do, and the trail keeps both kinds, newest first, paged."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from gateway.api.audit import AdminAudit
from gateway.console.audit_log import AUDIT_LOGGER, AuditTrail

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture()
def trail() -> Iterator[AuditTrail]:
    trail = AuditTrail(keep=5)
    logger = logging.getLogger(AUDIT_LOGGER)
    logger.addHandler(trail)
    yield trail
    logger.removeHandler(trail)


def test_the_trail_keeps_the_apis_and_the_consoles_entries(
        trail: AuditTrail, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, AUDIT_LOGGER)
    scope = {"method": "GET", "client": ("10.0.0.9", 5000)}
    AdminAudit().record(scope, "/admin/keys", "token", 200)  # type: ignore[arg-type]
    trail.record("/console/login", "10.0.0.8", "tenant acme", "signed in with key k", 303)
    rows, more = trail.page(0, 10)
    assert [(r.path, r.auth, r.actor, r.status) for r in rows] == [
        ("/console/login", "console", "tenant acme", 303), ("/admin/keys", "token", "", 200)]
    assert not more and rows[0].at.startswith("20")
    line = [r for r in caplog.records if getattr(r, "admin_path", "") == "/console/login"]
    assert line and "signed in with key k" in line[0].getMessage()
    assert line[0].levelno == logging.INFO


def test_pages_and_the_bound(trail: AuditTrail) -> None:
    for i in range(7):
        trail.record(f"/console/{i}", "-", "operator", "x", 403)
    rows, more = trail.page(0, 2)
    assert [r.path for r in rows] == ["/console/6", "/console/5"] and more
    rows, more = trail.page(4, 2)
    assert [r.path for r in rows] == ["/console/2"] and not more  # 5 kept
