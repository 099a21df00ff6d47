"""The hash-tag rule, written once: both stores' tags are built by it."""

from __future__ import annotations

import pytest

from gateway.quota.errors import InvalidQuotaRequest
from gateway.quota.keys import tenant_tag as quota_tag
from gateway.redis import InvalidTag, escape_tag, hash_tag


def test_a_tag_is_the_prefix_and_the_name_in_braces() -> None:
    assert hash_tag("gw:x:", "acme") == "gw:x:{acme}"


@pytest.mark.parametrize("name", ["", "a{b", "a}b", "{}"])
def test_names_that_would_break_the_tag_are_refused(name: str) -> None:
    with pytest.raises(InvalidTag):
        hash_tag("gw:x:", name)


@pytest.mark.parametrize(("name", "escaped"), [
    ("acme", "acme"), ("a}b{c%", "a%7Db%7Bc%25"), ("50%", "50%25"), ("", "%")])
def test_escaping_makes_every_name_a_valid_distinct_tag(name: str, escaped: str) -> None:
    assert escape_tag(name) == escaped
    assert hash_tag("p:", escape_tag(name)) == f"p:{{{escaped}}}"


def test_the_stores_use_the_rule() -> None:
    """Their key names are unchanged (data written before this module still reads back)."""
    assert quota_tag("acme") == "gw:q:{acme}"
    with pytest.raises(InvalidQuotaRequest, match="hash tag"):
        quota_tag("a{b")
    with pytest.raises(InvalidQuotaRequest):
        quota_tag("")
