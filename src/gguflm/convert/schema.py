"""The kinds of value the converter reads from a checkpoint's JSON files, and their checks.

Every JSON value the converter uses is described by a table of these kinds
(``params.CONFIG_KEYS`` for ``config.json``; ``vocab.TOKENIZER_JSON``, ``TOKENIZER_CONFIG``
and the other file tables) and checked before it is used, so a hostile file gets one error
naming the file and the field, whatever the value: a string where a count belongs, a count
of zero, a float that float32 cannot hold, a list where an object belongs, nesting without
end. ``Invalid`` carries the reason and the dotted field inside the checked value; the
caller turns it into a ``ConvertError`` with the file's path.

In objects, ``null`` counts as absent (Hugging Face writes ``null`` for "not set").
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

U32_MAX = 2**32 - 1
I32_MAX = 2**31 - 1
I64_MAX = 2**63 - 1
F32_MAX = 3.4028234663852886e38  # the largest finite float32
MAX_DEPTH = 32  # nesting of a recursive kind (normalizer sequences); JSON allows ~1000


class Invalid(Exception):
    """A value is not of its kind. ``field`` is where inside the checked value (dotted)."""

    def __init__(self, reason: str, field: str = "") -> None:
        super().__init__(reason)
        self.reason, self.field = reason, field

    def inside(self, name: str) -> Invalid:
        """This error one level further out: ``name`` is the field that held the value."""
        self.field = name + ("" if not self.field else
                             self.field if self.field.startswith("[") else "." + self.field)
        return self


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 3, 30, 30


def show(value: Any) -> str:
    """A short, printable description of a JSON value for an error message (bounded work:
    a list of a million items is shown by its first few)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    text = _REPR.repr(value)  # escapes control characters and lone surrogates
    return text if len(text) <= 60 else text[:57] + "..."


def is_text(value: Any) -> bool:
    """A str that encodes as UTF-8 (JSON's \\ud800 escapes make lone surrogates)."""
    if not isinstance(value, str):
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Kind:
    """A kind of JSON value; ``check`` raises ``Invalid`` for anything else."""

    def check(self, value: Any, depth: int = 0) -> None:
        raise NotImplementedError

    def is_(self, value: Any) -> bool:
        try:
            self.check(value)
        except Invalid:
            return False
        return True


@dataclass(frozen=True)
class Int(Kind):
    """An integer (not a bool, not a float) from ``lo`` to ``hi``."""

    lo: int
    hi: int

    def __str__(self) -> str:
        return f"an integer from {self.lo} to {self.hi}"

    def check(self, value: Any, depth: int = 0) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"{show(value)} is not {self}")
        if not self.lo <= value <= self.hi:
            raise Invalid(f"{show(value)} is out of range: {self}")


@dataclass(frozen=True)
class Real(Kind):
    """A finite number from ``lo`` to ``hi`` (more than ``lo`` when ``open_lo``); the
    default ``hi`` is float32's largest, for values written as F32."""

    lo: float = -F32_MAX
    hi: float = F32_MAX
    open_lo: bool = False

    def __str__(self) -> str:
        low = f"more than {self.lo:g}" if self.open_lo else f"from {self.lo:g}"
        return f"a finite number {low} to {self.hi:g}"

    def check(self, value: Any, depth: int = 0) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(f"{show(value)} is not {self}")
        try:
            x = float(value)
        except OverflowError:
            raise Invalid(f"{show(value)} is out of range: {self}") from None
        if not math.isfinite(x) or not (self.lo < x if self.open_lo else self.lo <= x) \
                or x > self.hi:
            raise Invalid(f"{show(value)} is out of range: {self}")


@dataclass(frozen=True)
class Text(Kind):
    """A string that is valid UTF-8."""

    def __str__(self) -> str:
        return "a string"

    def check(self, value: Any, depth: int = 0) -> None:
        if not is_text(value):
            raise Invalid(f"{show(value)} is not a UTF-8 string" if isinstance(value, str)
                          else f"{show(value)} is not {self}")


@dataclass(frozen=True)
class Flag(Kind):
    """true or false."""

    def __str__(self) -> str:
        return "true or false"

    def check(self, value: Any, depth: int = 0) -> None:
        if not isinstance(value, bool):
            raise Invalid(f"{show(value)} is not {self}")


