"""What several commands share: the MODEL argument, integer option types, reading a text
file, and loading a model with its tokenizer.

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
    """The MODEL positional: a GGUF file or a known model name (pulled on first use);
    ``optional``: it may be left out for the default model."""
    if not optional:
        p.add_argument("model", metavar="MODEL", help="GGUF file or known model name")
        return
    from ..hub import DEFAULT_MODEL

    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, metavar="MODEL",
                   help=f"GGUF file or known model name (default: {DEFAULT_MODEL})")


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


def load_model(name: str, threads: int | None = None) -> Loaded:
    """MODEL (a path or a known name, pulled with progress on stderr), loaded with its
    tokenizer; says so first when the kernels still have to be compiled."""
    from .. import load_model as load
    from ..quant.matrix import set_threads
    from ..tokenizer import Tokenizer
    from .pull import resolve

    path = resolve(name)
    set_threads(threads)
    say_if_compiling()
    t0 = time.perf_counter()
    model = load(path)
    tokenizer = Tokenizer.from_gguf(model.gguf)
    return Loaded(path, model, tokenizer, time.perf_counter() - t0)


def say_if_compiling() -> None:
    """One line on stderr when the kernels are not compiled yet (the first product then
    compiles them, which takes a minute once), so a silent pause is explained."""
    from ..quant import kernels

    if not kernels.is_compiled():
        print("gguflm: compiling the kernels (first run only, may take a minute) ...",
              file=sys.stderr, flush=True)
