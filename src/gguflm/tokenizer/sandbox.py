"""A Jinja sandbox with bounds: untrusted chat templates in bounded time and memory.

A GGUF's ``tokenizer.chat_template`` is code from whoever made the file. jinja2's
``ImmutableSandboxedEnvironment`` keeps it away from Python's internals but not from the
machine: ``10 ** 1000000000`` hangs the compiler (it folds constants), nested loops spin for
hours, ``{% set ns.x = ns.x ~ ns.x %}`` doubles a string to gigabytes, and format widths,
``center``, ``indent`` and ``tojson(indent=...)`` allocate whatever they are told to.

``BoundedEnvironment`` is that sandbox plus a ``Budget`` per compile or render, held in a
ContextVar (so renders in concurrent threads each have their own):

- time: every step the sandbox sees (attribute and item access, calls, operators, ``~``,
  every 1024th loop iteration, joins of output) checks the deadline and an optional cancel
  callback. Python threads cannot be killed; this is how a render is abandoned.
- size: every operation that can grow a value (``+ * ** %`` and ``~``, string methods and
  filters with widths or counts, joins, ``tojson``, printing a container) computes the size
  of its result *before* building it, and refuses strings or sequences longer than
  ``max_length`` and integers wider than ``max_int_bits``.
- memory: what each step builds is charged to the render (``sys.getsizeof``); past
  ``max_memory`` the render stops. Charges are never refunded, so this bounds what a render
  can hold at once from above.
- nesting: every list, tuple and dict the template builds (literals included) is weighed:
  its items counted through nesting and sharing, up to ``max_nodes``. Comparing, hashing
  or sorting values happens inside single Python calls that no deadline can interrupt;
  their cost is bounded by the weights of what they visit.

Constant folding at compile time goes through the same hooks under a small budget; a fold
that would break it raises, which jinja takes as "not a constant", so the expression is
left for render time (where the render's budget applies). Breaking a bound raises
``LimitExceeded`` (or ``Cancelled``); ``chat.py`` turns them into its error classes.

What stays unbounded in time is only the cost of single Python operations on values within
these caps (a sort of a million items, a regex filter over 4 Mi characters): seconds at
worst, past the deadline, with memory bounded.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes, pass_environment, pass_eval_context
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.filters import make_attrgetter
from jinja2.runtime import LoopContext, Macro, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import Namespace, _PassArg, generate_lorem_ipsum
from markupsafe import EscapeFormatter, Markup

__all__ = ["BoundedEnvironment", "Budget", "Cancelled", "LimitExceeded", "TemplateLimits",
           "bounded", "to_text", "tojson"]

MAX_INDENT = 1024  # tojson's indent (spaces or string length); real templates use 2 or 4
_TICK_EVERY = 1024  # loop iterations (and walked items) between two deadline checks


@dataclass(frozen=True)
class TemplateLimits:
    """The bounds of one compile or render of a chat template.

    ``timeout``: seconds. ``max_length``: characters (or items) of any one string or sequence
    the template builds, the prompt included (4 Mi: a million-token prompt). ``max_memory``:
    bytes of everything one render builds (never refunded). ``max_int_bits``: the widest
    integer an operator may produce (8192 bits: 2466 digits). ``max_source``: characters of
    template text (jinja compiles about 60 KB/s; real templates are under 20 KB).
    ``max_nodes``: the values inside any one list, tuple or dict the template builds, counted
    through nesting and sharing: what comparing or hashing it may visit (a tuple doubled 60
    times, ``(t, t)``, is tiny in memory but takes 2^60 steps to hash, in one uninterruptible
    Python call).
    """

    timeout: float = 2.0
    max_length: int = 1 << 22
    max_memory: int = 1 << 28
    max_int_bits: int = 1 << 13
    max_source: int = 1 << 17
    max_nodes: int = 1 << 20


# constant folding at compile time: a fold past these is simply not done (left for render)
COMPILE_LIMITS = TemplateLimits(max_length=1 << 16, max_memory=1 << 24)


class LimitExceeded(Exception):  # noqa: N818 - a signal, converted by chat.py
    """A bound broken: ``limit`` is "time", "length", "memory" or "integer"; the message
    says what the template tried."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class Cancelled(Exception):  # noqa: N818 - a signal, converted by chat.py
    """The render's cancel callback returned true."""


