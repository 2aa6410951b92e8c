"""Constrained decoding (engine/constraints.py) on both real models.

The schema matrix: 32 JSON schemas, one or more per supported feature, generated on SmolLM2
and Gemma 3 at temperature 0 and 0.8 (each schema on one of the four pairs here; all of them
in benchmarks/check_structured.py); every answer must parse, validate (jsonschema, with
format checks) and end with the end-of-generation token. llama.cpp's GBNF grammars
(tests/data/grammars) constrain output to their languages, checked by parsers of our own;
regular expressions and Lark grammars likewise. Bad schemas and grammars give errors that
name the problem and the request field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from constrained import (
    GRAMMAR_PROMPTS,
    GRAMMARS,
    LANGUAGES,
    LLAMA_CPP_GRAMMARS,
    RECURSIVE,
    SCHEMAS,
    Arithmetic,
    Chat,
    Incomplete,
    check_grammar_output,
    check_json,
    in_language,
    obj,
)
from gguflm.engine.constraints import (
    Constraint,
    apply_bitmask,
    fill_bitmasks,
    ll_tokenizer,
    token_bytes,
)
from gguflm.engine.errors import ConstraintError, ConstraintFailure, InvalidRequestError
from gguflm.engine.grammar import (
    constraint_from_request,
    gbnf_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
)
from gguflm.engine.schema import MAX_INTEGER, bounded_schema, embed_schema, schema_from_arg
from gguflm.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def smollm(smollm2_path: Path) -> Chat:
    return Chat.of(smollm2_path)


@pytest.fixture(scope="module")
def gemma(gemma3_path: Path) -> Chat:
    return Chat.of(gemma3_path)


# --- the vocabulary as llguidance sees it ------------------------------------------------------

@pytest.mark.parametrize("name", ["ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"])
def test_token_bytes_are_the_pieces_and_llguidance_reads_our_tokens(
        reference: Path, name: str) -> None:
    """Byte-fallback SentencePiece and GPT-2 byte-level BPE: the fast path gives
    every token's piece; llguidance, fed our tokenization of the test texts, decodes the same
    bytes and accepts them as the literal text (so its token trie is ours)."""
    tok = Tokenizer.from_file(reference / "vocab" / name)
    pieces, special = token_bytes(tok)
    for i in range(tok.n_vocab):
        expect = tok.token_to_piece(i) or tok.token_to_piece(i, special=True)
        assert pieces[i] == expect, f"token {i} {tok.token_text(i)!r}"
    assert special == [i for i in range(tok.n_vocab)
                       if not tok.token_to_piece(i) and tok.token_to_piece(i, special=True)]
    ll = ll_tokenizer(tok)
    assert ll.vocab_size == tok.n_vocab and sorted(ll.eos_tokens) == sorted(tok.eog_ids)
    inp = (reference / "vocab" / f"{name}.inp").read_text(encoding="utf-8")
    texts = [t for t in inp.split("\n__ggml_vocab_test__\n")[:-1] if t.strip()][:40]
    checked = 0
    for text in texts:
        ids = tok.encode(text, add_special=False)
        data = b"".join(tok.token_to_piece(t, special=True) for t in ids)
        assert ll.decode_bytes(ids) == data
        try:
            literal = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if "\x00" in literal:
            continue
        c = Constraint(lark_grammar(f"start: {json.dumps(literal, ensure_ascii=False)}"), tok)
        for t in ids:
            assert c.allows(t), f"{text!r}: token {t} refused"
            c.accept(t)
        assert c.is_accepting()
        checked += 1
    assert checked >= 20


def test_control_tokens_are_special_and_eos_ends_a_complete_output(smollm: Chat) -> None:
    tok = smollm.tokenizer
    c = Constraint(regex_grammar("ab"), tok)
    im_start = tok.token_id("<|im_start|>")
    assert not c.allows(im_start)  # a control token matches no text
    for t in tok.encode("ab", add_special=False):
        c.accept(t)
    assert c.is_done()
    # complete: only the end-of-generation tokens remain
    logits = np.zeros(tok.n_vocab, np.float32)
    c.mask(logits)
    assert set(np.flatnonzero(np.isfinite(logits)).tolist()) == set(tok.eog_ids)
    c.accept(tok.token_id("<|im_end|>"))
    assert c.is_done()


def test_a_token_outside_the_mask_is_a_constraint_failure(smollm: Chat) -> None:
    tok = smollm.tokenizer
    c = Constraint(regex_grammar("[0-9]+"), tok)
    with pytest.raises(ConstraintFailure, match="does not fit the grammar"):
        c.accept(tok.encode("abc", add_special=False)[0])


# --- the mask ---------------------------------------------------------------------------------

def test_apply_bitmask_matches_a_bit_by_bit_reference() -> None:
    rng = np.random.default_rng(0)
    words = rng.integers(-2**31, 2**31, size=(3, 5), dtype=np.int64).astype(np.int32)
    words[0, 1], words[1, 2] = -1, 0
    logits = rng.standard_normal((3, 170)).astype(np.float32)  # 10 columns past the mask
    expect = logits.copy()
    for b in range(3):
        for t in range(170):
            if t >= 160 or not (int(words[b, t // 32]) >> (t % 32)) & 1:
                expect[b, t] = -np.inf
    got = logits.copy()
    apply_bitmask(got, words)
    np.testing.assert_array_equal(got, expect)
    one = logits[1].copy()
    apply_bitmask(one, words[1])
    np.testing.assert_array_equal(one, expect[1])


def test_batch_masks_equal_single_masks(smollm: Chat) -> None:
    tok = smollm.tokenizer
    grammars = [json_schema_grammar({"type": "integer"}), regex_grammar("[a-c]+x"),
                gbnf_grammar((GRAMMARS / "list.gbnf").read_text())]
    batch = [Constraint(g, tok) for g in grammars]
    batch[1].accept(tok.encode("ab", add_special=False)[0])
    words = (tok.n_vocab + 31) // 32
    bitmask = np.zeros((len(batch), words), np.int32)
    fill_bitmasks(batch, bitmask)
    for row, c in zip(bitmask, batch):
        np.testing.assert_array_equal(row, c.fill_bitmask().copy())


def test_every_sampler_setting_keeps_to_the_grammar(smollm: Chat) -> None:
    """Greedy, the default chain, pure sampling (all filters off), penalties: the masked
    logits reach every filter, so each setting gives valid output."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    g = json_schema_grammar(schema)
    prompt = smollm.ask("Give me a JSON object with a number n.")
    for params in ({"temp": 0.0}, {"temp": 0.8}, {"temp": 1.5, "top_k": 0, "top_p": 1.0,
                                                  "min_p": 0.0},
                   {"temp": 0.8, "repeat_penalty": 1.5, "presence_penalty": 1.0}):
        temp = params.pop("temp")
        run = smollm.run(prompt, g, temp=temp, max_tokens=16, **params)
        assert run.stop == "eos", (params, run.text)
        jsonschema.validate(json.loads(run.text), schema)


