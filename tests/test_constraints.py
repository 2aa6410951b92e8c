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
import regex as rx

from constrained import Chat
from gguflm.engine.constraints import (
    ConstrainedSampler,
    Constraint,
    ConstraintError,
    ConstraintFailure,
    apply_bitmask,
    constraint_from_request,
    fill_bitmasks,
    gbnf_grammar,
    json_schema_grammar,
    lark_grammar,
    ll_tokenizer,
    regex_grammar,
    schema_from_arg,
    token_bytes,
)
from gguflm.engine.errors import InvalidRequestError
from gguflm.engine.sampling import Sampler, SamplerParams
from gguflm.tokenizer import Tokenizer

GRAMMARS = Path(__file__).parent / "data" / "grammars"


@pytest.fixture(scope="module")
def smollm(smollm2_path: Path) -> Chat:
    return Chat(smollm2_path)


@pytest.fixture(scope="module")
def gemma(gemma3_path: Path) -> Chat:
    return Chat(gemma3_path)


@pytest.fixture(params=["smollm", "gemma"])
def chat(request: pytest.FixtureRequest) -> Chat:
    return request.getfixturevalue(request.param)


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


def test_constrained_sampler_passes_the_prompt_to_the_penalties_only(smollm: Chat) -> None:
    tok = smollm.tokenizer
    c = Constraint(regex_grammar("yes|no"), tok)
    s = ConstrainedSampler(Sampler(SamplerParams(temp=0.0, repeat_penalty=1.2)), c)
    s.accept_all(tok.encode("prompt text that is not yes or no"))  # must not reach c
    t = s.sample(np.zeros(tok.n_vocab, np.float32))
    assert tok.decode([t]) in ("y", "ye", "yes", "n", "no")
    s.accept(t)


# --- the schema matrix --------------------------------------------------------------------------

_OBJ = {"type": "object", "additionalProperties": False}


def _obj(props: dict, required: list[str] | None = None, **kw) -> dict:
    return {**_OBJ, "properties": props, "required": list(props) if required is None
            else required, **kw}


NAME = {"type": "string", "minLength": 1, "maxLength": 12}
AGE = {"type": "integer", "minimum": 0, "maximum": 120}