class Budget:
    """What one compile or render may still spend: a deadline, a memory allowance."""

    __slots__ = ("cancel", "deadline", "limits", "memory", "_ticks", "_weights")

    def __init__(self, limits: TemplateLimits,
                 cancel: Callable[[], bool] | None = None) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.timeout
        self.cancel = cancel
        self.memory = 0
        self._ticks = 0
        # id -> (weight, the container itself: kept so that its id is not reused)
        self._weights: dict[int, tuple[int, Any]] = {}

    def tick(self) -> None:
        """One step: past the deadline (or cancelled) the render stops here."""
        if time.monotonic() > self.deadline:
            raise LimitExceeded("time", f"ran for more than {self.limits.timeout:g} s")
        if self.cancel is not None:
            self._ticks += 1
            if not self._ticks & 63 and self.cancel():
                raise Cancelled()

    def length(self, n: int, what: str = "a string") -> None:
        """Refuse to build ``what`` of ``n`` characters or items."""
        if n > self.limits.max_length:
            raise LimitExceeded(
                "length", f"would build {what} of {_count(n)} characters or items (the "
                          f"limit is {self.limits.max_length:,})")

    def charge(self, value: Any) -> None:
        """Count what a step built against the memory allowance (and a container's nodes)."""
        if isinstance(value, str | bytes | int):
            self.memory += sys.getsizeof(value)
        elif isinstance(value, _CONTAINERS):
            self.memory += sys.getsizeof(value) + 32 * len(value)  # + new items, roughly
            n = self.weigh(value)
            if n > self.limits.max_nodes:
                raise LimitExceeded("length", f"would build a value of {_count(n)} nested "
                                              f"items (the limit is {self.limits.max_nodes:,})")
        else:
            return
        if self.memory > self.limits.max_memory:
            raise LimitExceeded(
                "memory", f"built more than {self.limits.max_memory >> 20} MiB of values")

    def weigh(self, value: Any) -> int:
        """1 + the weights of ``value``'s items (keys and values), through nesting and sharing:
        the most a comparison or a hash of it can visit. Containers of more than 64 are
        remembered, so that a new container over known ones is weighed in its own length."""
        if not isinstance(value, _CONTAINERS):
            return 1
        known = self._weights.get(id(value))
        if known is not None and known[1] is value:
            return known[0]
        total, cap = 1, self.limits.max_nodes
        items = value.items() if isinstance(value, dict) else value
        for i, item in enumerate(items):
            if not i % _TICK_EVERY:
                self.tick()
            total += self.weigh(item)  # a dict's (key, value) pair: 1 + both
            if total > cap:
                return total
        if total > 64:
            self._weights[id(value)] = (total, value)
            self.memory += 128  # the entry
        return total


_CONTAINERS = (list, tuple, dict, set, frozenset)
_BUDGET: ContextVar[Budget | None] = ContextVar("gguflm_template_budget", default=None)


def _current() -> Budget:
    # outside bounded() (nothing in gguflm does that) the size caps still hold
    return _BUDGET.get() or Budget(TemplateLimits(timeout=math.inf))


@contextmanager
def bounded(limits: TemplateLimits, cancel: Callable[[], bool] | None = None) -> Iterator[Budget]:
    """Run the enclosed compile or render under a fresh budget."""
    token = _BUDGET.set(Budget(limits, cancel))
    try:
        yield _BUDGET.get()  # type: ignore[misc]
    finally:
        _BUDGET.reset(token)


def _count(n: int) -> str:
    # huge counts (a width of 10**4000) as powers of ten, without printing them
    return f"{n:,}" if n < 10**30 else f"about 10^{int(n.bit_length() * 0.30103)}"


# -- sizes before building ---------------------------------------------------------------------

def _int(x: Any, default: int = 0) -> int:
    """An int argument as Python will take it (bool and index types too), else ``default``
    (the call itself then fails as it would have)."""
    try:
        return x.__index__() if not isinstance(x, int) else int(x)
    except (AttributeError, TypeError):
        return default


