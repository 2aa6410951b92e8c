"""``gguflm edit MODEL [--set KEY=VALUE [--type T]] [--delete KEY] -o OUT``.

Writes a new file (never in place): the model's metadata with the changes applied, and
its tensors copied byte for byte. With no changes the output is identical to the input.
A ``--set`` of an existing key keeps the key's place and, unless ``--type`` says
otherwise, its type; a new key is appended, typed from ``--type`` or from the value.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from . import CLIError
from .common import add_model_argument

_TYPE_ALIASES = {
    "u8": "uint8", "i8": "int8", "u16": "uint16", "i16": "int16", "u32": "uint32",
    "i32": "int32", "f32": "float32", "u64": "uint64", "i64": "int64", "f64": "float64",
    "str": "string", "float": "float32", "int": "int32", "double": "float64",
}


class _SetAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 value: Any, option: str | None = None) -> None:
        key, sep, val = str(value).partition("=")
        if not sep or not key:
            parser.error(f"--set wants KEY=VALUE, got {value!r}")
        ns.edits = [*ns.edits, ["set", key, val, None]]  # never mutate the shared default


class _TypeAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 value: Any, option: str | None = None) -> None:
        if not ns.edits or ns.edits[-1][0] != "set" or ns.edits[-1][3] is not None:
            parser.error("--type must follow the --set it applies to")
        ns.edits[-1][3] = value


class _DeleteAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 value: Any, option: str | None = None) -> None:
        ns.edits = [*ns.edits, ["delete", value, None, None]]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "edit", help="write a copy of a GGUF file with metadata changed",
        description="Write a copy of MODEL with metadata keys set or deleted (never in "
                    "place). Types: uint8..uint64, int8..int64, float32, float64, bool, "
                    "string, array[T] (VALUE as a JSON list).")
    add_model_argument(p)
    p.set_defaults(edits=[])
    p.add_argument("--set", action=_SetAction, metavar="KEY=VALUE",
                   help="set KEY (repeatable); an existing key keeps its type")
    p.add_argument("--type", action=_TypeAction, metavar="T",
                   help="type of the value of the preceding --set")
    p.add_argument("--delete", action=_DeleteAction, metavar="KEY",
                   help="delete KEY (repeatable)")
    p.add_argument("-o", "--output", metavar="OUT", required=True,
                   help="the new file (must not be MODEL)")
    p.set_defaults(func=run)


def parse_type(text: str) -> Any:
    """``uint32``, ``u32``, ``array[string]``, ``array[array[int32]]`` -> a GGUF type."""
    from ..gguf.types import ArrayType, ValueType

    t = text.strip().lower()
    if t.startswith("array[") and t.endswith("]"):
        inner = parse_type(t[6:-1])
        return ArrayType(inner)
    t = _TYPE_ALIASES.get(t, t)
    try:
        vt = ValueType[t.upper()]
    except KeyError:
        raise CLIError(f"unknown type {text!r} (uint8..uint64, int8..int64, float32, "
                       "float64, bool, string, array[T])") from None
    if vt == ValueType.ARRAY:
        raise CLIError("give an array's element type: array[T]")
    return vt


def parse_value(text: str, mtype: Any) -> Any:
    """VALUE text -> a Python value of ``mtype`` (arrays as JSON lists)."""
    from ..gguf.types import ArrayType, ValueType

    if isinstance(mtype, ArrayType):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise CLIError(f"an {mtype} value must be a JSON list: {e}") from None
        if not isinstance(items, list):
            raise CLIError(f"an {mtype} value must be a JSON list")
        return [_convert(v, mtype.elem) for v in items]
    if mtype == ValueType.STRING:
        return text
    if mtype == ValueType.BOOL:
        low = text.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise CLIError(f"not a bool: {text!r} (true/false)")
    if mtype in (ValueType.FLOAT32, ValueType.FLOAT64):
        try:
            return float(text)
        except ValueError:
            raise CLIError(f"not a number: {text!r}") from None
    try:
        return int(text.strip(), 0)
    except ValueError:
        raise CLIError(f"not an integer: {text!r}") from None


def _convert(v: Any, elem: Any) -> Any:
    from ..gguf.types import ArrayType, ValueType

    if isinstance(elem, ArrayType):
        if not isinstance(v, list):
            raise CLIError(f"expected a nested list for {elem}")
        return [_convert(x, elem.elem) for x in v]
    if elem == ValueType.STRING:
        if not isinstance(v, str):
            raise CLIError(f"array[string] element {v!r} is not a string")
        return v
    if elem == ValueType.BOOL:
        if not isinstance(v, bool):
            raise CLIError(f"array[bool] element {v!r} is not true/false")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CLIError(f"array element {v!r} is not a number")
    return v


def infer_value(text: str) -> tuple[Any, Any]:
    """A new key without --type: bool, int, float, a JSON list, else a string."""
    from ..gguf.types import ValueType
    from ..gguf.writer import infer_type

    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true", ValueType.BOOL
    for conv in (int, float):
        try:
            v = conv(text)
            return v, infer_type(v)
        except ValueError:
            pass
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            items = None
        if isinstance(items, list) and items:
            return items, infer_type(items)
    return text, ValueType.STRING


def run(args: argparse.Namespace) -> int:
    from .. import gguf
    from ..gguf.atomic import check_output_path
    from ..gguf.types import ValueType, type_name
    from ..gguf.writer import GGUFWriter
    from .pull import resolve

    path = resolve(args.model)
    out = Path(args.output)
    if out.exists() and os.path.samefile(out, path) or out.resolve() == path.resolve():
        raise CLIError("refusing to edit in place: -o must name a new file, not MODEL")
    check_output_path(out)  # a device, FIFO or directory would be replaced by the rename
    with gguf.open(path) as f:
        w = GGUFWriter.from_file(f, out)
        changes = []
        for op, key, text, tname in args.edits:
            if op == "delete":
                if key not in w:
                    raise CLIError(f"cannot delete {key!r}: no such key")
                w.delete(key)
                changes.append(f"deleted {key}")
                continue
            if tname is not None:
                mtype = parse_type(tname)
                value = parse_value(text, mtype)
            elif key in f.types and key in w:
                mtype = f.types[key]
                value = parse_value(text, mtype)
            elif key == "general.alignment":  # ggml requires uint32 here
                mtype = ValueType.UINT32
                value = parse_value(text, mtype)
            else:
                value, mtype = infer_value(text)
            w.set(key, value, mtype)
            changes.append(f"set {key} ({type_name(mtype)})")
        if not os.access(out.parent if str(out.parent) else ".", os.W_OK):
            raise CLIError(f"cannot write to {out.parent}")
        try:
            w.write()
        except OSError as e:
            raise CLIError(f"cannot write {out}: {e.strerror or e}") from None
    what = "; ".join(changes) if changes else "no changes (an identical copy)"
    print(f"wrote {out}: {what}", file=sys.stderr)
    return 0
