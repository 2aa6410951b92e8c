"""Constrained generation on the real models, for test_constraints.py and test_tools.py.

A ``Chat`` holds one model, its tokenizer and chat template, and an engine of one slot whose
KV cache every run reuses up to the prompt it shares with the previous run (the chat
template's system prefix, the same prompt at a second temperature), as ``LLM`` does; that
keeps the many short runs of the schema matrix quick.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import regex as rx

from gguflm import load_model
from gguflm.engine.constraints import Constraint
from gguflm.engine.grammar import Grammar
from gguflm.engine.sampling import SamplerParams
from gguflm.engine.scheduler import Engine
from gguflm.engine.sequence import Request
from gguflm.tokenizer import Tokenizer
from gguflm.tokenizer.chat import ChatTemplate, encode_prompt

N_CTX = 1024
SEED = 1234


@dataclass
class Run:
    ids: list[int]
    text: str  # without the final end-of-generation token
    stop: str  # "eos" or "length"
    constraint: Constraint | None


class Chat:
    """One model with its tokenizer, template and KV cache; ``Chat.of(path)`` shares one per
    file across the test modules (the llguidance vocabulary, built once per tokenizer, takes
    seconds for Gemma's)."""

    _shared: dict[Path, Chat] = {}

    @classmethod
    def of(cls, path: Path) -> Chat:
        if path not in cls._shared:
            cls._shared[path] = cls(path)
        return cls._shared[path]

    def __init__(self, path: Path) -> None:
        self.model = load_model(path)
        self.tokenizer = Tokenizer.from_gguf(self.model.gguf)
        self.template = ChatTemplate.for_tokenizer(self.tokenizer, self.model.gguf.metadata)
        self.engine = Engine(self.model, self.tokenizer, n_ctx=N_CTX, n_slots=1)

    def prompt(self, messages: list[dict[str, Any]], template: ChatTemplate | None = None,
               tools: list[dict[str, Any]] | None = None) -> list[int]:
        text = (template or self.template).render(messages, tools=tools)
        return encode_prompt(self.tokenizer, text)

    def ask(self, user: str) -> list[int]:
        return self.prompt([{"role": "user", "content": user}])

    def run(self, prompt: list[int], grammar: Grammar | None, temp: float = 0.0,
            max_tokens: int = 64, **params: Any) -> Run:
        constraint = Constraint(grammar, self.tokenizer) if grammar is not None else None
        seq = self.engine.run(Request(prompt, SamplerParams(temp=temp, seed=SEED, **params),
                                      max_tokens, constraint=constraint))
        if seq.error is not None:
            raise seq.error
        ids = seq.tokens
        stop = "eos" if seq.stopped_by == "eos" else "length"
        body = ids[:-1] if stop == "eos" else ids
        return Run(ids, self.tokenizer.decode(body), stop, constraint)


# --- the schema matrix ----------------------------------------------------------------------

_OBJ = {"type": "object", "additionalProperties": False}


def obj(props: dict, required: list[str] | None = None, **kw) -> dict:
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
     obj({"name": NAME, "age": AGE})),
    ("optional-props", "optional properties", "Describe a city.",
     obj({"city": NAME, "country": NAME, "population": {"type": "integer", "minimum": 0}},
          required=["city"])),
    ("additional-schema", "additionalProperties schema, maxProperties",
     "Scores of two players.",
     {"type": "object", "maxProperties": 3,
      "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 100}}),
    ("enum-strings", "enum", "Pick a primary color.",
     {"enum": ["red", "green", "blue"]}),
    ("enum-mixed", "enum of mixed types", "Pick one.", {"enum": [1, "two", None, True]}),
    ("const", "const", "Reply with the version.", obj({"version": {"const": "1.0"},
                                                        "ok": {"type": "boolean"}})),
    ("anyof", "anyOf", "A number or a short word.",
     {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, NAME]}),
    ("oneof", "oneOf (disjoint)", "An id: number or string.",
     {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 999}, NAME]}),
    ("allof", "allOf", "Describe a pet.",
     {"allOf": [obj({"name": NAME, "legs": {"type": "integer", "minimum": 0,
                                             "maximum": 8}}),
                {"properties": {"legs": {"minimum": 2}}}]}),
    ("ref-defs", "$ref, $defs", "Two points.",
     {"$defs": {"point": obj({"x": {"type": "integer", "minimum": -9, "maximum": 9},
                               "y": {"type": "integer", "minimum": -9, "maximum": 9}})},
      **obj({"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}})}),
    ("ref-in-array", "$ref to a definition used in an array", "Two colors with their hex codes.",
     {"$defs": {"color": obj({"name": NAME, "hex": {"type": "string",
                                                     "pattern": "^#[0-9a-f]{6}$"}})},
      "type": "array", "minItems": 2, "maxItems": 2, "items": {"$ref": "#/$defs/color"}}),
    ("array-items", "array items, minItems/maxItems", "Three fruits.",
     {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}),
    ("prefix-items", "prefixItems (tuple), items false", "A name and an age.",
     {"type": "array", "prefixItems": [NAME, AGE], "items": False}),
    ("string-length", "minLength/maxLength", "A two- to four-letter word.",
     {"type": "string", "minLength": 2, "maxLength": 4}),
    ("pattern", "string pattern", "A product code like ABC-12.",
     obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}})),
    ("format-date", "format date", "The date of the moon landing.",
     obj({"date": {"type": "string", "format": "date"}})),
    ("format-email", "format email", "An email address for Bob.",
     obj({"email": {"type": "string", "format": "email", "maxLength": 30}})),
    ("format-uuid", "format uuid", "A random UUID.",
     {"type": "string", "format": "uuid"}),
    ("format-ipv4", "format ipv4", "The IP address of a home router.",
     obj({"ip": {"type": "string", "format": "ipv4"}})),
    ("format-time", "format time, date-time", "When does the meeting start?",
     obj({"time": {"type": "string", "format": "time"},
           "at": {"type": "string", "format": "date-time"}})),
    ("multiple-of", "multipleOf", "A multiple of five below 100.",
     {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 95}),
    ("type-list", "type as a list", "A word, or null if none.",
     {"type": ["string", "null"], "maxLength": 10}),
    ("nested", "nested objects", "A book and its author.",
     obj({"title": NAME, "author": obj({"name": NAME, "born": {
         "type": "integer", "minimum": 1000, "maximum": 2024}})})),
    ("array-of-objects", "array of objects", "Two people and their ages.",
     {"type": "array", "minItems": 2, "maxItems": 2, "items": obj({"name": NAME, "age": AGE})}),
    ("nullable-anyof", "anyOf with null", "A nickname, if any.",
     obj({"nickname": {"anyOf": [NAME, {"type": "null"}]}})),
    ("integer-enum", "enum of integers in an object", "Rate it 1 to 3.",
     obj({"rating": {"enum": [1, 2, 3]}, "comment": {"type": "string", "maxLength": 20}})),
    ("annotations", "title, description, default, examples, x- keys", "Describe a task.",
     {"title": "Task", "description": "A to-do item", "x-origin": "test",
      **obj({"task": {**NAME, "description": "what to do", "examples": ["shop"]},
              "done": {"type": "boolean", "default": False}})}),
]
assert len(SCHEMAS) >= 30