def _text_size(value: Any, budget: Budget) -> int:
    """An upper estimate of ``len(str(value))``, cheap, stopping early once it is past the
    length limit (shared parts are walked once, cycles are what repr prints for them)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, float):
        return 24
    if isinstance(value, Undefined):
        return 0
    limit = budget.limits.max_length
    memo: dict[int, int] = {}
    walked = [0]

    def walk(v: Any) -> int:
        if isinstance(v, str):  # inside a container: its repr, quotes and escapes included
            if v.isprintable():
                return len(v) + 2 + v.count("\\") + v.count("'")
            return 10 * len(v) + 2
        if isinstance(v, bytes):
            return 4 * len(v) + 3
        if isinstance(v, bool | int | float) or v is None or isinstance(v, Undefined):
            return _text_size(v, budget) + 16
        items: Iterable[Any]
        if isinstance(v, Namespace):
            items = object.__getattribute__(v, "_Namespace__attrs").items()
            extra = 12
        elif isinstance(v, Mapping):
            items = v.items()
            extra = 2
        elif isinstance(v, Sequence | AbstractSet | types.MappingProxyType) \
                or type(v).__name__.startswith("dict_"):
            items = v  # type: ignore[assignment]
            extra = 16  # the longest type prefix a view or set prints
        else:
            return 200  # an object's repr: <Macro ...>, <LoopContext ...>, a function
        key = id(v)
        if key in memo:
            return memo[key]
        memo[key] = 6  # a cycle prints as [...] / {...}
        total = extra
        for item in items:
            walked[0] += 1
            if not walked[0] % _TICK_EVERY:
                budget.tick()
            total += 2 + (walk(item[0]) + 2 + walk(item[1]) if isinstance(v, Mapping | Namespace)
                          else walk(item))
            if total > limit:
                break
        memo[key] = total
        return total

    return walk(value)


_PRINTF = re.compile(r"%(?:\(([^)]*)\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.)", re.S)


def _printf_size(fmt: str | bytes, args: Any, budget: Budget) -> int:
    """An upper estimate of ``len(fmt % args)``: widths, precisions and the arguments'
    printed sizes (``*`` widths read from the arguments, as Python does)."""
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    positional = list(args) if isinstance(args, tuple) else [args]
    mapping = args if isinstance(args, Mapping) else {}
    size, i = len(text), 0

    def take() -> Any:
        nonlocal i
        i += 1
        return positional[i - 1] if i - 1 < len(positional) else None

    for m in _PRINTF.finditer(text):
        key, width, prec, conv = m.groups()
        if conv == "%":
            continue
        w = abs(_int(take())) if width == "*" else int(width or 0)
        p = abs(_int(take())) if prec == "*" else int(prec or 0)
        arg = mapping.get(key) if key is not None and hasattr(mapping, "get") else take()
        size += w + p + (_text_size(arg, budget) if conv in "rsa" else 340)
        if size > budget.limits.max_length:
            break
    return size


def _spec_size(spec: str) -> int:
    """The largest number in a str.format spec ("{:>99999}"): its width or precision."""
    numbers = re.findall(r"\d+", spec)
    return max((int(n) if len(n) < 19 else 10**19 for n in numbers), default=0)


# -- the checks made before a call builds something --------------------------------------------

def _check_str_method(budget: Budget, name: str, s: str | bytes, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Size checks of the str/bytes methods whose result can outgrow their input; returns
    the arguments to call with (``join`` gets its items as a list, counted)."""
    n = len(s)
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        budget.length(max(n, _int(width)))
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        budget.length(n + s.count("\t" if isinstance(s, str) else b"\t") * max(_int(tab), 0))
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, str | bytes) and isinstance(new, str | bytes):
            count = s.count(old) if old else n + 1  # type: ignore[arg-type]
            limit = _int(args[2] if len(args) > 2 else kwargs.get("count", -1), -1)
            if limit >= 0:
                count = min(count, limit)
            budget.length(n + count * max(len(new) - len(old), 0))
    elif name == "join" and args:
        items = list(_Guarded(args[0]))
        budget.length(sum(len(x) if isinstance(x, str | bytes) else 0 for x in items)
                      + n * max(len(items) - 1, 0))
        return (items, *args[1:])
    elif name == "translate" and args:
        table = args[0]
        values = table.values() if isinstance(table, Mapping) else \
            table if isinstance(table, Sequence) and not isinstance(table, str | bytes) else ()
        widest = max((len(v) if isinstance(v, str | bytes) else 1 for v in values), default=1)
        budget.length(n * widest)
    return args


def _check_call(budget: Budget, obj: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[Any, ...]:
    if isinstance(obj, types.BuiltinMethodType):  # a bound method of a builtin value
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str | bytes):
            return _check_str_method(budget, obj.__name__, owner, args, kwargs)
        if isinstance(owner, int) and obj.__name__ == "to_bytes":
            budget.length(_int(args[0] if args else kwargs.get("length", 1)), "a bytes value")
    return args


# -- filters -----------------------------------------------------------------------------------

# filters that print their value (a container as its repr), and the growth of each
_TEXT_FILTERS = {"capitalize", "center", "e", "escape", "forceescape", "format", "indent",
                 "lower", "replace", "string", "striptags", "title", "trim", "truncate",
                 "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr"}


