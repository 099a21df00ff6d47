"""Batch and file ids are the gateway's own and unguessable (issue 34, point 5): a prefix and
128 random bits (32 hex digits), no counter, so neither another process nor an id seen tells
the next one."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys

import pytest

from gateway.batch.objects import new_batch_id, new_file_id

_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_MINT = ("from gateway.batch.objects import new_batch_id, new_file_id\n"
         "print(*[new_batch_id() for _ in range(50)], *[new_file_id() for _ in range(50)])")


def _random_part(value: str, prefix: str) -> int:
    assert value.startswith(prefix), value
    rest = value[len(prefix):]
    assert _HEX32.match(rest), f"{value}: not 128 bits as 32 hex digits"
    return int(rest, 16)


def _check(ids: list[str], prefix: str) -> None:
    values = sorted(_random_part(i, prefix) for i in ids)
    assert len(set(values)) == len(ids)
    # no two ids close together (a counter, even behind a random prefix, gives neighbours),
    # and no shared leading bits (a per-process prefix)
    assert min(b - a for a, b in itertools.pairwise(values)) > 2**64
    assert len({i[len(prefix):][:8] for i in ids}) == len(ids)


def test_ids_carry_128_random_bits() -> None:
    _check([new_batch_id() for _ in range(200)], "batch_")
    _check([new_file_id() for _ in range(200)], "file-")


@pytest.mark.process
def test_two_processes_never_collide_or_follow_each_other() -> None:
    minted = [subprocess.run([sys.executable, "-c", _MINT], capture_output=True, text=True,
                             check=True).stdout.split() for _ in range(2)]
    both = [*minted[0], *minted[1], new_batch_id(), new_file_id()]
    _check([i for i in both if i.startswith("batch_")], "batch_")
    _check([i for i in both if i.startswith("file-")], "file-")