@dataclass(frozen=True)
class Anything(Kind):
    """Any JSON value: one only compared with fixed values, never used otherwise."""

    def __str__(self) -> str:
        return "any value"

    def check(self, value: Any, depth: int = 0) -> None:
        return None


@dataclass(frozen=True)
class OneOf(Kind):
    """The first of ``kinds`` that the value is."""

    kinds: tuple[Kind, ...]

    def __str__(self) -> str:
        return " or ".join(map(str, self.kinds))

    def check(self, value: Any, depth: int = 0) -> None:
        errors = []
        for kind in self.kinds:
            try:
                return kind.check(value, depth)
            except Invalid as e:
                errors.append(e)
        deepest = max(errors, key=lambda e: len(e.field))  # the kind it nearly was
        if deepest.field:
            raise deepest
        raise Invalid(f"{show(value)} is not {self}")


@dataclass(frozen=True)
class ListOf(Kind):
    """A list of at most ``max_len`` (at least ``min_len``) values of kind ``item``."""

    item: Kind
    max_len: int = 1 << 24
    min_len: int = 0

    def __str__(self) -> str:
        return f"a list (each {self.item})"

    def check(self, value: Any, depth: int = 0) -> None:
        if not isinstance(value, list):
            raise Invalid(f"{show(value)} is not {self}")
        if not self.min_len <= len(value) <= self.max_len:
            raise Invalid(f"a list of {len(value)} values; {self.min_len} to "
                          f"{self.max_len} are allowed")
        if _takes_text(self.item) and _all_text(value):
            return  # the fast path for a vocabulary's merges
        for i, item in enumerate(value):
            try:
                self.item.check(item, depth + 1)
            except Invalid as e:
                raise e.inside(f"[{i}]") from None


@dataclass(frozen=True)
class MapOf(Kind):
    """An object of any string keys, every value of kind ``value`` (a vocabulary)."""

    value: Kind

    def __str__(self) -> str:
        return f"an object (each value {self.value})"

    def check(self, value: Any, depth: int = 0) -> None:
        if not isinstance(value, dict):
            raise Invalid(f"{show(value)} is not an object")
        if _all_text(list(value)) and _fast_ints(self.value, value.values()):
            return  # the fast path for a vocabulary of 262k tokens
        for key, item in value.items():
            if not is_text(key):
                raise Invalid(f"the key {show(key)} is not a UTF-8 string")
            try:
                self.value.check(item, depth + 1)
            except Invalid as e:
                raise e.inside(key) from None


@dataclass(frozen=True)
class Obj(Kind):
    """An object whose listed ``fields`` (when present and not null) are of their kinds;
    other fields are not read. ``required`` fields must be present and not null."""

    fields: Mapping[str, Kind]
    required: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        return "an object"

    def check(self, value: Any, depth: int = 0) -> None:
        if not isinstance(value, dict):
            raise Invalid(f"{show(value)} is not an object")
        if depth > MAX_DEPTH:
            raise Invalid(f"nested more than {MAX_DEPTH} levels deep")
        for name in self.required:
            if value.get(name) is None:
                raise Invalid("missing", name)
        for name, kind in self.fields.items():
            item = value.get(name)
            if item is None:
                continue
            try:
                kind.check(item, depth + 1)
            except Invalid as e:
                raise e.inside(name) from None


@dataclass(frozen=True)
class Later(Kind):
    """The kind ``get()`` returns: one defined further down, for a recursive structure
    (a normalizer sequence of normalizers), bounded by ``Obj``'s MAX_DEPTH."""

    get: Callable[[], Kind]

    def __str__(self) -> str:
        return str(self.get())

    def check(self, value: Any, depth: int = 0) -> None:
        self.get().check(value, depth)


def _all_text(items: list) -> bool:
    """Every item a UTF-8 string (checked on the joined text: one encode for 262k)."""
    if not all(type(s) is str for s in items):
        return False
    return is_text("".join(items))


def _takes_text(kind: Kind) -> bool:
    return isinstance(kind, Text) or isinstance(kind, OneOf) and any(
        isinstance(k, Text) for k in kind.kinds)


def _fast_ints(kind: Kind, values: Any) -> bool:
    if not isinstance(kind, Int):
        return False
    values = list(values)
    if not values or not all(type(v) is int for v in values):
        return not values
    return kind.lo <= min(values) and max(values) <= kind.hi
