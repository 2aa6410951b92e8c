"""``gguflm quantize IN [OUT] TYPE [NTHREADS]``: llama-quantize's file, byte for byte.

Progress goes to stderr: on a terminal one bar that advances tensor by tensor, otherwise
one line per tensor (like llama-quantize's log). The output appears only when complete.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from . import CLIError, UsageError
from .common import add_threads_argument

_BAR = 24


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..quant.mixture import ALIASES, FILE_TYPES

    types = ", ".join([*FILE_TYPES, *ALIASES])
    p = subparsers.add_parser(
        "quantize", help="quantize a GGUF model (llama-quantize's files, byte for byte)",
        description="Write OUT, the GGUF model IN quantized to TYPE exactly as llama.cpp's "
                    "llama-quantize does without an importance matrix: the same per-tensor "
                    f"types and the same bytes. TYPE: {types}.")
    p.add_argument("words", nargs="*", metavar="IN [OUT] TYPE [NTHREADS]",
                   help="IN: a GGUF model (F32/F16/BF16; a quantized one with "
                        "--allow-requantize) or a known model name; OUT: the new file (must "
                        "not be IN; default: ggml-model-TYPE.gguf beside IN, as "
                        "llama-quantize names it); TYPE: e.g. Q4_K_M, Q8_0, F16, COPY; "
                        "NTHREADS: the same as -t")
    p.add_argument("-m", "--model", dest="input_flag", metavar="IN",
                   help="IN as an option (then the words are [OUT] TYPE [NTHREADS])")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow quantizing tensors that are already quantized (dequantized "
                        "first; worse than quantizing from 16 or 32 bits)")
    p.add_argument("--output-tensor-type", metavar="T",
                   help="ggml type of output.weight (e.g. Q8_0, F16)")
    p.add_argument("--token-embedding-type", metavar="T",
                   help="ggml type of token_embd.weight")
    p.add_argument("--leave-output-tensor", action="store_true",
                   help="keep output.weight as it is")
    p.add_argument("--pure", action="store_true",
                   help="no mixture: every quantizable tensor gets TYPE's own ggml type")
    add_threads_argument(p)
    p.set_defaults(func=run)


class TensorProgress:
    """Draws ``quantize_file``'s progress on stderr."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._width = 0

    def __call__(self, done: int, total: int, tensor: Any) -> None:
        if tensor is None:
            if self.tty and self._width:
                self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            return
        if tensor.converted:
            what = f"{tensor.source.ggml_name} -> {tensor.target.ggml_name}"
        else:
            what = f"{tensor.source.ggml_name} (kept)"
        if self.tty:
            filled = _BAR * done // max(total, 1)
            line = (f"[{'#' * filled}{'.' * (_BAR - filled)}] {done + 1}/{total} "
                    f"{tensor.name} {what}")
            self.stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            width = len(str(total))
            self.stream.write(f"[{done + 1:{width}d}/{total}] {tensor.name:<40s} {what}\n")
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    from ..gguf import open as open_gguf
    from ..quant import quantize_kernels
    from ..quant.mixture import Options, file_type
    from ..quant.quantize_file import check_output, plan, quantize_file
    from .pull import resolve

    inp, output, type_name = _words(args)
    ft = file_type(type_name)  # an unknown type is the first error, before any file access
    src = resolve(inp)
    out = Path(output) if output is not None else (
        (src.parent if Path(inp).exists() else Path.cwd()) / f"ggml-model-{type_name}.gguf")
    check_output(src, out)
    if not out.parent.is_dir():
        raise CLIError(f"cannot write {out}: {out.parent} is not a directory")
    options = Options(_ggml_type(args.output_tensor_type),
                      _ggml_type(args.token_embedding_type), args.pure,
                      not args.leave_output_tensor)
    # plan first, to say whether the quantizers must be compiled (once per installation)
    # before the wait; quantize_file plans again (cheap) and refuses before writing anything
    with open_gguf(src) as f:
        plans, _ = plan(f, ft, options=options, allow_requantize=args.allow_requantize)
    if not quantize_kernels.is_compiled({p.target for p in plans if p.converted}):
        print("gguflm: compiling the quantizers (first run only, may take a minute) ...",
              file=sys.stderr, flush=True)
    progress = TensorProgress()
    try:
        report = quantize_file(src, out, ft, allow_requantize=args.allow_requantize,
                               output_tensor_type=options.output_tensor_type,
                               token_embedding_type=options.token_embedding_type,
                               pure=args.pure, leave_output_tensor=args.leave_output_tensor,
                               threads=args.threads, progress=progress)
    except OSError as e:
        raise CLIError(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        progress(0, 0, None)
    n = len(report.tensors)
    converted = sum(p.converted for p in report.tensors)
    fell = f"; {report.n_fallback} fell back to a smaller block" if report.n_fallback else ""
    mb = 1e6  # MB: 10^6 bytes, as everywhere in gguflm
    print(f"wrote {report.path}: {report.file_type.name} (general.file_type "
          f"{report.ftype}), {n} tensors ({converted} converted, {n - converted} kept{fell}), "
          f"{report.bytes_in / mb:.1f} MB -> {report.bytes_out / mb:.1f} MB in "
          f"{report.seconds:.1f} s", file=sys.stderr)
    return 0


def _words(args: argparse.Namespace) -> tuple[str, str | None, str]:
    """IN, OUT (None: the default name) and TYPE from llama-quantize's positional words
    ``IN [OUT] TYPE [NTHREADS]`` (IN may come as -m); NTHREADS sets -t."""
    words = list(args.words)
    if args.input_flag is not None:
        words.insert(0, args.input_flag)
    if len(words) >= 3 and words[-1].isdigit():
        n = int(words.pop())
        if n < 1:
            raise UsageError(f"NTHREADS must be at least 1, got {n}")
        args.threads = args.threads or n
    if len(words) == 2:
        return words[0], None, words[1]
    if len(words) == 3:
        return words[0], words[1], words[2]
    raise UsageError("give IN [OUT] TYPE [NTHREADS] (IN also as -m IN), e.g. "
                     "gguflm quantize model-f16.gguf model-q4_k_m.gguf Q4_K_M")


def _ggml_type(name: str | None) -> Any:
    from ..gguf.types import GGMLType

    if name is None:
        return None
    try:
        return GGMLType.from_name(name)
    except ValueError:
        raise CLIError(f"unknown ggml type {name!r}") from None