def test_max_tokens_ends_a_constrained_output_with_length(smollm: Chat) -> None:
    g = json_schema_grammar({"type": "string", "minLength": 40})
    run = smollm.run(smollm.ask("Say something long."), g, max_tokens=5)
    assert run.stop == "length" and len(run.ids) == 5 and run.text.startswith('"')
    assert not run.constraint.is_done()


def test_the_prompt_reaches_the_penalties_only(smollm: Chat) -> None:
    """The engine gives the prompt to the sampler's penalties, never to the constraint."""
    run = smollm.run(smollm.ask("prompt text that is not yes or no"), regex_grammar("yes|no"),
                     repeat_penalty=1.2)
    assert run.text in ("yes", "no") and run.stop == "eos"


# --- the schema matrix --------------------------------------------------------------------------



# Each schema runs once here, the (model, temperature) pairs taking turns (Gemma, twice as
# slow, one turn in three); benchmarks/check_structured.py runs the whole matrix (every
# schema on both models at both temperatures), which takes minutes.
_PAIRS = [("smollm", 0.0), ("smollm", 0.8), ("gemma", 0.8), ("smollm", 0.8), ("smollm", 0.0),
          ("gemma", 0.0)]


@pytest.mark.parametrize("i", range(len(SCHEMAS)), ids=[s[0] for s in SCHEMAS])
def test_schema_matrix(request: pytest.FixtureRequest, i: int) -> None:
    _, _, question, schema = SCHEMAS[i]
    model, temp = _PAIRS[i % len(_PAIRS)]
    chat = request.getfixturevalue(model)
    run = chat.run(chat.ask(f"{question} Answer in JSON."), json_schema_grammar(schema),
                   temp=temp, max_tokens=96)
    assert run.stop == "eos", f"{model} at {temp}: {run.text!r}"
    assert run.constraint.is_done()
    check_json(schema, run.text)