# (id, feature(s), prompt, schema); strings and arrays are bounded so that every output
# must end within the token budget
SCHEMAS = [
    ("string", "type string, maxLength", "Name a color.", {"type": "string", "maxLength": 12}),
    ("integer-range", "integer, minimum/maximum", "How many legs does a dog have?",
     {"type": "integer", "minimum": 0, "maximum": 10}),
    ("number-exclusive", "number, exclusiveMinimum/Maximum", "A probability between 0 and 1.",
     {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}),
    ("boolean", "boolean", "Is the sky blue?", {"type": "boolean"}),
    ("null", "null", "Reply with null.", {"type": "null"}),
    ("object-required", "properties, required", "Describe a person.",
     _obj({"name": NAME, "age": AGE})),
    ("optional-props", "optional properties", "Describe a city.",
     _obj({"city": NAME, "country": NAME, "population": {"type": "integer", "minimum": 0}},
          required=["city"])),
    ("additional-schema", "additionalProperties schema, maxProperties",
     "Scores of two players.",
     {"type": "object", "maxProperties": 3,
      "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 100}}),
    ("enum-strings", "enum", "Pick a primary color.",
     {"enum": ["red", "green", "blue"]}),
    ("enum-mixed", "enum of mixed types", "Pick one.", {"enum": [1, "two", None, True]}),
    ("const", "const", "Reply with the version.", _obj({"version": {"const": "1.0"},
                                                        "ok": {"type": "boolean"}})),
    ("anyof", "anyOf", "A number or a short word.",
     {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, NAME]}),
    ("oneof", "oneOf (disjoint)", "An id: number or string.",
     {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 999}, NAME]}),
    ("allof", "allOf", "Describe a pet.",
     {"allOf": [_obj({"name": NAME, "legs": {"type": "integer", "minimum": 0,
                                             "maximum": 8}}),
                {"properties": {"legs": {"minimum": 2}}}]}),
    ("ref-defs", "$ref, $defs", "Two points.",
     {"$defs": {"point": _obj({"x": {"type": "integer", "minimum": -9, "maximum": 9},
                               "y": {"type": "integer", "minimum": -9, "maximum": 9}})},
      **_obj({"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}})}),
    ("ref-recursive", "recursive $ref", "Ann has one child, Bo, who has no children.",
     {"$defs": {"node": _obj({"name": NAME, "children": {
         "type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}},
         required=["name"])},
      "$ref": "#/$defs/node"}),
    ("array-items", "array items, minItems/maxItems", "Three fruits.",
     {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}),
    ("prefix-items", "prefixItems (tuple), items false", "A name and an age.",
     {"type": "array", "prefixItems": [NAME, AGE], "items": False}),
    ("string-length", "minLength/maxLength", "A two- to four-letter word.",
     {"type": "string", "minLength": 2, "maxLength": 4}),
    ("pattern", "string pattern", "A product code like ABC-12.",
     _obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}})),
    ("format-date", "format date", "The date of the moon landing.",
     _obj({"date": {"type": "string", "format": "date"}})),
    ("format-email", "format email", "An email address for Bob.",
     _obj({"email": {"type": "string", "format": "email", "maxLength": 30}})),
    ("format-uuid", "format uuid", "A random UUID.",
     {"type": "string", "format": "uuid"}),
    ("format-ipv4", "format ipv4", "The IP address of a home router.",
     _obj({"ip": {"type": "string", "format": "ipv4"}})),
    ("format-time", "format time, date-time", "When does the meeting start?",
     _obj({"time": {"type": "string", "format": "time"},
           "at": {"type": "string", "format": "date-time"}})),
    ("multiple-of", "multipleOf", "A multiple of five below 100.",
     {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 95}),
    ("type-list", "type as a list", "A word, or null if none.",
     {"type": ["string", "null"], "maxLength": 10}),
    ("nested", "nested objects", "A book and its author.",
     _obj({"title": NAME, "author": _obj({"name": NAME, "born": {
         "type": "integer", "minimum": 1000, "maximum": 2024}})})),
    ("array-of-objects", "array of objects", "Two people and their ages.",
     {"type": "array", "minItems": 2, "maxItems": 2, "items": _obj({"name": NAME, "age": AGE})}),
    ("nullable-anyof", "anyOf with null", "A nickname, if any.",
     _obj({"nickname": {"anyOf": [NAME, {"type": "null"}]}})),
    ("integer-enum", "enum of integers in an object", "Rate it 1 to 3.",
     _obj({"rating": {"enum": [1, 2, 3]}, "comment": {"type": "string", "maxLength": 20}})),
    ("annotations", "title, description, default, examples, x- keys", "Describe a task.",
     {"title": "Task", "description": "A to-do item", "x-origin": "test",
      **_obj({"task": {**NAME, "description": "what to do", "examples": ["shop"]},
              "done": {"type": "boolean", "default": False}})}),
]
assert len(SCHEMAS) >= 30


def _check(schema: dict, text: str) -> None:
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=jsonschema.Draft202012Validator
                        .FORMAT_CHECKER)


# Each schema runs once here, the (model, temperature) pairs taking turns, so that every
# pair sees a quarter of the features; benchmarks/check_structured.py runs the whole matrix
# (every schema on both models at both temperatures), which takes minutes.
_PAIRS = [("smollm", 0.0), ("gemma", 0.8), ("gemma", 0.0), ("smollm", 0.8)]


@pytest.mark.parametrize("i", range(len(SCHEMAS)), ids=[s[0] for s in SCHEMAS])
def test_schema_matrix(request: pytest.FixtureRequest, i: int) -> None:
    _, _, question, schema = SCHEMAS[i]
    model, temp = _PAIRS[i % len(_PAIRS)]
    chat = request.getfixturevalue(model)
    run = chat.run(chat.ask(f"{question} Answer in JSON."), json_schema_grammar(schema),
                   temp=temp, max_tokens=96)
    assert run.stop == "eos", f"{model} at {temp}: {run.text!r}"
    assert run.constraint.is_done()
    _check(schema, run.text)


def test_openai_response_formats(smollm: Chat) -> None:
    schema = _obj({"answer": {"type": "string", "maxLength": 20}})
    spec = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema,
                                                   "strict": True}}
    prompt = smollm.ask("What is the capital of France? Answer in JSON.")
    for rf, check in ((spec, schema), ({"type": "json_object"}, {"type": "object"})):
        g = constraint_from_request(response_format=rf)
        run = smollm.run(prompt, g, max_tokens=64)
        if run.stop == "eos":
            _check(check, run.text)
        else:  # json_object leaves the value unbounded: only a prefix is checked then
            assert run.text.startswith("{") and rf["type"] == "json_object"
    assert constraint_from_request(response_format={"type": "text"}) is None
    assert constraint_from_request() is None
    g = constraint_from_request(json_schema=json.dumps(schema))  # llama-server's field
    assert g.kind == "json_schema" and g.schema == schema


