"""The overhead bench's requests and checks in each client API, against the gateway's own
front-ends: the bench sends the same content in every API, and its sanity check accepts what
the gateway's translation of the fixture answers and refuses error answers and cut streams
(which would otherwise pass for fast requests)."""

from __future__ import annotations

import json

import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from gateway.dialects.registry import FRONTENDS
from gateway.errors import InvalidRequest
from loadtest.bench.overhead import payloads
from loadtest.bench.overhead.ab import parse_args, quartiles, report, summarize

TRANSLATED = sorted(FRONTENDS)  # messages, responses


def _translated_answer(api: str) -> bytes:
    chat = json.loads(payloads.completion_body())
    body = FRONTENDS[api].answer(chat, model=payloads.MODEL, request_id="req-1",
                                 request=json.loads(payloads.request_body(stream=False, api=api)))
    return json.dumps(body).encode()


def _translated_stream(api: str, piece: int) -> bytes:
    """The fixture's SSE through the front-end's translator, fed in ``piece``-byte chunks
    (events split anywhere), as the relay feeds it."""
    translator = FRONTENDS[api].stream(model=payloads.MODEL, request_id="req-1",
                                       prompt_tokens=9)
    sse = payloads.sse_body().encode()
    out = b"".join(translator.feed(sse[i:i + piece]) for i in range(0, len(sse), piece))
    return out + translator.finish()


def test_every_api_sends_the_chat_request_s_content() -> None:
    chat = json.loads(payloads.request_body(stream=True))
    for api in TRANSLATED:
        for stream in (False, True):
            native = json.loads(payloads.request_body(stream=stream, api=api))
            translated = FRONTENDS[api].to_chat(native)
            assert translated.model == payloads.MODEL
            assert translated.stream is stream
            assert translated.max_output == payloads.STREAM_CHUNKS
            assert [(m["role"], m["content"]) for m in translated.chat["messages"]] == \
                [(m["role"], m["content"]) for m in chat["messages"]]
    with pytest.raises(ValueError):
        payloads.request_body(stream=False, api="completions")


def test_headers_are_each_api_s_own() -> None:
    assert payloads.request_headers("k", "messages")["x-api-key"] == "k"
    assert "Authorization" not in payloads.request_headers("k", "messages")
    for api in ("chat", "responses"):
        assert payloads.request_headers("k", api)["Authorization"] == "Bearer k"


@pytest.mark.parametrize("api", TRANSLATED)
def test_translated_whole_answers_pass_the_check(api: str) -> None:
    body = _translated_answer(api)
    assert payloads.check_response(body, "application/json", stream=False, api=api) is None
    model = Message if api == "messages" else Response
    model.model_validate_json(body)  # the SDK reads it


def test_the_chat_fixture_passes_the_chat_check() -> None:
    body = payloads.completion_body().encode()
    ChatCompletion.model_validate_json(body)
    assert payloads.check_response(body, "application/json", stream=False) is None
    assert payloads.check_response(payloads.sse_body().encode(), "text/event-stream",
                                   stream=True) is None


@pytest.mark.parametrize("api", TRANSLATED)
@pytest.mark.parametrize("piece", [7, 180, 1 << 20])
def test_translated_streams_pass_the_check(api: str, piece: int) -> None:
    body = _translated_stream(api, piece)
    assert payloads.check_response(body, "text/event-stream", stream=True, api=api) is None


@pytest.mark.parametrize("api", TRANSLATED)
def test_error_answers_and_wrong_shapes_fail_the_check(api: str) -> None:
    status, error = FRONTENDS[api].error(InvalidRequest("bad"))
    assert status == 400
    problem = payloads.check_response(error, "application/json", stream=False, api=api)
    assert problem is not None and api in problem
    chat = payloads.completion_body().encode()  # an untranslated answer is not this API's
    assert payloads.check_response(chat, "application/json", stream=False, api=api)
    assert payloads.check_response(_translated_answer(api), "text/plain", stream=False, api=api)
    # a chat client gets neither translated shape
    assert payloads.check_response(_translated_answer(api), "application/json", stream=False)


@pytest.mark.parametrize("api", TRANSLATED)
def test_streams_cut_short_or_untranslated_fail_the_check(api: str) -> None:
    body = _translated_stream(api, 180)
    events = body.split(b"\n\n")
    cut = b"\n\n".join(events[:-2]) + b"\n\n"  # the closing event is missing
    assert payloads.check_response(cut, "text/event-stream", stream=True, api=api)
    fewer = b"\n\n".join(e for e in events if b"delta" not in e or b"hello" not in e)
    assert payloads.check_response(fewer, "text/event-stream", stream=True, api=api)
    assert payloads.check_response(payloads.sse_body().encode(), "text/event-stream",
                                   stream=True, api=api)
    assert payloads.check_response(body, "application/json", stream=True, api=api)


def test_the_ab_tool_names_sides_by_api_and_reports_b_over_a() -> None:
    args = parse_args(["--a-api", "chat", "--b-api", "messages", "--stream"])
    assert (args.a_name, args.b_name, args.stream) == ("chat", "messages", True)
    assert (parse_args([]).a_name, parse_args([]).b_name) == ("A", "B")
    with pytest.raises(SystemExit):
        parse_args(["--a-name", "x", "--b-name", "x"])

    def run(rps: float, cpu_us: float) -> dict[str, float]:
        requests = rps * 2
        return {"rps": rps, "requests": requests, "cpu_s": cpu_us * requests / 1e6,
                "cpu_us_per_request": cpu_us}

    a = [run(1000, 100), run(900, 110), run(1100, 90)]
    b = [run(800, 120), run(700, 143), run(900, 108)]
    s = summarize(["chat", "messages"], {"chat": {}, "messages": {}},
                  {"chat": "chat", "messages": "messages"}, a, b, window_s=2, stream=True)
    assert s["cpu_pair_ratios"] == pytest.approx([1.2, 1.3, 1.2])
    assert s["cpu_per_request_ratio"] == pytest.approx(
        (120 * 1600 + 143 * 1400 + 108 * 1800) / 4800 / ((100 * 2000 + 110 * 1800 + 90 * 2200)
                                                         / 6000))
    assert s["b"]["cpu_us_per_chunk"] == pytest.approx(s["b"]["cpu_us_per_request"] / 64)
    text = report(s)
    assert "messages / chat (stream, 3 pairs)" in text and "CPU µs/chunk" in text
    assert quartiles([5.0]) == (5.0, 5.0, 5.0)


def test_the_translation_profile_runs_every_path(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.accounting.split import PromptCounter
    from loadtest.bench.overhead import translation

    counter = PromptCounter()
    answer = translation.paths("responses", stream=False, piece=1 << 16, counter=counter)()
    assert isinstance(answer, bytes)
    assert payloads.check_response(answer, "application/json", stream=False,
                                   api="responses") is None
    for api in ("chat", *TRANSLATED):  # a stream's bytes sent, fed in small reads
        sent = translation.paths(api, stream=True, piece=100, counter=counter)()
        assert isinstance(sent, int) and sent > 0
    assert translation.main(["--number", "2", "--repeat", "1", "--profile", "3"]) == 0
    out = capsys.readouterr().out
    assert "stream: messages" in out and "non-stream: responses" in out