# filters whose time grows faster than their input (no deadline check runs inside them):
# the most characters each may be given. jinja's wordwrap (textwrap) slices off each line of
# a long word, square in the word's length: the limit keeps it well under the render deadline.
_FILTER_INPUT_LIMITS = {"wordwrap": 32 * 1024}


def _filter_checks(budget: Budget, name: str, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> None:
    """Size checks of the filters that can outgrow their input (value first in ``args``)."""
    if not args:
        return
    value, rest = args[0], args[1:]

    def arg(i: int, key: str, default: Any) -> Any:
        return rest[i] if len(rest) > i else kwargs.get(key, default)

    if name in _TEXT_FILTERS:
        size = _text_size(value, budget)
        budget.length(size)
        limit = _FILTER_INPUT_LIMITS.get(name)
        if limit is not None and size > limit:
            raise LimitExceeded("length", f"asked {name} for a text of {_count(size)} "
                                          f"characters (the limit is {_count(limit)})")
    if name == "center":
        budget.length(max(size, _int(arg(0, "width", 80))))
    elif name == "indent":
        width = arg(0, "width", 4)
        w = len(width) if isinstance(width, str) else max(_int(width), 0)
        lines = str(value).count("\n") + 1  # the value's size was checked above
        budget.length(size + w * lines)
    elif name == "format":
        if not isinstance(value, str):
            value = str(value)
        budget.length(_printf_size(value, kwargs or rest, budget))
    elif name == "replace":
        _check_str_method(budget, "replace", str(value),
                          (str(arg(0, "old", "")), str(arg(1, "new", "")),
                           *([] if arg(2, "count", None) is None else [arg(2, "count", None)])),
                          {})
    elif name == "wordwrap":
        width = max(_int(arg(0, "width", 79)), 1)
        wrap = arg(2, "wrapstring", None)
        text = str(value)
        lines = size // width + text.count(" ") + text.count("\n") + 1
        budget.length(size + lines * (len(wrap) if isinstance(wrap, str) else 1))
    elif name == "batch":
        if arg(1, "fill_with", None) is not None:
            budget.length(_int(arg(0, "linecount", 0)), "a batch")
    elif name == "slice":
        budget.length(_int(arg(0, "slices", 0)) * 8, "a list of slices")
    elif name == "pprint":
        budget.length(2 * _text_size(value, budget))


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    skip = 1 if _PassArg.from_obj(func) is not None else 0  # context/eval_ctx/environment

    @functools.wraps(func)  # keeps jinja_pass_arg
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _current()
        budget.tick()
        _filter_checks(budget, name, args[skip:], kwargs)
        result = func(*args, **kwargs)
        budget.charge(result)
        return result

    return guarded


@pass_eval_context
def _join(eval_ctx: Any, value: Iterable[Any], d: str = "",
          attribute: str | int | None = None) -> str:
    """jinja's ``join`` (without autoescape, as here), its items counted before joining."""
    if attribute is not None:
        value = map(make_attrgetter(eval_ctx.environment, attribute), value)
    budget = _current()
    items = list(_Guarded(value))
    sep = str(d)
    budget.length(sum(_text_size(x, budget) for x in items) + len(sep) * max(len(items) - 1, 0))
    return sep.join(map(str, items))


@pass_environment
def _sum(environment: Any, iterable: Iterable[Any], attribute: str | int | None = None,
         start: Any = 0) -> Any:
    """jinja's ``sum``; sums of lists (``start=[]``) have their length checked first."""
    if attribute is not None:
        iterable = map(make_attrgetter(environment, attribute), iterable)
    items = list(_Guarded(iterable))
    if isinstance(start, list | tuple):
        _current().length(len(start) + sum(len(x) for x in items if isinstance(x, Sequence)),
                          "a list")
    return sum(items, start)


def tojson(x: Any, ensure_ascii: bool = False, indent: int | str | None = None,
           separators: Sequence[str] | None = None, sort_keys: bool = False) -> str:
    """Hugging Face's ``tojson`` (``json.dumps`` with its options, no HTML escaping), encoded
    piecewise so that the output's length is checked as it grows."""
    budget = _current()
    width = len(indent) if isinstance(indent, str) else _int(indent) if indent is not None else 0
    if width > MAX_INDENT:
        raise LimitExceeded("length", f"asked tojson for an indent of {_count(width)} (the "
                                      f"limit is {MAX_INDENT})")
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent,
                               separators=tuple(separators) if separators else None,
                               sort_keys=sort_keys)
    if isinstance(x, str):
        budget.length(12 * len(x) + 2)
        return encoder.encode(x)
    if isinstance(x, Iterator):  # ``tools | map(...) | tojson``: a generator, as a list
        x = list(x)
    if indent is None and not separators \
            and 12 * _text_size(x, budget) <= budget.limits.max_length:
        # the usual `tool | tojson`: the JSON text is at most 12x the printed size (an astral
        # character: 1 in a repr, 12 as "\\ud83d\\ude00"), so the fast C encoder may run
        return encoder.encode(x)
    parts, size, limit = [], 0, budget.limits.max_length
    for i, chunk in enumerate(encoder.iterencode(x)):
        size += len(chunk)
        if size > limit:
            budget.length(size, "a JSON text")
        if not i % _TICK_EVERY:
            budget.tick()
        parts.append(chunk)
    return "".join(parts)


