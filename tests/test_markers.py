"""The ``process`` marker (``tests/process_marker.py``) is on the tests that start OS processes
and on no others: ``-m "not process"`` keeps the in-process tests and deselects the rest, by each
way a test gets the marker; and an unmarked test that starts a process fails."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.process_marker import process_fixture, unmarked_processes

# test id (or its start, for parametrized tests) -> whether it starts a process
KNOWN = {
    # the module's pytestmark
    "tests/gateway/test_routing_e2e.py::test_retry_budget_caps_retries": True,
    # postgres_url -> postgres_server, @starts_process in tests/conftest.py
    "tests/ledger/test_postgres_server.py::test_table_round_trip": True,
    "tests/ledger/test_postgres_server.py::test_missing_binaries_name_the_package": False,
    # a fixture param: make_ledger's "postgresql" starts nothing itself but needs postgres_url
    "tests/ledger/test_stores.py::test_same_record_twice_counts_once[postgresql]": True,
    "tests/ledger/test_stores.py::test_same_record_twice_counts_once[sqlite]": False,
    # a module's own fixture (it overrides the conftest's ``gateway`` with a process of its own)
    "tests/upstream/test_forward_backend_answers.py::test_5xx_body_is_not_copied_into_the_502":
        True,
    "tests/upstream/test_forward_backend_answers.py::test_parse_retry_after[": False,
    # one test of a module
    "tests/batch/test_ids.py::test_two_processes_never_collide_or_follow_each_other": True,
    "tests/batch/test_ids.py::test_ids_carry_128_random_bits": False,
    # a pure unit test
    "tests/routing/test_fair_stagger.py::test_never_when_off_nor_for_a_tenant_alone": False,
}


def _collected(*args: str) -> list[str]:
    files = sorted({test_id.split("::")[0] for test_id in KNOWN})
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *args, *files],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert out.returncode in (0, 5), out.stdout[-3000:] + out.stderr[-3000:]  # 5: none left
    return [line for line in out.stdout.splitlines() if "::" in line]


def _matching(ids: list[str], known: str) -> list[str]:
    return [i for i in ids if i == known or (known.endswith("[") and i.startswith(known))]


@pytest.mark.process  # it runs pytest in a child process, to see what ``-m`` selects
def test_not_process_keeps_the_in_process_tests_and_process_the_others() -> None:
    everything = _collected()
    kept = _collected("-m", "not process")
    deselected = _collected("-m", "process")
    assert sorted(kept + deselected) == sorted(everything)  # each test is in exactly one
    for known, starts in KNOWN.items():
        assert _matching(everything, known), f"{known} is not collected: KNOWN is stale"
        want, other = (deselected, kept) if starts else (kept, deselected)
        assert _matching(want, known) and not _matching(other, known), (
            f"{known} starts a process but -m 'not process' keeps it" if starts
            else f"{known} starts no process but -m 'not process' deselects it")


@pytest.fixture()
def gateway() -> str:
    """An in-process fixture that overrides the conftest's ``gateway`` (a process)."""
    return "in-process"


def test_an_overriding_in_process_fixture_does_not_mark(
        gateway: str, request: pytest.FixtureRequest) -> None:
    assert process_fixture(request.node) is None
    assert request.node.get_closest_marker("process") is None


def test_an_unmarked_test_that_starts_a_process_fails(request: pytest.FixtureRequest) -> None:
    # the audit event a real start raises, without starting anything
    with pytest.raises(pytest.fail.Exception, match="no `process` marker") as failed, \
            unmarked_processes(request.node):
        sys.audit("subprocess.Popen", "/usr/bin/redis-server", ["redis-server", "--port", "1"],
                  None, None)
    assert "subprocess.Popen: redis-server --port 1" in str(failed.value)


def test_an_unmarked_test_that_starts_nothing_passes(request: pytest.FixtureRequest) -> None:
    with unmarked_processes(request.node):
        sys.audit("open", "/dev/null", "r", 0)  # other audit events are no process



def test_a_library_probe_is_not_the_tests_process(request: pytest.FixtureRequest) -> None:
    with unmarked_processes(request.node):  # platform.platform() runs `uname -p` once
        sys.audit("subprocess.Popen", "uname", ["uname", "-p"], None, None)
