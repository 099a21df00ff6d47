"""Console sessions, in memory and in files: made, found, expired after their minutes, signed
out; the id is never stored (the file is named by its SHA-256), the files are private."""

from __future__ import annotations

import stat
from typing import TYPE_CHECKING

import pytest

from gateway.console.sessions import FileSessions, MemorySessions, Sessions, new_token

if TYPE_CHECKING:
    from pathlib import Path


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Sessions, Clock]:
    clock = Clock()
    if request.param == "memory":
        return MemorySessions(clock), clock
    return FileSessions(tmp_path / "sessions", clock), clock


def test_tokens_are_128_random_bits() -> None:
    tokens = {new_token() for _ in range(1000)}
    assert len(tokens) == 1000
    assert all(len(t) == 22 for t in tokens)  # 16 bytes, URL-safe base64 without padding


async def test_a_session_lives_its_minutes(store: tuple[Sessions, Clock]) -> None:
    """Found until ``minutes`` after it was made, then gone (and dropped)."""
    sessions, clock = store
    session_id, made = await sessions.create("tenant", 30, tenant="acme", key_id="k1",
                                             key_limits={"rpm": 5})
    assert await sessions.get(session_id) == made
    assert made.tenant == "acme" and made.key_limits == {"rpm": 5} and made.csrf != session_id
    clock.now += 30 * 60 - 1
    assert await sessions.get(session_id) == made
    clock.now += 1
    assert await sessions.get(session_id) is None
    clock.now -= 10  # a clock stepping back does not revive it: it was dropped
    assert await sessions.get(session_id) is None


async def test_sign_out_and_unknown_ids(store: tuple[Sessions, Clock]) -> None:
    sessions, _ = store
    session_id, _ = await sessions.create("operator", 5)
    other_id, other = await sessions.create("operator", 5)
    await sessions.delete(session_id)
    assert await sessions.get(session_id) is None
    assert await sessions.get(other_id) == other
    for bad in (None, "", "x" * 65, new_token(), "../../etc/passwd"):
        assert await sessions.get(bad) is None
        await sessions.delete(bad)


async def test_files_hold_no_session_id_and_are_private(tmp_path: Path) -> None:
    """The id is the cookie's alone: neither a file's name nor its content; mode 0600."""
    clock = Clock()
    sessions = FileSessions(tmp_path / "s", clock)
    session_id, _ = await sessions.create("tenant", 1, tenant="acme", key_id="k")
    (path,) = (tmp_path / "s").iterdir()
    assert session_id not in path.name and session_id.encode() not in path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # another store over the same directory (another worker) sees it
    assert await FileSessions(tmp_path / "s", clock).get(session_id) is not None


async def test_expired_files_are_swept(tmp_path: Path) -> None:
    clock = Clock()
    sessions = FileSessions(tmp_path / "s", clock)
    for _ in range(3):
        await sessions.create("operator", 1)
    clock.now += 120  # past their minute and the sweep interval
    await sessions.create("operator", 1)
    assert len(list((tmp_path / "s").iterdir())) == 1