# A recursive schema: supported, but nothing bounds the depth, and these small models, once
# nesting, tend to go on until max_tokens (at temperature 0 both do on this prompt); it is
# reported apart from the matrix.
RECURSIVE = ("ref-recursive", "recursive $ref",
             "Ann has one child, Bo. Bo has no children: his list of children is empty.",
             {"$defs": {"node": obj({"name": NAME, "children": {
                 "type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}})},
              "$ref": "#/$defs/node"})


def check_json(schema: dict, text: str) -> None:
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=jsonschema.Draft202012Validator
                        .FORMAT_CHECKER)



# --- llama.cpp's grammars and checkers of their languages ------------------------------------

MOVE = r"(?:(?:[a-h]x)?[a-h][1-8](?:=[NBKQR])?|[NBKQR][a-h]?[1-8]?x?[a-h][1-8]|O-O(?:-O)?)[+#]?"
LANGUAGES = {  # regular ones as Python regexes (a truncated output must be a prefix)
    "list": r"(?:- [^\r\n\x0b\x0c\x85\u2028\u2029]+\n)+",
    "chess": rf"1\. {MOVE} {MOVE}\n(?:[1-9][0-9]?\. {MOVE} {MOVE}\n)+",
    "english": r"[a-zA-Z0-9!-/:-@\[-`{-~]+(?:[ \t\n][a-zA-Z0-9!-/:-@\[-`{-~]+)*",
    "japanese": r"[ぁ-ゟァ-ヿ、-〾一-鿿]+(?:[ \t\n][ぁ-ゟァ-ヿ、-〾一-鿿]+)*",
}


def in_language(pattern: str, text: str, complete: bool) -> bool:
    m = rx.fullmatch(pattern, text, partial=not complete)
    return m is not None


class Incomplete(Exception):
    """The text ended where the language needs more (fine for a truncated output)."""


class Arithmetic:
    """A recursive-descent parser of arithmetic.gbnf's language, which nested parentheses
    make context-free: ``(expr "=" ws term "\\n")+`` where every term swallows the spaces
    and newlines after it (so a line's final term must end its whitespace with the newline).
    ``check`` raises AssertionError where the text leaves the language, ``Incomplete`` if it
    stops short of a complete sentence."""

    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0

    def peek(self) -> str:
        if self.i >= len(self.s):
            raise Incomplete
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


def check_grammar_output(name: str, text: str, complete: bool) -> None:
    if not complete:  # cut off by max_tokens, perhaps inside a character
        text = text.removesuffix("\ufffd")
    if name in LANGUAGES:
        assert in_language(LANGUAGES[name], text, complete), (name, text)
    elif name in ("json", "json_arr"):
        if complete:
            value = json.loads(text)
            assert isinstance(value, dict if name == "json" else list)
        else:
            assert text.startswith("{" if name == "json" else "[\n"), text
    elif name == "arithmetic":
        try:
            Arithmetic(text).check()
        except Incomplete:
            assert not complete, text
    else:  # c.gbnf: no parser of ours; declarations start with a type
        assert text == "" or re.match(r"(int|float|char)[ \t\n]", text), text


LLAMA_CPP_GRAMMARS = ["arithmetic", "c", "chess", "english", "japanese", "json", "json_arr",
                      "list"]
GRAMMARS = Path(__file__).parent / "data" / "grammars"

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




# --- tools ------------------------------------------------------------------------------------

TEMPLATES = Path(__file__).parent / "data" / "templates"
QWEN = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"  # hermes
LLAMA31 = TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja"  # llama3

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
            "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "book_meeting", "description": "Book a meeting room",
        "parameters": {"type": "object", "$defs": {"person": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 20}},
            "required": ["name"], "additionalProperties": False}},
            "properties": {"room": {"type": "string", "pattern": "^[A-D][0-9]$"},
                           "people": {"type": "array", "items": {"$ref": "#/$defs/person"},
                                      "minItems": 1, "maxItems": 3}},
            "required": ["room", "people"], "additionalProperties": False}}},
]
TOOL_QUESTIONS = ["What is the weather in Paris?", "What is 12 plus 30?",
                  "Book room B2 for Ann and Bob."]


def tool_parameters(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)
