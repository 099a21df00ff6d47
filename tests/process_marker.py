"""The ``process`` marker: the test starts an OS process (a gateway, redis-server, PostgreSQL,
llama-server, an agent, Chromium, nginx, a ``python -c`` child, a CLI run).

``pytest -m "not process"`` runs the in-process tests only; ``-m process`` the others. A test
gets the marker in one of these ways (``tests/conftest.py`` wires the hooks):

* it uses, directly or through other fixtures, a fixture defined with :func:`starts_process`
  under its ``@pytest.fixture`` (``gateway``, ``redis_proc``, ``postgres_url``, ...): the
  collection hook marks it (:func:`mark_process_items`, run before ``-m`` deselects);
* its module says ``pytestmark = pytest.mark.process`` (it starts processes itself, or through
  helpers such as ``GatewayProcess``), or the test says ``@pytest.mark.process``;
* a fixture starts a process for some of its params only: ``pytest.param("postgresql",
  marks=pytest.mark.process)``;
* its module is listed in :data:`MARKED_HERE`.

A marker that is missing does not go unnoticed: while an unmarked test sets up and runs,
:func:`unmarked_processes` notes every process started (an audit hook sees ``subprocess``,
``os.fork``, ``os.posix_spawn``, ``os.system``, ``os.exec*``), and the test then fails, naming
what it started. (Teardowns are not watched: the last test of a session may be the one that
stops a shared server.)
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

__all__ = ["PROCESS", "mark_process_items", "process_fixture", "starts_process",
           "unmarked_processes"]

PROCESS = pytest.mark.process
_ATTR = "_starts_process"

F = TypeVar("F", bound=Callable[..., Any])


def starts_process(func: F) -> F:
    """Declares that a fixture starts an OS process (put it under ``@pytest.fixture``): every
    test that uses the fixture gets the ``process`` marker."""
    setattr(func, _ATTR, True)
    return func


def process_fixture(item: pytest.Item) -> str | None:
    """The name of a fixture in ``item``'s closure that starts a process, or None. Where a
    fixture overrides another of its name, the overridden one counts only if it is requested
    (``def gateway(gateway)``): ``batch/test_stop.py``'s in-process ``gateway`` is not the
    process of ``tests/conftest.py``."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in item.fixturenames:
        for fixturedef in reversed(info.name2fixturedefs.get(name, ())):
            if getattr(fixturedef.func, _ATTR, False):
                return name
            if name not in fixturedef.argnames:
                break
    return None


# modules that start processes but do not say so themselves (tests/test_docs.py builds the site
# with mkdocs in a child process; it belongs with the docs and carries no suite plumbing)
MARKED_HERE = frozenset({"test_docs.py"})
TESTS = Path(__file__).resolve().parent


def _marked_here(item: pytest.Item) -> bool:
    try:
        return item.path.resolve().relative_to(TESTS).as_posix() in MARKED_HERE
    except ValueError:
        return False


def mark_process_items(items: Sequence[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("process") is None and (
            process_fixture(item) is not None or _marked_here(item)
        ):
            item.add_marker(PROCESS)


# processes started while an unmarked test's setup or call ran, innermost watch last
_watches: list[list[str]] = []
_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                     "os.system", "os.exec"})


def _describe(event: str, args: tuple[Any, ...]) -> str:
    if event == "subprocess.Popen":  # (executable, args, cwd, env)
        argv = args[1]
        what = argv if isinstance(argv, str | bytes) else " ".join(map(str, argv))
    elif event in ("os.posix_spawn", "os.exec", "os.spawn"):  # ([mode,] path, argv, env)
        what = " ".join(map(str, args[-2]))
    elif event == "os.system":
        what = str(args[0])
    else:
        what = "a child of this process"
    return f"{event}: {str(what)[:200]}"


# probes a library makes once per interpreter, whichever test comes first: not the test's own
# process (``platform.platform()``, which the OpenAI SDK calls for its headers, runs ``uname -p``)
INCIDENTAL = frozenset({"uname"})


def _incidental(event: str, args: tuple[Any, ...]) -> bool:
    if event != "subprocess.Popen":  # (executable, args, cwd, env)
        return False
    argv = args[1]
    words = (os.fsdecode(argv).split() if isinstance(argv, str | bytes | os.PathLike)
             else [os.fsdecode(word) for word in argv])
    return bool(words) and os.path.basename(words[0]) in INCIDENTAL


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _watches or event not in _EVENTS:
        return
    try:  # an audit hook that raises would fail the start itself
        if not _incidental(event, args):
            _watches[-1].append(_describe(event, args))
    except Exception:
        _watches[-1].append(event)


sys.addaudithook(_audit)


@contextlib.contextmanager
def unmarked_processes(item: pytest.Item) -> Iterator[None]:
    """Fails an unmarked ``item`` that starts a process while the block runs (the block
    finished without an exception of its own; otherwise that exception is the report)."""
    if item.get_closest_marker("process") is not None:
        yield
        return
    seen: list[str] = []
    _watches.append(seen)
    try:
        yield
    finally:
        assert _watches.pop() is seen
    if seen:
        started = "\n  ".join(dict.fromkeys(seen))
        pytest.fail(
            f"{item.nodeid} started an OS process but has no `process` marker: give its module "
            "`pytestmark = pytest.mark.process` (or the test `@pytest.mark.process`, or its "
            "fixture `@starts_process` from tests/process_marker.py). It started:\n  "
            f"{started}",
            pytrace=False,
        )