def _plain(value: Any) -> Any:
    """``safe`` with autoescape off: the value as it is (a string stays a plain string, so
    joining it to ``tojson``'s text does not HTML-escape that text)."""
    return str(value) if isinstance(value, Markup) else value


def _undefined_as_text(value: Any, other: Any) -> Any:
    return "" if isinstance(value, Undefined) and isinstance(other, str) else value


def to_text(value: Any) -> str:
    """``str(value)``, its printed size checked first (a template's message to raise)."""
    budget = _current()
    budget.length(_text_size(value, budget), "a printed value")
    return str(value)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    _current().length(_int(n) * _int(max) * 12, "a lorem ipsum text")
    return generate_lorem_ipsum(n, html, min, max)


# -- iteration, formatting, code generation ----------------------------------------------------

class _Guarded:
    """An iterable that checks the deadline every 1024 items (the loops of a template, and
    the items a join or sum reads); its length is the wrapped one's, when it has one."""

    __slots__ = ("_of",)

    def __init__(self, iterable: Any) -> None:
        self._of = iterable

    def __iter__(self) -> Iterator[Any]:
        budget = _current()
        for i, x in enumerate(self._of):
            if not i % _TICK_EVERY:
                budget.tick()
            yield x

    def __len__(self) -> int:
        return len(self._of)  # TypeError when unsized: LoopContext then counts as it goes


