"""JSON Schema handling that needs no grammar engine: loading, keyword checks, bounds.

``check_schema`` refuses keywords JSON Schema does not define (a misspelt ``requried`` would
otherwise be ignored, as the standard says, and silently not enforced), except ``x-``
extensions and a few harmless annotations (``discriminator``, ``example``); llguidance then
refuses the keywords it does not implement. ``bounded_schema`` bounds what a schema leaves
unbounded where a model could loop (digits of numbers, lengths of formatted strings);
``embed_schema`` keeps a schema's ``$ref``s working when it is placed inside another.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from .errors import ConstraintError

__all__ = ["FORMAT_MAX_LENGTH", "KNOWN_KEYWORDS", "MAX_DECIMALS", "MAX_INTEGER",
           "bounded_schema", "check_schema", "embed_schema", "load_schema", "schema_from_arg"]

MAX_SCHEMA_DEPTH = 64  # nesting deeper than this is refused before it reaches llguidance
# llguidance compiles a schema recursively, following each $ref where it stands: a chain of
# 2,500 $refs overflowed its stack (a crash of the whole server). So the depth counts $ref
# hops as levels, and the subschemas reachable (each counted once) are bounded too.
MAX_SCHEMA_NODES = 20_000


def load_schema(schema: Any, param: str) -> Any:
    """``schema`` (a dict, a boolean or JSON text) as a schema object; ``param`` names the
    request field in errors."""
    if isinstance(schema, str | bytes):
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as e:
            raise ConstraintError(f"{param} is not valid JSON: {e}", param=param) from None
    if schema is True:
        return {}
    if schema is False:
        raise ConstraintError(f"{param} is the schema false, which no value matches",
                              param=param)
    if not isinstance(schema, Mapping):
        raise ConstraintError(f"{param} must be a JSON schema object, got "
                              f"{type(schema).__name__}", param=param)
    return schema


def schema_from_arg(value: str) -> dict[str, Any]:
    """A JSON schema from a command-line argument: JSON text if it starts with ``{``, else
    the path of a file holding it. Errors name the file."""
    from ..textfile import GRAMMAR_FILES, TextFileError, read_limited

    text = value.strip()
    if not text.startswith("{"):
        try:
            text = read_limited(os.path.expanduser(value), *GRAMMAR_FILES)
        except TextFileError as e:
            raise ConstraintError(e.say(f"the JSON schema file {value}"),
                                  param="json_schema") from None
    schema = load_schema(text, "json_schema")
    return dict(schema)


# --- keywords --------------------------------------------------------------------------------

_SUBSCHEMA = {"items", "additionalItems", "additionalProperties", "not", "if", "then", "else",
              "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
              "contentSchema"}
_SUBSCHEMA_MAP = {"properties", "patternProperties", "$defs", "definitions",
                  "dependentSchemas", "dependencies"}
_SUBSCHEMA_LIST = {"allOf", "anyOf", "oneOf", "prefixItems", "items"}
_OTHER_KEYWORDS = {
    # core, drafts 4 to 2020-12
    "$schema", "$id", "id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary",
    "$comment", "$recursiveRef", "$recursiveAnchor",
    # validation
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "format", "contentEncoding", "contentMediaType",
    # annotations
    "title", "description", "default", "deprecated", "readOnly", "writeOnly", "examples",
    # not JSON Schema, but common annotations that change nothing (OpenAPI, pydantic)
    "discriminator", "example",
}
KNOWN_KEYWORDS = frozenset(_SUBSCHEMA | _SUBSCHEMA_MAP | _SUBSCHEMA_LIST | _OTHER_KEYWORDS)


def check_schema(schema: Any, param: str) -> None:
    """Refuse keywords JSON Schema does not define (``x-`` extensions excepted), anywhere in
    ``schema``, naming the keyword and where it is (a JSON pointer); and nesting deeper than
    64 levels, counting ``$ref`` hops (see ``check_refs``); strings that are not valid
    Unicode. llguidance checks the rest (types, unimplemented keywords, ranges)."""
    check_unicode(schema, param)
    _check_keywords(schema, param)
    check_refs(schema, param)


def check_unicode(value: Any, param: str) -> None:
    """Refuse a lone surrogate (a JSON escape such as ``\\ud800``) in any string or key of
    ``value``: native code takes UTF-8, which cannot encode one."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
        elif isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise ConstraintError(f"{param} holds a string that is not valid Unicode (a "
                                      f"lone surrogate): {node[:40]!r}", param=param) from None


def _check_keywords(schema: Any, param: str) -> None:
    stack: list[tuple[Any, str, int]] = [(schema, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, Mapping):
            raise ConstraintError(f"invalid JSON schema: {where or '/'} must be a schema "
                                  f"(an object or a boolean), got {type(node).__name__}",
                                  param=param)
        if depth > MAX_SCHEMA_DEPTH:
            raise ConstraintError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} "
                                  f"levels (at {where})", param=param)
        for key, value in node.items():
            if not isinstance(key, str):
                raise ConstraintError(f"invalid JSON schema: key {key!r} at {where or '/'}",
                                      param=param)
            here = f"{where}/{_pointer(key)}"
            if key.startswith("x-"):
                continue
            if key not in KNOWN_KEYWORDS:
                raise ConstraintError(
                    f"unsupported JSON schema feature: unknown keyword {key!r} at "
                    f"{where or '/'} (JSON Schema would ignore it; remove it or write "
                    f"it as 'x-{key}')", param=param, code="unsupported_schema")
            if key in _SUBSCHEMA_LIST and isinstance(value, list):
                stack.extend((s, f"{here}/{i}", depth + 1) for i, s in enumerate(value))
            elif key in _SUBSCHEMA_MAP and isinstance(value, Mapping):
                for name, s in value.items():
                    if key == "dependencies" and isinstance(s, list):
                        continue  # draft 4's property dependencies: a list of names
                    stack.append((s, f"{here}/{_pointer(str(name))}", depth + 1))
            elif key in _SUBSCHEMA or key in _SUBSCHEMA_LIST:
                stack.append((value, here, depth + 1))