# --- grammars: GBNF, regex, Lark ---------------------------------------------------------------

LLAMA_CPP_GRAMMARS = ["arithmetic", "c", "chess", "english", "japanese", "json", "json_arr",
                      "list"]


def test_llama_cpp_grammars_all_compile() -> None:
    """Every grammar of llama.cpp's grammars/ directory is accepted by llguidance (none is
    refused, so there is no list of errors to keep)."""
    for name in LLAMA_CPP_GRAMMARS:
        g = gbnf_grammar((GRAMMARS / f"{name}.gbnf").read_text(encoding="utf-8"))
        assert g.kind == "gbnf"


_MOVE = r"(?:(?:[a-h]x)?[a-h][1-8](?:=[NBKQR])?|[NBKQR][a-h]?[1-8]?x?[a-h][1-8]|O-O(?:-O)?)[+#]?"
_LANGUAGES = {  # regular ones as Python regexes (a truncated output must be a prefix)
    "list": r"(?:- [^\r\n\x0b\x0c\x85\u2028\u2029]+\n)+",
    "chess": rf"1\. {_MOVE} {_MOVE}\n(?:[1-9][0-9]?\. {_MOVE} {_MOVE}\n)+",
    "english": r"[a-zA-Z0-9!-/:-@\[-`{-~]+(?:[ \t\n][a-zA-Z0-9!-/:-@\[-`{-~]+)*",
    "japanese": r"[ぁ-ゟァ-ヿ、-〾一-鿿]+(?:[ \t\n][ぁ-ゟァ-ヿ、-〾一-鿿]+)*",
}


def _in_language(pattern: str, text: str, complete: bool) -> bool:
    m = rx.fullmatch(pattern, text, partial=not complete)
    return m is not None


class _Incomplete(Exception):
    """The text ended where the language needs more (fine for a truncated output)."""


class _Arithmetic:
    """A recursive-descent parser of arithmetic.gbnf's language, which nested parentheses
    make context-free: ``(expr "=" ws term "\\n")+`` where every term swallows the spaces
    and newlines after it (so a line's final term must end its whitespace with the newline).
    ``check`` raises AssertionError where the text leaves the language, ``_Incomplete`` if it
    stops short of a complete sentence."""

    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0

    def peek(self) -> str:
        if self.i >= len(self.s):
            raise _Incomplete
        return self.s[self.i]

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t\n":
            self.i += 1

    def term(self) -> None:
        ch = self.peek()
        if ch == "(":
            self.i += 1
            self.ws()
            self.expr()
            assert self.peek() == ")", (self.s, self.i)
            self.i += 1
        elif ch.isdigit():
            while self.i < len(self.s) and self.s[self.i].isdigit():
                self.i += 1
        else:
            assert "a" <= ch <= "z", (self.s, self.i)
            self.i = re.compile(r"[a-z][a-z0-9_]*").match(self.s, self.i).end()
        self.ws()

    def expr(self) -> None:
        self.term()
        while self.i < len(self.s) and self.s[self.i] in "-+*/":
            self.i += 1
            self.term()

    def check(self) -> None:
        while True:
            self.expr()
            assert self.peek() == "=", (self.s, self.i)
            self.i += 1
            self.ws()
            self.term()
            assert self.s[self.i - 1] == "\n", (self.s, self.i)
            if self.i == len(self.s):
                return


