"""The ceiling on a request's output limit (issue 34, point 8), through a real gateway in front
of the simulator, with the official clients: every dialect's limit field above the model's
``max_output_tokens`` (here its default, 32768), and limits that are no positive integer
(``1e18`` as a float, a string, a boolean), are a 400 in the client's API naming the field
(and the bound), never a 500; such a request is not admitted (no rpm slot taken, no usage
record) and never reaches the backend.

The simulator's context is set below the gateway's bound (20,000 tokens) so that a request the
gateway let through would come back as the simulator's own 400, quickly, without generating
32k tokens: the bound in the message is the gateway's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.config.model import DEFAULT_MAX_OUTPUT_TOKENS
from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy, usage_records

pytestmark = pytest.mark.process

ADMIN = "admin-output-limit"
BOUND = DEFAULT_MAX_OUTPUT_TOKENS
HUGE = 10**18
#: over the bound (by one, and absurdly), and not a positive integer at all
OVER = [BOUND + 1, HUGE]
NOT_INTS: list[Any] = [1e18, "100", True, 0, -5, 2.5]
RPM = 10_000


@pytest.fixture(scope="module", params=["translated", "passthrough"])
def gw(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
       monkeypatch_module: pytest.MonkeyPatch) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("output-limit")
    monkeypatch_module.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    with SimServer("interactive", speedup=20, jitter=0.0, kv_tokens=20_000) as sim:
        data = policy({"chat": [sim.url]})
        if request.param == "passthrough":  # Responses and Messages reach it unchanged
            data["pools"][0]["backends"][0]["api"] = ["responses", "messages"]
        data["auth"]["keys"][0]["tenant"] = "acme"
        data["plans"] = [{"name": "p", "limits": {"rpm": RPM, "tpm": 10_000_000}}]
        data["tenants"] = [{"name": "acme", "plan": "p"}]
        with GatewayProcess(tmp, data) as gateway:
            gateway.sim = sim  # type: ignore[attr-defined]
            yield gateway


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _openai(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)


def _anthropic(gw: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0)


def _sim_requests(gw: GatewayProcess) -> int:
    """Requests the simulator was sent, over every API."""
    stats = gw.sim.stats()  # type: ignore[attr-defined]
    return sum(api["requests"] for api in stats["apis"].values())


def _remaining_requests(gw: GatewayProcess) -> int:
    """The tenant's rpm left after one small admitted chat request."""
    raw = _openai(gw).chat.completions.with_raw_response.create(
        model="chat-model", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    return int(raw.headers["x-ratelimit-remaining-requests"])


def _records(gw: GatewayProcess) -> list[dict[str, Any]]:
    return usage_records(gw.url, ADMIN)


def _refused(gw: GatewayProcess, calls: list[tuple[Any, Callable[[], Any]]],
             error: type[Exception], check: Callable[[Any, dict[str, Any]], None]) -> None:
    """Each call is refused with ``error`` (a 400), its body checked by ``check``; none of
    them takes an rpm slot, leaves a usage record or reaches the simulator."""
    before = _remaining_requests(gw)
    sent = _sim_requests(gw)
    ids = []
    for value, call in calls:
        with pytest.raises(error) as refused:
            call()
        response: httpx.Response = refused.value.response  # type: ignore[attr-defined]
        assert response.status_code == 400, (value, response.text)
        check(value, response.json())
        ids.append(response.headers["x-request-id"])
    assert _sim_requests(gw) == sent  # nothing forwarded
    # nothing admitted: only the probe request took a slot (<=: the rolling window may free one)
    assert before - _remaining_requests(gw) <= 1
    recorded = {r["request_id"] for r in _records(gw)}
    assert not recorded & set(ids)


def _openai_check(param: str) -> Callable[[Any, dict[str, Any]], None]:
    def check(value: Any, body: dict[str, Any]) -> None:
        error = body["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, body
        assert param in error["message"]
        if isinstance(value, int) and not isinstance(value, bool) and value > BOUND:
            assert str(BOUND) in error["message"] and "chat-model" in error["message"]
            assert error["code"] == "invalid_value"
    return check


def _anthropic_check(value: Any, body: dict[str, Any]) -> None:
    assert body["type"] == "error", body
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    if isinstance(value, int) and not isinstance(value, bool) and value > BOUND:
        assert str(BOUND) in body["error"]["message"]


MESSAGES: list[Any] = [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_chat_limits_above_the_bound_are_400(gw: GatewayProcess, field: str) -> None:
    client = _openai(gw)
    calls: list[tuple[Any, Callable[[], Any]]] = []
    for value in [*OVER, *NOT_INTS]:
        for stream in (False, True):
            calls.append((value, lambda v=value, s=stream: client.chat.completions.create(
                model="chat-model", messages=MESSAGES, stream=s, **{field: v})))
    _refused(gw, calls, openai.BadRequestError, _openai_check(field))
    # at the bound the gateway forwards it (and the simulator, whose context is smaller,
    # refuses it in its own words): the ceiling is the model's, not one below it
    sent = _sim_requests(gw)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="chat-model", messages=MESSAGES,
                                       **{field: BOUND})  # type: ignore[arg-type]
    assert "20000" in refused.value.message  # the simulator's context, not the gateway's
    assert _sim_requests(gw) == sent + 1


def test_completions_limit_above_the_bound_is_400(gw: GatewayProcess) -> None:
    client = _openai(gw)
    calls: list[tuple[Any, Callable[[], Any]]] = [
        (value, lambda v=value: client.completions.create(
            model="chat-model", prompt="Hello", max_tokens=v))
        for value in [*OVER, *NOT_INTS]]
    _refused(gw, calls, openai.BadRequestError, _openai_check("max_tokens"))


def test_responses_limit_above_the_bound_is_400(gw: GatewayProcess) -> None:
    client = _openai(gw)
    calls: list[tuple[Any, Callable[[], Any]]] = []
    for value in [*OVER, *NOT_INTS]:
        for stream in (False, True):
            calls.append((value, lambda v=value, s=stream: client.responses.create(
                model="chat-model", input="Hello", stream=s, max_output_tokens=v)))
    _refused(gw, calls, openai.BadRequestError, _openai_check("max_output_tokens"))


def test_messages_limit_above_the_bound_is_400_in_anthropics_shape(gw: GatewayProcess) -> None:
    client = _anthropic(gw)
    calls: list[tuple[Any, Callable[[], Any]]] = []
    for value in [*OVER, *NOT_INTS]:
        for stream in (False, True):
            # an explicit timeout: else the client sizes one from max_tokens, and refuses
            # a large one itself, never sending it
            calls.append((value, lambda v=value, s=stream: client.messages.create(
                model="chat-model", messages=MESSAGES, stream=s, max_tokens=v, timeout=30)))
    _refused(gw, calls, anthropic.BadRequestError, _anthropic_check)