# --- $ref ------------------------------------------------------------------------------------

# edges that lead to a value's parts (a cycle through one of them builds a bigger value each
# time round, a recursive type) or out of the value ($defs); $ref and the combinators stand
# for the same value
_STRUCTURAL = _SUBSCHEMA_MAP | {"items", "prefixItems", "additionalItems", "contains",
                                "additionalProperties", "unevaluatedItems",
                                "unevaluatedProperties", "propertyNames"}


def _children(node: Mapping[str, Any]) -> list[tuple[Any, bool]]:
    """The subschemas of ``node`` and whether each is a part of the value (structural)."""
    out: list[tuple[Any, bool]] = []
    for key, value in node.items():
        structural = key in _STRUCTURAL
        if key in _SUBSCHEMA_MAP and isinstance(value, Mapping):
            out += [(s, structural) for s in value.values() if isinstance(s, Mapping)]
        elif key in _SUBSCHEMA_LIST and isinstance(value, list):
            out += [(s, structural) for s in value if isinstance(s, Mapping)]
        elif (key in _SUBSCHEMA or key in _SUBSCHEMA_LIST) and isinstance(value, Mapping):
            out.append((value, structural))
    return out


def _resolve(root: Any, ref: str, anchors: dict[str, Any]) -> Any:
    """The subschema a local ``$ref`` (``#``, ``#/$defs/T``, ``#name``) points to, or None."""
    from urllib.parse import unquote

    if not ref.startswith("#"):
        return None  # not local: llguidance refuses those it cannot find
    rest = unquote(ref[1:])
    if rest and not rest.startswith("/"):
        return anchors.get(rest)
    node = root
    for part in rest.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, Mapping) else None