def test_recursive_schema(smollm: Chat) -> None:
    """A recursive $ref takes any depth (checked token by token on a three-level value) and
    a model's answer validates, greedy and sampled (SmolLM2 stops nesting here; see
    RECURSIVE: at 0.8 with this seed after ~110 tokens)."""
    _, _, question, schema = RECURSIVE
    g = json_schema_grammar(schema)
    c = Constraint(g, smollm.tokenizer)
    value = {"name": "a", "children": [{"name": "b", "children": [
        {"name": "c", "children": []}]}, {"name": "d", "children": []}]}
    for t in smollm.tokenizer.encode(json.dumps(value), add_special=False):
        c.accept(t)
    assert c.is_done()
    for temp in (0.0, 0.8):
        run = smollm.run(smollm.ask(f"{question} Answer in JSON."), g, temp=temp,
                         max_tokens=160)
        assert run.stop == "eos", run.text
        check_json(schema, run.text)


def test_openai_response_formats(smollm: Chat) -> None:
    schema = obj({"answer": {"type": "string", "maxLength": 20}})
    spec = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema,
                                                   "strict": True}}
    prompt = smollm.ask("What is the capital of France? Answer in JSON.")
    for rf, check in ((spec, schema), ({"type": "json_object"}, {"type": "object"})):
        g = constraint_from_request(response_format=rf)
        run = smollm.run(prompt, g, max_tokens=64)
        if run.stop == "eos":
            check_json(check, run.text)
        else:  # json_object leaves the value unbounded: only a prefix is checked then
            assert run.text.startswith("{") and rf["type"] == "json_object"
    assert constraint_from_request(response_format={"type": "text"}) is None
    assert constraint_from_request() is None
    g = constraint_from_request(json_schema=json.dumps(schema))  # llama-server's field
    assert g.kind == "json_schema" and g.schema == schema


# --- grammars: GBNF, regex, Lark ---------------------------------------------------------------

def test_llama_cpp_grammars_all_compile() -> None:
    """Every grammar of llama.cpp's grammars/ directory is accepted by llguidance (none is
    refused, so there is no list of errors to keep)."""
    for name in LLAMA_CPP_GRAMMARS:
        g = gbnf_grammar((GRAMMARS / f"{name}.gbnf").read_text(encoding="utf-8"))
        assert g.kind == "gbnf"


@pytest.mark.parametrize("name", LLAMA_CPP_GRAMMARS)
def test_llama_cpp_grammar_constrains_smollm(smollm: Chat, name: str) -> None:
    g = gbnf_grammar((GRAMMARS / f"{name}.gbnf").read_text(encoding="utf-8"))
    run = smollm.run(smollm.ask(GRAMMAR_PROMPTS[name]), g, temp=0.8, max_tokens=24)
    check_grammar_output(name, run.text, run.stop == "eos")


@pytest.mark.parametrize("name", ["json", "arithmetic"])
def test_llama_cpp_grammar_constrains_gemma(gemma: Chat, name: str) -> None:
    g = gbnf_grammar((GRAMMARS / f"{name}.gbnf").read_text(encoding="utf-8"))
    run = gemma.run(gemma.ask(GRAMMAR_PROMPTS[name]), g, temp=0.0, max_tokens=24)
    check_grammar_output(name, run.text, run.stop == "eos")


def test_grammar_checkers_reject_what_the_grammars_reject() -> None:
    Arithmetic("(a +1)*b = 3\nx_2 = (4)\n").check()
    for bad in ("a + 1 = 3\n", "a = 3 b\n", "a = 3", "A = 3\n"):
        with pytest.raises((AssertionError, Incomplete)):
            Arithmetic(bad).check()
    with pytest.raises(Incomplete):
        Arithmetic("(a +1").check()
    assert in_language(LANGUAGES["chess"], "1. e4 e5\n2. Nf3 Nc6\n", True)
    assert in_language(LANGUAGES["chess"], "1. e4 e5\n2. Nf", False)
    assert not in_language(LANGUAGES["chess"], "1. e4 e5\n2. Zf3", False)
    assert not in_language(LANGUAGES["list"], "- a\nb", False)


@pytest.mark.parametrize("model, pattern", [
    ("smollm", r"[0-9]{3}-[0-9]{4}"), ("smollm", r"(yes|no), because [a-z ]{1,20}\."),
    ("gemma", r"\d{4}-\d{2}-\d{2}")])