def _check_grammar_output(name: str, text: str, complete: bool) -> None:
    if not complete:  # cut off by max_tokens, perhaps inside a character
        text = text.removesuffix("\ufffd")
    if name in _LANGUAGES:
        assert _in_language(_LANGUAGES[name], text, complete), (name, text)
    elif name in ("json", "json_arr"):
        if complete:
            value = json.loads(text)
            assert isinstance(value, dict if name == "json" else list)
        else:
            assert text.startswith("{" if name == "json" else "[\n"), text
    elif name == "arithmetic":
        try:
            _Arithmetic(text).check()
        except _Incomplete:
            assert not complete, text
    else:  # c.gbnf: no parser of ours; declarations start with a type
        assert text == "" or re.match(r"(int|float|char)[ \t\n]", text), text


GRAMMAR_PROMPTS = {
    "arithmetic": "Write two equations like x = 2 + 3.",
    "c": "Write a C function that adds two ints.",
    "chess": "Write the first moves of a chess game.",
    "english": "Describe a cat in one sentence.",
    "japanese": "Say hello in Japanese.",
    "json": "Describe a dog as a JSON object.",
    "json_arr": "List three colors as a JSON array.",
    "list": "List three fruits.",
}


@pytest.mark.parametrize("name", LLAMA_CPP_GRAMMARS)
def test_llama_cpp_grammar_constrains_smollm(smollm: Chat, name: str) -> None:
    g = gbnf_grammar((GRAMMARS / f"{name}.gbnf").read_text(encoding="utf-8"))
    run = smollm.run(smollm.ask(GRAMMAR_PROMPTS[name]), g, temp=0.8, max_tokens=24)
    _check_grammar_output(name, run.text, run.stop == "eos")


@pytest.mark.parametrize("name", ["json", "arithmetic", "chess"])
def test_llama_cpp_grammar_constrains_gemma(gemma: Chat, name: str) -> None:
    g = gbnf_grammar((GRAMMARS / f"{name}.gbnf").read_text(encoding="utf-8"))
    run = gemma.run(gemma.ask(GRAMMAR_PROMPTS[name]), g, temp=0.0, max_tokens=24)
    _check_grammar_output(name, run.text, run.stop == "eos")


def test_grammar_checkers_reject_what_the_grammars_reject() -> None:
    _Arithmetic("(a +1)*b = 3\nx_2 = (4)\n").check()
    for bad in ("a + 1 = 3\n", "a = 3 b\n", "a = 3", "A = 3\n"):
        with pytest.raises((AssertionError, _Incomplete)):
            _Arithmetic(bad).check()
    with pytest.raises(_Incomplete):
        _Arithmetic("(a +1").check()
    assert _in_language(_LANGUAGES["chess"], "1. e4 e5\n2. Nf3 Nc6\n", True)
    assert _in_language(_LANGUAGES["chess"], "1. e4 e5\n2. Nf", False)
    assert not _in_language(_LANGUAGES["chess"], "1. e4 e5\n2. Zf3", False)
    assert not _in_language(_LANGUAGES["list"], "- a\nb", False)


@pytest.mark.parametrize("pattern", [r"[0-9]{3}-[0-9]{4}", r"(yes|no), because [a-z ]{1,20}\.",
                                     r"\d{4}-\d{2}-\d{2}"])
def test_regex_constrains_the_whole_output(chat: Chat, pattern: str) -> None:
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
    ({"json_schema": {"type": "array", "uniqueItems": True}}, "json_schema",
     "unsupported JSON schema feature: Unimplemented keys: [\"uniqueItems\"]"),
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
                      "uniqueItems": True}}, "json_schema", "uniqueItems"),
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
