"""The ``gguflm`` command line. The only package that prints.

Each command lives in its own module here and exposes ``register(subparsers)``, which
adds its parser and sets ``func(args) -> int``. Modules import heavy dependencies inside
their functions so that ``gguflm --help`` and ``gguflm inspect`` start fast.

Exit status: 0 done; 1 an error in the input or the work (a file, a model, a prompt longer
than the context): one ``error: ...`` line; 2 a usage error (an unknown option, a bad
option value): the command's usage and one ``gguflm CMD: error: ...`` line; 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

# numpy's OpenBLAS on one thread unless the user chose (set before numpy is imported, so any
# OpenBLAS build honours it). Our products run in the numba kernels; BLAS only gets the small
# attention products, and its idle threads spin after each one, taking the kernels' cores
# (figures in docs/performance.md).
# LLM() lowers it at run time too, for library users (quant.matrix.entry_point_defaults).
if "OPENBLAS_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OPENBLAS_NUM_THREADS"] = "1"

from ..gguf.errors import GGUFError  # noqa: E402 - numpy (imported here) reads the above

# order = order shown in --help; a module that does not exist yet is skipped
COMMAND_MODULES = [
    "pull", "inspect", "tensor", "edit", "tokenize", "run", "chat", "embed", "rerank",
    "perplexity", "bench", "serve", "archs", "quantize", "convert", "split",
]


class CLIError(Exception):
    """A user-facing error: printed as one ``error: ...`` line, exit status 1."""


class UsageError(CLIError):
    """A bad option value found after parsing: the command's usage and the message, exit
    status 2 (as argparse does for the errors it finds itself)."""


class Parser(argparse.ArgumentParser):
    """argparse without guessing: an option is only ever its exact spelling (or
    ``--name=value``). argparse would otherwise read a single-dash word it does not know
    as a shorter option plus a value (``-ctk`` as ``-c tk``) or as the start of a longer
    one; llama.cpp's single-dash long options (``-no-cnv``, ``-sys``) need exact matches."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _get_option_tuples(self, option_string: str) -> list:
        return []  # no prefixes, no "-cVALUE": unknown options are reported as unknown


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from .llama_options import TOOLS_OF, add_llama_options

    parser = Parser(
        prog="gguflm", description="Read, check, write and run GGUF model files.")
    parser.add_argument("--version", action="version", version=f"gguflm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{name}":
                continue
            raise
        mod.register(sub)
    for name in TOOLS_OF:  # last: they fill in what the commands do not have
        if name in sub.choices:
            add_llama_options(sub.choices[name], name)
    parser.set_defaults(subparsers=sub.choices)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .common import finish_model_argument, normalize_argv, note_shared_cores

    parser = build_parser()
    known = frozenset(flag for sub in parser.get_default("subparsers").values()
                      for flag in sub._option_string_actions)
    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv), known)
    args, extra = parser.parse_known_args(argv)
    command = args.subparsers.get(args.command) if args.command else None
    if extra:  # an unknown option: the command's own usage, not the top-level one
        (command or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from ..quant.matrix import entry_point_defaults

    # the command owns the process: OpenMP and BLAS thread habits (spinning workers for one
    # user's commands, which set owns_cores; briefly spinning ones for the server, serving)
    entry_point_defaults(owns_cores=getattr(args, "owns_cores", False),
                         serving=getattr(args, "serving", False))
    try:
        finish_model_argument(args)
        if getattr(args, "owns_cores", False) or getattr(args, "serving", False):
            note_shared_cores(args)
        if getattr(args, "ignored_options", None) and not getattr(args, "log_disable", False):
            from .llama_options import notes

            for line in notes(args.ignored_options):
                print(line, file=sys.stderr)
        return int(args.func(args) or 0)
    except UsageError as e:
        (command or parser).error(str(e))
    except (GGUFError, CLIError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