def test_regex_constrains_the_whole_output(request, model: str, pattern: str) -> None:
    chat = request.getfixturevalue(model)
    run = chat.run(chat.ask("Answer briefly."), regex_grammar(pattern), temp=0.8,
                   max_tokens=40)
    assert run.stop == "eos" and re.fullmatch(pattern, run.text, re.ASCII), run.text


def test_lark_grammar_with_embedded_json(smollm: Chat) -> None:
    lark = ('start: "Answer: " ANSWER "\\n" data\n'
            'ANSWER: /(yes|no)/\n'
            'data: %json {"type": "object", "properties": {"n": {"type": "integer", '
            '"minimum": 0, "maximum": 9}}, "required": ["n"], "additionalProperties": false}')
    run = smollm.run(smollm.ask("Is 3 odd? Give a digit too."), lark_grammar(lark),
                     max_tokens=30)
    assert run.stop == "eos"
    m = re.fullmatch(r"Answer: (yes|no)\n(.*)", run.text, re.S)
    assert m and 0 <= json.loads(m.group(2))["n"] <= 9


# --- bad input ---------------------------------------------------------------------------------

BAD = [  # (request arguments, param, words the message must contain)
    ({"json_schema": "{not json"}, "json_schema", "not valid JSON"),
    ({"json_schema": {"type": "strin"}}, "json_schema", "Invalid type: strin"),
    ({"json_schema": {"type": "array", "contains": {"type": "string"}}}, "json_schema",
     "unsupported JSON schema feature: Unimplemented keys: [\"contains\"]"),
    ({"json_schema": {"type": "object", "requried": ["a"]}}, "json_schema",
     "unknown keyword 'requried' at /"),
    ({"json_schema": {"properties": {"a": {"type": "string", "nullable": True}}}},
     "json_schema", "unknown keyword 'nullable' at /properties/a"),
    ({"json_schema": {"type": "string", "format": "color"}}, "json_schema",
     "Unknown format: color"),
    ({"json_schema": {"type": "string", "pattern": "(?=a)b"}}, "json_schema", "look-around"),
    ({"json_schema": {"type": "string", "minLength": 5, "maxLength": 2}}, "json_schema",
     "minLength (5) is greater than maxLength (2)"),
    ({"json_schema": {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}},
     "json_schema", "oneOf"),
    ({"json_schema": {"$ref": "https://example.com/s.json"}}, "json_schema",
     "https://example.com/s.json"),
    ({"json_schema": {"not": {"type": "string"}}}, "json_schema", '["not"]'),
    ({"json_schema": {"x-guidance": {"lenient": True}, "type": "array",
                      "contains": {"type": "string"}}}, "json_schema", "contains"),
    ({"json_schema": False}, "json_schema", "no value matches"),
    ({"json_schema": [1, 2]}, "json_schema", "must be a JSON schema object"),
    ({"json_schema": {"properties": {"a": 5}}}, "json_schema", "/properties/a must be a schema"),
    ({"grammar": "root ::= foo"}, "grammar", "Rule 'foo' not found"),
    ({"grammar": "this is not a grammar"}, "grammar", "invalid GBNF grammar"),
    ({"grammar": 'root ::= [a-'}, "grammar", "invalid GBNF grammar"),
    ({"grammar": ""}, "grammar", "grammar is empty"),
    ({"grammar": 42}, "grammar", "must be a string"),
    ({"regex": "[a-"}, "regex", "unclosed character class"),
    ({"regex": "(a)\\1"}, "regex", "invalid regular expression"),
    ({"lark": "start: foo"}, "lark", "invalid Lark grammar"),
    ({"lark": "start: <|no_such_token|>"}, "lark", "invalid Lark grammar"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "json_object"),
    ({"response_format": "json"}, "response_format", "must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": "x"}},
     "response_format.json_schema", "must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}},
     "response_format.json_schema.name", "must be a string"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "contains": {}}}}},
     "response_format.json_schema.schema", "contains"),
    ({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}, "grammar",
     "response_format and grammar cannot be combined"),
    ({"regex": "a", "lark": "start: \"a\""}, "lark", "regex and lark cannot be combined"),
]


@pytest.mark.parametrize("kwargs, param, words", BAD, ids=[f"{b[1]}-{i}" for i, b in
                                                            enumerate(BAD)])
