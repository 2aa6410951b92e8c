"""Structured output through every adapter: ``gguflm.LLM`` (response_format, grammar,
regex, tools), the server with the official ``openai`` client (JSON schema, tool calls
required and named, streaming and not), ``gguflm run --json-schema``, and bad input as one
clear error (400 with an OpenAI error object, or one ``error:`` line)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gguflm.api import LLM, InvalidRequestError
from gguflm.cli import main
from gguflm.server import APIServer, make_server

openai = pytest.importorskip("openai", reason="the openai client is a test dependency")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a test dependency")

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 16},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "minLength": 1,
                                           "maxLength": 20}}}}}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> Iterator[LLM]:
    model = LLM(smollm2_path, n_ctx=1024)
    yield model
    model.close()


@pytest.fixture(scope="module")
def server(llm: LLM) -> Iterator[APIServer]:
    srv = make_server(llm, "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def client(server: APIServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def test_llm_response_format_regex_and_grammar(llm: LLM) -> None:
    for temp in (0.0, 0.8):
        out = llm.chat(ASK, max_tokens=60, temperature=temp, seed=3, response_format={
            "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
        choice = out["choices"][0]
        jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
        assert choice["finish_reason"] == "stop"
    out = llm.generate("The year is", max_tokens=8, regex=r"[12][0-9]{3}")
    assert out["choices"][0]["text"].isdigit() and len(out["choices"][0]["text"]) == 4
    out = llm.generate("Answer:", max_tokens=8, grammar='root ::= "yes" | "no"')
    assert out["choices"][0]["text"] in ("yes", "no")
    # streamed; json_object with a schema beside it (llama-server's form) bounds the object
    chunks = list(llm.chat(ASK, stream=True, max_tokens=60, temperature=0,
                           response_format={"type": "json_object", "schema": PERSON}))
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    jsonschema.validate(json.loads(text), PERSON)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_llm_tool_calls_required_and_named(llm: LLM) -> None:
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        out = llm.chat(WEATHER_ASK, tools=[WEATHER], tool_choice=choice, max_tokens=60,
                       temperature=0)
        c = out["choices"][0]
        assert c["finish_reason"] == "tool_calls"
        call = c["message"]["tool_calls"][0]
        assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["function"]["arguments"]),
                            WEATHER["function"]["parameters"])


def test_openai_client_json_schema_and_tools(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m", messages=ASK, max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person",
                                                                "schema": PERSON,
                                                                "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    assert r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="m", messages=WEATHER_ASK, tools=[WEATHER],
                                       tool_choice="required", max_tokens=60, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    # streamed: the deltas add up to one call with valid arguments
    stream = client.chat.completions.create(
        model="m", messages=WEATHER_ASK, tools=[WEATHER], max_tokens=60, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True)
    calls, finish, _ = _streamed_calls(stream)
    assert calls and finish == "tool_calls"
    for name, args in calls:  # parallel calls allowed: each one valid
        assert name == "get_weather"
        jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])


def _streamed_calls(stream: Any) -> tuple[list[list[str]], str | None, str | None]:
    """What a client makes of a chat stream: [name, arguments] per call index, the
    finish_reason and gguflm's finish_detail."""
    calls: dict[int, list[str]] = {}
    finish = detail = None
    for chunk in stream:
        if not chunk.choices:
            continue
        for tc in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(tc.index, ["", ""])
            call[0] = tc.function.name or call[0]
            call[1] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
        detail = (chunk.choices[0].model_extra or {}).get("finish_detail") or detail
    return [calls[i] for i in sorted(calls)], finish, detail


@pytest.mark.parametrize("stream", [False, True])
def test_required_parallel_calls_are_whole_within_any_budget(client: openai.OpenAI,
                                                             stream: bool) -> None:
    """tool_choice "required" with parallel calls on (the default): SmolLM2 would repeat
    the call until max_tokens; the repeat ends the reply, and a budget that runs out
    inside a call leaves that call out and says so, never half an argument object."""
    for max_tokens in (200, 64, 40, 24, 8):
        args = dict(model="m", messages=WEATHER_ASK, tools=[WEATHER], tool_choice="required",
                    max_tokens=max_tokens, temperature=0)
        if stream:
            got, finish, detail = _streamed_calls(client.chat.completions.create(
                **args, stream=True))
        else:
            r = client.chat.completions.create(**args)
            finish = r.choices[0].finish_reason
            detail = (r.choices[0].model_extra or {}).get("finish_detail")
            got = [[c.function.name, c.function.arguments]
                   for c in r.choices[0].message.tool_calls or []]
        keys = [json.dumps(json.loads(a), sort_keys=True) for _, a in got]  # whole JSON
        assert len(set(keys)) == len(keys), got  # no call twice
        for name, a in got:
            assert name == "get_weather"
            jsonschema.validate(json.loads(a), WEATHER["function"]["parameters"])
        if finish == "length":  # only when the budget ran out inside a call
            assert "ran out inside a tool call" in detail, (max_tokens, got)
        else:
            assert finish == "tool_calls" and got and detail is None, (max_tokens, finish)
        if max_tokens >= 64:
            assert finish == "tool_calls" and len(got) == 1, (max_tokens, got)
        if max_tokens == 8:  # too few for even one call
            assert finish == "length" and not got


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"grammar": "root ::= [unclosed"}, "grammar"),
    ({"regex": "("}, "regex"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
    ({"response_format": {"type": "xml"}}, "response_format"),
])
def test_bad_constraints_are_400s(client: openai.OpenAI, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        # llama-server's own fields go in extra_body, as the openai client requires
        named = {k: v for k, v in extra.items() if k in ("response_format", "tools")}
        client.chat.completions.create(model="m", messages=ASK, max_tokens=4, **named,
                                       extra_body={k: v for k, v in extra.items()
                                                   if k not in named})
    err = info.value.body
    assert err["param"].startswith(param) and err["message"]


def test_bad_constraints_raise_in_the_api(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError) as info:
        llm.generate("x", json_schema={"type": "object", "properties": 5})
    assert info.value.param.startswith("json_schema")


def test_run_json_schema_and_its_errors(smollm2_path: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    assert main(["run", str(smollm2_path), "-p", "A person as JSON:", "-n", "60", "--temp",
                 "0", "--json-schema", str(schema), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(json.loads(out["text"]), PERSON)
    assert main(["run", str(smollm2_path), "-p", "x", "--grammar",
                 str(tmp_path / "missing.gbnf")]) == 1
    assert main(["run", str(smollm2_path), "-p", "x", "--regex", "("]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)