class _BoundedFormatter(SandboxedFormatter):
    """``str.format`` in the sandbox, with widths, conversions and the running length of
    the result checked before each field is formatted."""

    _size = 0

    def vformat(self, format_string: str, args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> str:
        self._size = len(format_string)
        return super().vformat(format_string, args, kwargs)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion is not None:
            budget = _current()
            budget.length(_text_size(value, budget) * (10 if conversion == "a" else 1))
        return super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> Any:
        budget = _current()
        budget.tick()
        self._size += _spec_size(format_spec) + _text_size(value, budget)
        budget.length(self._size)
        return super().format_field(value, format_spec)


class _BoundedEscapeFormatter(_BoundedFormatter, EscapeFormatter):
    pass


_GUARD = "gguflm guard"  # a filter no template can name (it has a space): the loop guard


class _CodeGenerator(CodeGenerator):
    """jinja's code generator, with every ``for`` loop's iterable wrapped in the ``_Guarded``
    filter (jinja forbids new node types; a filter is called directly, not through the
    sandbox's call) and ``~`` compiled to ``environment.join_values``."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        for loop in node.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, _GUARD, [], [], None, None,
                                     lineno=loop.iter.lineno)
            loop.iter.set_environment(self.environment)
        super().visit_Template(node, frame)

    # literal lists, dicts and tuples are weighed as they are built (their items may be
    # large shared values): environment.built([...])
    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.built(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.built(")
        super().visit_Dict(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":  # an assignment target: a, b = ...
            super().visit_Tuple(node, frame)
            return
        self.write("environment.built(")
        super().visit_Tuple(node, frame)
        self.write(")")

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.join_values((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the bounds above (see the module docstring). Compile and
    render inside ``bounded(limits)``; autoescape must stay off (``~`` joins plain text)."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, **options: Any) -> None:
        if options.get("autoescape"):
            raise ValueError("BoundedEnvironment joins plain text: no autoescape")
        super().__init__(**options)
        self.finalize = self._finalize
        self.filters["join"] = _join
        self.filters["sum"] = _sum
        self.filters["tojson"] = tojson
        self.filters["safe"] = _plain  # no autoescape: a Markup would escape what joins it
        self.globals["lipsum"] = _lipsum
        self.filters[_GUARD] = _Guarded

    def guard_filters(self) -> None:
        """Wrap every filter installed so far in the size and time checks (call once, after
        adding the environment's own filters)."""
        for name, func in list(self.filters.items()):
            if name != _GUARD:
                self.filters[name] = _guard_filter(name, func)

    # -- the sandbox's hooks --------------------------------------------------------------------
    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _current()
        budget.tick()
        if operator == "+":  # undefined + text is the text (llama.cpp's templates)
            left, right = _undefined_as_text(left, right), _undefined_as_text(right, left)
        if operator in ("+", "*", "**", "%"):
            _check_binop(budget, operator, left, right)
        result = self.binop_table[operator](left, right)
        budget.charge(result)
        return result

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = _current()
        budget.tick()
        if isinstance(obj, LoopContext) and args:  # a recursive loop's loop(children)
            args = (_Guarded(args[0]), *args[1:])
        else:
            args = _check_call(budget, obj, args, kwargs)
        result = super().call(context, obj, *args, **kwargs)
        if not isinstance(obj, Macro):  # a macro's output was charged as it was joined
            budget.charge(result)
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        _current().tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget = _current()
        budget.tick()
        result = super().getitem(obj, argument)
        if isinstance(argument, slice):
            budget.charge(result)
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """jinja's ``str.format`` wrapper, with the bounded formatter."""
        if not isinstance(value, types.MethodType | types.BuiltinMethodType) \
                or value.__name__ not in ("format", "format_map"):
            return None
        f_self = value.__self__
        if not isinstance(f_self, str):
            return None
        str_type = type(f_self)
        is_format_map = value.__name__ == "format_map"
        formatter: SandboxedFormatter
        if isinstance(f_self, Markup):
            formatter = _BoundedEscapeFormatter(self, escape=f_self.escape)
        else:
            formatter = _BoundedFormatter(self)

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(
                        f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs, args = args[0], ()
            return str_type(formatter.vformat(f_self, args, kwargs))

        return functools.update_wrapper(wrapper, value)

    # -- what the generated code calls ----------------------------------------------------------
    def built(self, value: Any) -> Any:
        """A list, dict or tuple literal, just built: charged and weighed."""
        budget = _current()
        budget.tick()
        budget.charge(value)
        return value

    def join_values(self, values: tuple[Any, ...]) -> str:
        """``a ~ b ~ c``: the parts printed and joined, their length checked first."""
        budget = _current()
        budget.tick()
        budget.length(sum(_text_size(v, budget) for v in values))
        result = "".join(map(str, values))
        budget.charge(result)
        return result

    def concat(self, parts: Iterable[str]) -> str:  # type: ignore[override]
        """Joins output: a macro's or block's buffer, and the rendered template itself."""
        budget = _current()
        chunks, size = [], 0
        for i, chunk in enumerate(parts):
            size += len(chunk)
            if not i % _TICK_EVERY:
                budget.tick()
            if size > budget.limits.max_length:
                budget.length(size, "an output")
            chunks.append(chunk)
        result = "".join(chunks)
        budget.charge(result)
        return result

    def _finalize(self, value: Any) -> Any:
        """``{{ value }}``: a container's printed size is checked before it is printed."""
        if not isinstance(value, str | int | float | Undefined) and value is not None:
            budget = _current()
            budget.length(_text_size(value, budget), "a printed value")
        return value


def _check_binop(budget: Budget, op: str, left: Any, right: Any) -> None:
    seqs = str | bytes | list | tuple
    if op == "+":
        if isinstance(left, seqs) and isinstance(right, seqs):
            budget.length(len(left) + len(right))
    elif op == "*":
        if isinstance(left, seqs) and isinstance(right, int):
            budget.length(len(left) * max(right, 0))
        elif isinstance(right, seqs) and isinstance(left, int):
            budget.length(len(right) * max(left, 0))
        elif isinstance(left, int) and isinstance(right, int):
            _int_bits(budget, left.bit_length() + right.bit_length())
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            _int_bits(budget, left.bit_length() * right)
    elif op == "%" and isinstance(left, str | bytes):
        budget.length(_printf_size(left, right, budget))


def _int_bits(budget: Budget, bits: int) -> None:
    if bits > budget.limits.max_int_bits:
        raise LimitExceeded("integer", f"would compute an integer of {_count(bits)} bits (the "
                                       f"limit is {budget.limits.max_int_bits:,})")