def _anchors(root: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    stack = [root]
    while stack and len(out) < MAX_SCHEMA_NODES:
        node = stack.pop()
        if isinstance(node, Mapping):
            if isinstance(node.get("$anchor"), str):
                out.setdefault(node["$anchor"], node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def check_refs(schema: Any, param: str) -> None:
    """Follow the local ``$ref``s as llguidance will and refuse, before it sees them: a
    path of nested subschemas and ``$ref`` hops longer than 64 (each definition is
    compiled once, so the longest path that does not come back on itself is what its
    recursion follows); a cycle of ``$ref``s and combinators that never reaches a part of
    the value (``a -> b -> a``: no value can ever be written); more than 20,000 subschemas."""
    if not isinstance(schema, Mapping):
        return
    anchors: dict[str, Any] | None = None
    height: dict[int, int] = {}  # finished nodes: the longest path below them
    on_path: dict[int, int] = {}  # node -> its index in path
    path: list[tuple[Any, bool, list[tuple[Any, bool]], list[Any]]] = []

    def enter(node: Any, structural: bool) -> None:
        nonlocal anchors
        kids = _children(node)
        ref = node.get("$ref")
        if isinstance(ref, str):
            if anchors is None and ref.startswith("#") and ref[1:2] not in ("", "/"):
                anchors = _anchors(schema)
            target = _resolve(schema, ref, anchors or {})
            if target is not None:
                kids.append((target, False))
        on_path[id(node)] = len(path)
        path.append((node, structural, kids, [k for k, _ in kids]))
        if len(path) > MAX_SCHEMA_DEPTH + 1:
            raise ConstraintError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} "
                                  "levels, counting each $ref as one", param=param)
        if len(height) + len(path) > MAX_SCHEMA_NODES:
            raise ConstraintError(f"the JSON schema has more than {MAX_SCHEMA_NODES} "
                                  "subschemas, counting what its $refs point to",
                                  param=param)

    enter(schema, True)
    while path:
        node, _, kids, below = path[-1]
        if not kids:
            path.pop()
            del on_path[id(node)]
            height[id(node)] = 1 + max((height.get(id(k), 0) for k in below), default=0)
            continue
        kid, structural = kids.pop()
        if id(kid) in height:
            if len(path) + height[id(kid)] > MAX_SCHEMA_DEPTH + 1:
                raise ConstraintError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} "
                                      "levels, counting each $ref as one", param=param)
            continue
        if id(kid) in on_path:  # a cycle: fine if it builds a part of the value
            if not structural and not any(s for _, s, _, _ in path[on_path[id(kid)] + 1:]):
                raise ConstraintError("the JSON schema has a cycle of $refs that never "
                                      "reaches a value (such as a -> b -> a)", param=param)
            continue
        enter(kid, structural)


# Limits on values a schema leaves unbounded, so that a model cannot write digits forever.
# llama.cpp's schema grammars allow 16 integer digits and 16 decimals; here magnitudes up to
# 2**53 - 1 (JavaScript's safe integers, 16 digits: llguidance reads bounds as doubles, which
# hold no larger integer exactly) and 10 decimals (the finest multipleOf llguidance takes);
# formats get lengths beyond any real value.
MAX_INTEGER = 2**53 - 1
MAX_DECIMALS = 10
FORMAT_MAX_LENGTH = {"time": 32, "date-time": 48, "duration": 64, "email": 254,
                     "hostname": 253, "uri": 2083, "ipv6": 45}


def bounded_schema(schema: Any) -> Any:
    """A copy of ``schema`` whose integers and numbers lie within +-(2**53 - 1) and whose
    numbers have at most 10 decimals (and no exponent: llguidance writes bounded numbers
    without one) (where the schema sets no bound or multipleOf of its own),
    and whose formatted strings (``time``, ``email``, ...) a length limit. Everything it
    allows the original allows too, so outputs still validate against the original, with
    one exception: ``uniqueItems``, which no grammar can hold (Pydantic writes it for
    ``set[...]``), is left out, as llama.cpp and ollama leave it out (docs/server.md)."""
    if isinstance(schema, list):
        return [bounded_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA_MAP and isinstance(value, Mapping):
            out[key] = {name: bounded_schema(s) for name, s in value.items()}
        elif key in _SUBSCHEMA or key in _SUBSCHEMA_LIST:
            out[key] = bounded_schema(value)
        elif key != "uniqueItems":
            out[key] = value
    types = out.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    if ("integer" in types or "number" in types) and "enum" not in out and "const" not in out:
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -MAX_INTEGER
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = MAX_INTEGER
        if "integer" not in types and "multipleOf" not in out:
            out["multipleOf"] = 10.0 ** -MAX_DECIMALS
    limit = FORMAT_MAX_LENGTH.get(out.get("format"))  # type: ignore[arg-type]
    if limit is not None and "maxLength" not in out and out.get("minLength", 0) <= limit:
        out["maxLength"] = limit
    return out


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def embed_schema(schema: Any, pointer: str) -> Any:
    """A copy of ``schema`` for placing at JSON pointer ``pointer`` (``/properties/x``) inside
    another schema: its local references (``#``, ``#/$defs/T``) are rewritten to still point
    into it. Only schema positions are rewritten (not ``enum``/``const`` data or a property
    that happens to be called ``$ref``)."""
    if isinstance(schema, list):
        return [embed_schema(s, pointer) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            rest = value[1:]
            out[key] = "#" + pointer + rest if rest.startswith("/") or not rest else value
        elif key in _SUBSCHEMA_MAP and isinstance(value, Mapping):
            out[key] = {name: embed_schema(s, pointer) for name, s in value.items()}
        elif key in _SUBSCHEMA or key in _SUBSCHEMA_LIST:
            out[key] = embed_schema(value, pointer)
        else:
            out[key] = value
    return out
