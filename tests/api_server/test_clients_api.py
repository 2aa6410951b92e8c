"""Anthropic's Messages API and Ollama's API on a live ``gguflm serve`` of SmolLM2, driven by
the official ``anthropic`` and ``ollama`` clients (issue 48): at temperature 0 each returns
exactly the words ``/v1/chat/completions`` returns for the same conversation, streamed equals
whole, a forced tool call comes back as that API's tool-call object with valid arguments,
``count_tokens`` equals the prompt's token count, the model listing answers, and bad
requests get that API's own 4xx error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import jsonschema
import ollama
import openai
import pytest

from gguflm.access import AccessPolicy
from test_hostile_server import _health_fast, _post, _start, _stop

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    [{"role": "system", "content": "You are a pirate."},
     {"role": "user", "content": "Say hello to the crew."}],
    [{"role": "user", "content": "Count to three."},
     {"role": "assistant", "content": "One, two, three."},
     {"role": "user", "content": "Now backwards."}],
]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
N = 24
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = _start(smollm2_path, tmp_path_factory.mktemp("clients") / "log.txt",
                       "-np", "2", "-c", "1024")
    yield url.removesuffix("/v1")
    assert proc.poll() is None, "the server died"
    _stop(proc)


def _openai_words(url: str, conv: list[dict]) -> tuple[str, int]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="m", messages=conv, temperature=0, max_tokens=N)
    return r.choices[0].message.content, r.usage.prompt_tokens


def _anthropic_args(conv: list[dict]) -> dict:
    system = [m["content"] for m in conv if m["role"] == "system"]
    args = {"model": "smollm2", "max_tokens": N, "extra_body": {"temperature": 0},
            "messages": [m for m in conv if m["role"] != "system"]}
    return args | ({"system": system[0]} if system else {})


@pytest.mark.parametrize("i", range(len(CONVERSATIONS)))
def test_anthropic_says_what_openai_says(server: str, i: int) -> None:
    conv = CONVERSATIONS[i]
    words, n_prompt = _openai_words(server, conv)
    client = anthropic.Anthropic(base_url=server, api_key="x", max_retries=0)
    whole = client.messages.create(**_anthropic_args(conv))
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text == words
    assert whole.usage.input_tokens == n_prompt and whole.role == "assistant"
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.id.startswith("msg_")
    with client.messages.stream(**_anthropic_args(conv)) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == words and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    count = client.messages.count_tokens(**{k: v for k, v in _anthropic_args(conv).items()
                                            if k not in ("max_tokens", "extra_body")})
    assert count.input_tokens == n_prompt


@pytest.mark.parametrize("i", range(len(CONVERSATIONS)))
def test_ollama_says_what_openai_says(server: str, i: int) -> None:
    conv = CONVERSATIONS[i]
    words, n_prompt = _openai_words(server, conv)
    client = ollama.Client(host=server)
    options = {"temperature": 0, "num_predict": N}
    whole = client.chat(model="smollm2-135m", messages=conv, options=options)
    assert whole.message.content == words and whole.done and whole.prompt_eval_count == n_prompt
    parts = list(client.chat(model="smollm2-135m", messages=conv, options=options,
                             stream=True))
    assert "".join(p.message.content for p in parts) == words
    assert parts[-1].done and parts[-1].done_reason == whole.done_reason
    assert all(not p.done for p in parts[:-1]) and parts[-1].eval_count == whole.eval_count
    gen = client.generate(model="smollm2-135m", prompt=conv[-1]["content"], options=options,
                          system=conv[0]["content"] if conv[0]["role"] == "system" else None)
    if len(conv) <= 2:  # one turn: generate renders the same prompt as chat
        assert gen.response == words


def test_ollama_raw_generate_continues_text_as_completions_do(server: str) -> None:
    prompt = "The capital of France is"
    status, out = _post(server, "/v1/completions", json.dumps(
        {"prompt": prompt, "max_tokens": 8, "temperature": 0}))
    assert status == 200
    client = ollama.Client(host=server)
    gen = client.generate(model="x", prompt=prompt, raw=True,
                          options={"temperature": 0, "num_predict": 8})
    assert gen.response == out["choices"][0]["text"]
    assert len(gen.context) == out["usage"]["total_tokens"]  # the prompt's ids and the reply's


def _weather_tool_anthropic() -> dict:
    return {"name": "get_weather", "description": "The weather in a city",
            "input_schema": WEATHER}


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"}, {"type": "any"}])
def test_anthropic_forced_tool_call(server: str, choice: dict) -> None:
    client = anthropic.Anthropic(base_url=server, api_key="x", max_retries=0)
    args = {"model": "m", "max_tokens": 256, "extra_body": {"temperature": 0},
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [_weather_tool_anthropic()], "tool_choice": choice}
    msg = client.messages.create(**args)
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and len(uses) >= 1
    assert uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER)
    with client.messages.stream(**args) as stream:
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(b.name, b.input) for b in uses]
    # the round trip: the call and its result in the history render and run
    follow = client.messages.create(**args | {"tool_choice": {"type": "none"}, "messages": [
        args["messages"][0], {"role": "assistant", "content": [u.model_dump() for u in uses]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "18 degrees, sunny"}]}]})
    assert follow.content and follow.content[0].type == "text"


def test_ollama_tools_and_a_call_in_the_history(server: str) -> None:
    client = ollama.Client(host=server)
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                             "parameters": WEATHER}}
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather",
                                 "arguments": {"city": "Paris", "unit": "celsius"}}}]},
               {"role": "tool", "content": "18 degrees", "tool_name": "get_weather"}]
    r = client.chat(model="m", messages=history, tools=[tool],
                    options={"temperature": 0, "num_predict": 16})
    assert r.done and r.message.role == "assistant"


def test_ollama_format_holds_the_reply_to_a_schema(server: str) -> None:
    client = ollama.Client(host=server)
    r = client.chat(model="m", messages=[{"role": "user", "content": "Weather in Rome?"}],
                    format=CITY, options={"temperature": 0, "num_predict": 256})
    jsonschema.validate(json.loads(r.message.content), CITY)


def test_ollama_listing(server: str) -> None:
    client = ollama.Client(host=server)
    served = openai.OpenAI(base_url=server + "/v1", api_key="x").models.list().data[0].id
    tags = client.list().models
    assert len(tags) == 1 and tags[0].model == served.removesuffix(".gguf") + ":latest"
    assert tags[0].details.format == "gguf" and tags[0].details.family == "llama"
    assert tags[0].details.quantization_level == "Q4_1" and tags[0].size > 0
    show = client.show("smollm2-135m")
    assert "im_start" in show.template and "completion" in show.capabilities
    assert show.modelinfo["general.architecture"] == "llama"
    assert client.ps().models[0].context_length == 1024
    emb = client.embed(model="smollm2-135m", input=["hello", "world"]).embeddings
    assert len(emb) == 2 and len(emb[0]) == 576
    assert abs(sum(v * v for v in emb[0]) - 1) < 1e-4  # normalized, as Ollama's are
    old = client.embeddings(model="smollm2-135m", prompt="hello").embedding
    assert len(old) == 576
    assert client.pull(tags[0].model).status == "success"
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("llama3.3:70b")
    assert e.value.status_code == 404


@pytest.mark.parametrize("body, status, match", [
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, 400, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": []}, 400, "at least one"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AA=="}}]}]}, 400, "image"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, 400,
     "role"),
    ({"model": "m", "max_tokens": "lots", "messages": []}, 400, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "tool type"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tool_choice": {"type": "sometimes"}}, 400, "tool_choice"),
])
def test_anthropic_errors_are_anthropic_shaped(server: str, body: dict, status: int,
                                               match: str) -> None:
    got, out = _post(server, "/v1/messages", json.dumps(body))
    assert got == status, out
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error"
    assert match in out["error"]["message"]
    client = anthropic.Anthropic(base_url=server, api_key="x", max_retries=0)
    if "max_tokens" in body and isinstance(body["max_tokens"], int):
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(**body)
    _health_fast(server)


@pytest.mark.parametrize("path, body, match", [
    ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "x",
                                               "images": ["AA=="]}]}, "images"),
    ("/api/chat", {"model": "m", "messages": "hi"}, "messages"),
    ("/api/chat", {"model": "m", "messages": [], "options": {"temperature": "hot"}},
     "temperature"),
    ("/api/chat", {"model": "m", "messages": [], "options": {"num_predict": -5}},
     "num_predict"),
    ("/api/chat", {"model": "m", "messages": [], "format": "xml"}, "format"),
    ("/api/generate", {"model": "m", "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ("/api/embed", {"model": "m"}, "input"),
])
def test_ollama_errors_are_ollama_shaped(server: str, path: str, body: dict,
                                         match: str) -> None:
    got, out = _post(server, path, json.dumps(body | {"stream": False}))
    assert got == 400 and set(out) == {"error"} and match in out["error"], out
    if match == "images":  # (the client checks the other bodies' types itself)
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=server).chat(**body)
        assert e.value.status_code == 400


def test_x_api_key_is_taken_as_the_bearer_token() -> None:
    policy = AccessPolicy((), "s3cret", ("127.0.0.1",))
    assert policy.key_error("/v1/messages", {"x-api-key": "s3cret"}) is None
    assert policy.key_error("/v1/messages", {"Authorization": "Bearer s3cret"}) is None
    assert policy.key_error("/v1/messages", {"x-api-key": "wrong"}) is not None
    assert policy.key_error("/v1/messages", {}) is not None


# --- OpenAI's Responses API --------------------------------------------------------------------

def _responses(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


@pytest.mark.parametrize("i", range(len(CONVERSATIONS)))
def test_responses_say_what_chat_says(server: str, i: int) -> None:
    conv = CONVERSATIONS[i]
    words, n_prompt = _openai_words(server, conv)
    client = _responses(server)
    system = [m["content"] for m in conv if m["role"] == "system"]
    args = {"model": "m", "temperature": 0, "max_output_tokens": N,
            "input": [m for m in conv if m["role"] != "system"]}
    args |= {"instructions": system[0]} if system else {}
    whole = client.responses.create(**args)
    assert whole.output_text == words and whole.usage.input_tokens == n_prompt
    assert whole.status in ("completed", "incomplete")
    events = list(client.responses.create(**args, stream=True))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == words
    last = events[-1]  # response.incomplete when max_output_tokens cut it, as OpenAI's
    assert last.type == f"response.{whole.status}" and last.response.output_text == words
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_continue_a_previous_response(server: str) -> None:
    client = _responses(server)
    first = client.responses.create(model="m", input=CONVERSATIONS[2][0]["content"],
                                    temperature=0, max_output_tokens=N)
    second = client.responses.create(model="m", input="Now backwards.", temperature=0,
                                     max_output_tokens=N, previous_response_id=first.id)
    conv = [{"role": "user", "content": CONVERSATIONS[2][0]["content"]},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "Now backwards."}]
    assert second.output_text == _openai_words(server, conv)[0]
    with pytest.raises(openai.BadRequestError, match="not found"):
        client.responses.create(model="m", input="x", previous_response_id="resp_nope")


def test_responses_forced_tool_call_and_schema(server: str) -> None:
    client = _responses(server)
    tool = {"type": "function", "name": "get_weather", "description": "The weather",
            "parameters": WEATHER}
    r = client.responses.create(model="m", input="Weather in Paris?", tools=[tool],
                                tool_choice="required", temperature=0, max_output_tokens=256)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    follow = client.responses.create(model="m", temperature=0, max_output_tokens=16, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C"}],
        tools=[tool])
    assert follow.status in ("completed", "incomplete")
    fmt = {"format": {"type": "json_schema", "name": "weather", "schema": CITY}}
    r = client.responses.create(model="m", input="Weather in Rome?", text=fmt,
                                temperature=0, max_output_tokens=256)
    jsonschema.validate(json.loads(r.output_text), CITY)


@pytest.mark.parametrize("body, match", [
    ({"model": "m"}, "input"),
    ({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]}, "input_image"),
    ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tool type"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
])
def test_responses_errors_are_openai_errors(server: str, body: dict, match: str) -> None:
    got, out = _post(server, "/v1/responses", json.dumps(body))
    assert got == 400 and match in out["error"]["message"], out
