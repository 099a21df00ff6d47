"""A tenant's batch jobs on its console page: its own, as ``GET /v1/batches`` lists them, and
never another tenant's."""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from tests.console.conftest import ACME_KEY, GLOBEX_KEY, sign_in

pytestmark = pytest.mark.process

if TYPE_CHECKING:
    from tests.helpers import GatewayProcess


def _batch(url: str, key: str) -> str:
    """A one-line batch of ``key``'s tenant; its id."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    line = json.dumps({"custom_id": "c-1", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "chat-model", "max_tokens": 4,
                                "messages": [{"role": "user", "content": "hi"}]}})
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(line.encode() + b"\n")),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    return batch.id


def _page(url: str, key: str, tenant: str) -> str:
    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as c:
        assert sign_in(c, key).status_code == 303
        page = c.get(f"/console/tenants/{tenant}")
        assert page.status_code == 200
        return page.text


def test_a_tenant_sees_its_batches_and_not_anothers(console: GatewayProcess) -> None:
    mine = _batch(console.url, ACME_KEY)
    theirs = _batch(console.url, GLOBEX_KEY)
    acme = _page(console.url, ACME_KEY, "acme")
    assert 'id="batch-list"' in acme
    assert f'data-batch-id="{mine}"' in acme
    assert theirs not in acme
    globex = _page(console.url, GLOBEX_KEY, "globex")
    assert f'data-batch-id="{theirs}"' in globex and mine not in globex
