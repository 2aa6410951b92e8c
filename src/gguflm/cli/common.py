"""What several commands share: the MODEL argument (positional or ``-m``), integer option
types, llama.cpp's options that mean nothing here (accepted and noted), the model-loading
options (``--override-kv``, ``--no-bos``, ``--rope-style``), reading a text file, loading a
model with its tokenizer and warming it up, and a progress line for long work.

Heavy modules (numpy, the model) are imported inside the functions, so that importing this
module keeps ``gguflm --help`` fast.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from . import CLIError


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer of at least 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


def add_model_argument(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """The MODEL positional: a GGUF file or a known model name (pulled on first use), also
    as ``-m/--model MODEL`` (llama.cpp's spelling); ``optional``: it may be left out for
    the default model. ``finish_model_argument`` reconciles the two after parsing."""
    if not optional:
        p.add_argument("model", nargs="?", metavar="MODEL",
                       help="GGUF file or known model name (or -m MODEL)")
        p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL",
                       help="the same as the positional MODEL")
        p.set_defaults(model_required=True)
        return
    from ..hub import DEFAULT_MODEL

    p.add_argument("model", nargs="?", metavar="MODEL",
                   help=f"GGUF file or known model name (default: {DEFAULT_MODEL})")
    p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL",
                   help="the same as the positional MODEL")
    p.set_defaults(model_default=DEFAULT_MODEL)


def finish_model_argument(args: argparse.Namespace) -> None:
    """After parsing: MODEL from the positional or ``-m`` (not two different ones), else
    the default; a UsageError when a required MODEL is missing."""
    from . import UsageError

    if not hasattr(args, "model_flag"):
        return
    flag, pos = args.model_flag, args.model
    if flag is not None and pos is not None and flag != pos:
        raise UsageError(f"two models given: {pos} and -m {flag}")
    args.model = flag if flag is not None else pos
    if args.model is None:
        if getattr(args, "model_required", False):
            raise UsageError("MODEL is required (a GGUF file or a known model name)")
        args.model = args.model_default


class _Ignored(argparse.Action):
    """A llama.cpp option that means nothing here: accepted, remembered, noted once."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        seen = list(getattr(namespace, "ignored_options", None) or [])
        value = (values[0] if values else None) if isinstance(values, list) else values
        seen.append(option_string if value in (None, True) else f"{option_string} {value}")
        namespace.ignored_options = seen


# llama.cpp's GPU and memory options: (flags, takes a value). ``-fa`` takes on|off|auto or
# nothing (see ``normalize_argv``).
IGNORED_OPTIONS = (
    (("-ngl", "--n-gpu-layers", "--gpu-layers"), True),
    (("--mlock",), False),
    (("--no-mmap",), False),
    (("-fa", "--flash-attn"), None),
    (("-dev", "--device"), True),
    (("-mg", "--main-gpu"), True),
)
FLASH_ATTN_VALUES = ("on", "off", "auto")


def add_ignored_options(p: argparse.ArgumentParser) -> None:
    """llama.cpp's GPU/memory options (-ngl, --mlock, --no-mmap, -fa, ...): accepted, and
    noted on stderr as ignored, so that a llama.cpp command line runs as it is."""
    g = p.add_argument_group("llama.cpp's GPU and memory options")
    for i, (flags, value) in enumerate(IGNORED_OPTIONS):
        shown = ("accepted and ignored, as are --mlock, --no-mmap, -fa/--flash-attn "
                 "[on|off|auto], -dev, -mg: gguflm runs on the CPU from the memory-mapped "
                 "file" if i == 0 else argparse.SUPPRESS)
        if value is None:
            g.add_argument(*flags, action=_Ignored, nargs="?", const=True,
                           choices=FLASH_ATTN_VALUES, help=shown)
        elif value:
            g.add_argument(*flags, action=_Ignored, nargs=1, metavar="N", help=shown)
        else:
            g.add_argument(*flags, action=_Ignored, nargs=0, help=shown)
    p.set_defaults(ignored_options=None)


def normalize_argv(argv: list[str]) -> list[str]:
    """``-fa`` without one of on/off/auto after it is the plain switch (so that it never
    swallows the next argument, e.g. a MODEL)."""
    out = []
    for i, a in enumerate(argv):
        if a in ("-fa", "--flash-attn") and (i + 1 >= len(argv)
                                              or argv[i + 1] not in FLASH_ATTN_VALUES):
            a = f"{a}=on" if a.startswith("--") else "--flash-attn=on"
        out.append(a)
    return out


def add_load_options(p: argparse.ArgumentParser) -> None:
    """How the model is loaded: ``--override-kv``, ``--no-bos``, ``--rope-style``."""
    g = p.add_argument_group("loading the model")
    g.add_argument("--override-kv", metavar="KEY=TYPE:VALUE", action="append", default=[],
                   type=_kv_overrides,
                   help="replace a metadata value at load, as llama.cpp does (TYPE: int, "
                        "float, bool, str; several: repeat, or separate with commas), e.g. "
                        "llama.rope.freq_base=float:100000")
    g.add_argument("--no-bos", action="store_true",
                   help="never add the BOS token, whatever the file's metadata says")
    g.add_argument("--rope-style", choices=("norm", "neox"),
                   help="RoPE pairing to use instead of the architecture's (for a file whose "
                        "Q/K rows were converted for the other one)")


def _kv_overrides(text: str) -> list[tuple[str, Any]]:
    from ..model.overrides import KVOverrideError, parse_kv_override

    try:
        return [parse_kv_override(item) for item in text.split(",") if item]
    except KVOverrideError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """``load_model``/``LLM`` keywords from ``add_load_options``: kv_overrides, rope_style."""
    overrides: dict[str, Any] = {}
    for group in getattr(args, "override_kv", None) or []:
        overrides.update(group)
    if getattr(args, "no_bos", False):
        overrides["tokenizer.ggml.add_bos_token"] = False
    return {"kv_overrides": overrides or None, "rope_style": getattr(args, "rope_style", None)}


def add_threads_argument(p: argparse.ArgumentParser) -> None:
    """``-t N``: threads for the matrix kernels (default: the cores available)."""
    p.add_argument("-t", "--threads", type=positive_int, default=None, metavar="N",
                   help="threads (default: the cores available)")


def read_text(path: str | Path, errors: str = "strict") -> str:
    """A UTF-8 text file ('-': standard input), or a CLIError that says why not.
    ``errors="surrogateescape"`` keeps invalid bytes instead of refusing the file."""
    try:
        if str(path) == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8", errors=errors) as f:
            return f.read()
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise CLIError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


class Loaded(NamedTuple):
    """A model file loaded for a command."""

    path: Path
    model: Any       # gguflm.model.Model
    tokenizer: Any   # gguflm.tokenizer.Tokenizer
    seconds: float   # loading the model and its tokenizer (not pulling it)


def load_model(name: str, threads: int | None = None,
               options: dict[str, Any] | None = None) -> Loaded:
    """MODEL (a path or a known name, pulled with progress on stderr), loaded with its
    tokenizer (``options``: from ``load_options``); says so first when the kernels still
    have to be compiled."""
    from .. import load_model as load
    from ..quant.matrix import set_threads
    from ..tokenizer import Tokenizer
    from .pull import resolve

    path = resolve(name)
    set_threads(threads)
    say_if_compiling()
    t0 = time.perf_counter()
    model = load(path, **(options or {}))
    tokenizer = Tokenizer.from_gguf(model.gguf)
    return Loaded(path, model, tokenizer, time.perf_counter() - t0)


def warm_up(model: Any) -> float:
    """Run the compiled paths once (``Model.warm_up``) so that the timed work that follows
    pays neither their compilation (first run: its steps shown on stderr) nor their
    loading; the seconds."""
    t0 = time.perf_counter()
    progress = _CompileProgress()
    model.warm_up(report=progress)
    progress.finish()
    return time.perf_counter() - t0


class _CompileProgress:
    """``Model.warm_up``'s report: one stderr line per compilation step, with the time it
    is expected to take (the model's estimate, scaled by how the steps before went: a busy
    machine takes longer) and, when done, the time it took."""

    def __init__(self) -> None:
        self.t0 = self.started = 0.0
        self.expected = self.taken = 0.0  # of the steps so far

    def _close(self) -> None:
        if self.started:
            took = time.perf_counter() - self.started
            self.taken += took
            print(f" {took:.0f} s", file=sys.stderr, flush=True)

    def __call__(self, step: int, steps: int, what: str, seconds: float) -> None:
        self._close()
        pace = min(6.0, max(0.5, self.taken / self.expected)) if self.expected else 1.0
        self.expected += seconds
        self.started = time.perf_counter()
        self.t0 = self.t0 or self.started
        print(f"gguflm: [{step}/{steps}] compiling {what} (about {seconds * pace:.0f} s) ...",
              end="", file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self.started:
            self._close()
            print(f"gguflm: kernels ready in {time.perf_counter() - self.t0:.0f} s "
                  "(later runs load them in about a second)", file=sys.stderr, flush=True)


class Progress:
    """One updating line on stderr for long work (``done/total unit pct ETA``), only when
    stderr is a terminal and ``enabled``; otherwise silent."""

    def __init__(self, label: str, total: int, unit: str = "", enabled: bool = True,
                 stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0 and self.stream.isatty()
        self.label, self.total, self.unit = label, total, unit
        self.t0 = time.perf_counter()
        self._last = 0.0
        self._width = 0

    def update(self, done: int, extra: str = "") -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        elapsed = now - self.t0
        eta = f", ETA {_duration(elapsed / done * (self.total - done))}" \
            if 0 < done < self.total else ""
        unit = f" {self.unit}" if self.unit else ""
        line = (f"{self.label}: {done}/{self.total}{unit} {100 * done // self.total}%"
                f"{extra}{eta}")
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)

    def close(self) -> None:
        """Erase the line (what follows starts at the left margin)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        self._width = 0


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds} s"
    m, s = divmod(seconds, 60)
    return f"{m} min {s:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def process_escapes(text: str) -> str:
    """llama.cpp's ``-e``: \\n \\r \\t \\' \\" \\\\ and \\xHH (a byte: \\xC3\\xA9 is é)
    become what they name; any other backslash stays as it is."""
    out, i = bytearray(), 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in _ESCAPES:
                out += _ESCAPES[nxt].encode()
                i += 2
                continue
            hexa = text[i + 2:i + 4]
            if nxt == "x" and len(hexa) == 2 and all(h in "0123456789abcdefABCDEF" for h in hexa):
                out.append(int(hexa, 16))
                i += 4
                continue
        out += c.encode("utf-8", "surrogatepass")
        i += 1
    return out.decode("utf-8", "replace")


def say_if_compiling() -> None:
    """One line on stderr when the kernels are not compiled yet (the first product then
    compiles them, once), so a silent pause is explained."""
    from ..model.base import compiled

    if not compiled():
        print("gguflm: first run on this machine: compiling the kernels, once "
              "(1-2 minutes) ...", file=sys.stderr, flush=True)


def add_lookup_option(p: argparse.ArgumentParser) -> None:
    """``--lookup K``: prompt-lookup speculative decoding (engine/lookup.py)."""
    from ..engine.lookup import check_lookup

    def lookup(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        try:
            return check_lookup(n)
        except ValueError as e:  # out of range
            raise argparse.ArgumentTypeError(str(e)) from None

    p.add_argument("--lookup", type=lookup, default=0, metavar="K",
                   help="draft up to K tokens per step from the prompt and the text so far, "
                        "verified in one pass: faster when the reply repeats its input "
                        "(rewriting, editing), the same text (default: 0, off)")


def add_constraint_options(p: argparse.ArgumentParser) -> None:
    """Structured output: ``--json-schema``, ``--grammar``, ``--regex`` (at most one)."""
    g = p.add_argument_group("structured output (at most one; every token kept valid)")
    g.add_argument("--json-schema", metavar="FILE_OR_JSON",
                   help="the output is JSON matching this schema (JSON text, or a file)")
    g.add_argument("--grammar", metavar="FILE",
                   help="the output is a sentence of this GBNF (or Lark) grammar file "
                        "(llama.cpp's grammars/*.gbnf work unchanged)")
    g.add_argument("--regex", metavar="RE", help="the output fully matches this expression")


def constraint_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The API's constraint keywords from ``add_constraint_options``' options (files read
    here); a CLIError naming the problem for an unreadable file or bad schema text."""
    from ..engine.errors import InvalidRequestError
    from ..engine.schema import schema_from_arg

    spec: dict[str, Any] = {}
    try:
        if args.json_schema is not None:
            spec["json_schema"] = schema_from_arg(args.json_schema)
    except InvalidRequestError as e:
        raise CLIError(f"--json-schema: {e}") from None
    if args.grammar is not None:
        spec["grammar"] = read_text(args.grammar)
    if args.regex is not None:
        spec["regex"] = args.regex
    if len(spec) > 1:
        raise CLIError("give at most one of --json-schema, --grammar and --regex")
    return spec


def make_constraint(spec: dict[str, Any], tokenizer: Any) -> Any:
    """The engine's Constraint for ``constraint_spec``'s keywords (None: none); CLIError
    naming the problem for a schema or grammar that cannot be enforced."""
    if not spec:
        return None
    from ..engine.constraints import Constraint
    from ..engine.errors import InvalidRequestError
    from ..engine.grammar import constraint_from_request

    try:
        return Constraint(constraint_from_request(**spec, tokenizer=tokenizer), tokenizer)
    except InvalidRequestError as e:
        raise CLIError(f"--{(e.param or 'grammar').split('.')[0].replace('_', '-')}: {e}") \
            from None