def test_bad_constraints_name_the_problem(smollm: Chat, kwargs, param, words) -> None:
    with pytest.raises(ConstraintError) as e:
        constraint_from_request(**kwargs, tokenizer=smollm.tokenizer)
    assert isinstance(e.value, InvalidRequestError) and isinstance(e.value, ValueError)
    assert e.value.param == param
    assert words in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def _accepts(chat: Chat, grammar, text: str) -> bool:
    c = Constraint(grammar, chat.tokenizer)
    try:
        for t in chat.tokenizer.encode(text, add_special=False):
            c.accept(t)
    except ConstraintFailure:
        return False
    return c.is_accepting()


def test_unbounded_values_get_limits(smollm: Chat) -> None:
    """Magnitudes up to 2**53 - 1, 10 decimals, formatted strings of a real length: a model
    cannot write digits forever; bounds the schema sets itself are kept."""
    integer = json_schema_grammar({"type": "integer"})
    assert _accepts(smollm, integer, "-9007199254740991")
    assert not _accepts(smollm, integer, "9007199254740992")
    assert not _accepts(smollm, integer, "1" + "0" * 16)
    number = json_schema_grammar({"type": "number"})
    assert _accepts(smollm, number, "3.1415926535") and _accepts(smollm, number, "-200000")
    assert not _accepts(smollm, number, "2e5")  # llguidance's bounded numbers: no exponent
    assert not _accepts(smollm, number, "3.14159265358")
    big = json_schema_grammar({"type": "integer", "minimum": 0, "maximum": 10**17})
    assert _accepts(smollm, big, "1" + "0" * 16)
    fine = json_schema_grammar({"type": "number", "multipleOf": 0.5})
    assert _accepts(smollm, fine, "2.5") and not _accepts(smollm, fine, "2.25")
    time_ = json_schema_grammar({"type": "string", "format": "time"})
    assert _accepts(smollm, time_, '"12:30:00.123Z"')
    assert not _accepts(smollm, time_, '"12:30:00.' + "1" * 30 + 'Z"')
    # what the limits add never widens the schema
    bounded = bounded_schema({"type": ["number", "null"], "properties": {"x": {
        "type": "integer", "maximum": 5}}, "items": [{"type": "number", "minimum": 1}]})
    assert bounded["minimum"] == -MAX_INTEGER and bounded["multipleOf"] == 1e-10
    assert bounded["properties"]["x"] == {"type": "integer", "maximum": 5,
                                          "minimum": -MAX_INTEGER}
    assert bounded["items"][0]["maximum"] == MAX_INTEGER


def test_embedded_schemas_keep_their_references() -> None:
    params = {"$defs": {"p": {"type": "object", "properties": {"$ref": {"const": "#/x"}}}},
              "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"$ref": "#"},
                             "c": {"enum": [{"$ref": "#/$defs/p"}]}}}
    moved = embed_schema(params, "/properties/arguments")
    assert moved["properties"]["a"] == {"$ref": "#/properties/arguments/$defs/p"}
    assert moved["properties"]["b"] == {"$ref": "#/properties/arguments"}
    assert moved["properties"]["c"] == params["properties"]["c"]  # data, not a schema
    assert moved["$defs"]["p"]["properties"]["$ref"] == {"const": "#/x"}  # a property name


def test_deep_schemas_are_refused_before_llguidance() -> None:
    schema: dict = {"type": "integer"}
    for _ in range(100):
        schema = {"type": "array", "items": schema}
    with pytest.raises(ConstraintError, match="nests deeper than 64"):
        json_schema_grammar(schema)
    with pytest.raises(ConstraintError, match="not valid JSON"):
        json_schema_grammar("[" * 100_000)


def test_special_token_names_are_checked_against_the_vocabulary(smollm: Chat) -> None:
    g = lark_grammar('start: "hi" <|im_end|>', param="lark")  # fine without a vocabulary
    Constraint(g, smollm.tokenizer)
    with pytest.raises(ConstraintError, match="no_such"):
        constraint_from_request(lark='start: "hi" <|no_such|>', tokenizer=smollm.tokenizer)


def test_schema_from_arg_reads_json_or_a_file(tmp_path: Path) -> None:
    assert schema_from_arg('{"type": "integer"}') == {"type": "integer"}
    f = tmp_path / "s.json"
    f.write_text('{"type": "string"}')
    assert schema_from_arg(str(f)) == {"type": "string"}
    with pytest.raises(ConstraintError, match="cannot read the JSON schema file"):
        schema_from_arg(str(tmp_path / "missing.json"))
    f.write_text("{oops")
    with pytest.raises(ConstraintError, match="not valid JSON"):
        schema_from_arg(str(f))
