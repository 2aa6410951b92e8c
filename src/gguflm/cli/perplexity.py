"""``gguflm perplexity [MODEL] -f FILE [-c N_CTX]``: llama.cpp's perplexity of a text.

Running perplexity after each chunk goes to stderr as llama.cpp prints it
(``[1]13.4288,[2]18.9891,...``); the result is one line on stdout: ``PPL = X +/- E``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import CLIError


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "perplexity", help="perplexity of a text file, computed as llama.cpp does",
        description="Perplexity of a text, as llama.cpp's llama-perplexity computes it: the "
                    "tokens are cut into chunks of N_CTX, each evaluated from an empty cache, "
                    "and the second half of each chunk is scored.")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="a GGUF file or a known model name (default: the default model)")
    p.add_argument("-f", "--file", required=True, type=Path, help="the text file to score")
    p.add_argument("-c", "--ctx-size", type=_positive, default=128, metavar="N_CTX",
                   help="tokens per chunk (default 128)")
    p.add_argument("--chunks", type=_positive, default=None, metavar="N",
                   help="score only the first N chunks")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        text = args.file.read_text(encoding="utf-8")
    except OSError as e:
        raise CLIError(f"cannot read {args.file}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise CLIError(f"{args.file} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if args.ctx_size < 4:
        raise CLIError(f"-c/--ctx-size must be at least 4, got {args.ctx_size}")

    from .. import hub, load_model
    from ..engine.perplexity import perplexity
    from ..tokenizer import Tokenizer
    from .pull import resolve

    path = resolve(args.model or hub.DEFAULT_MODEL)
    start = time.perf_counter()
    model = load_model(path)
    tok = Tokenizer.from_gguf(model.gguf)
    tokens = tok.encode(text, add_special=True)
    bos = tok.bos_id if tok.add_bos else None
    n_chunks = len(tokens) // args.ctx_size if args.chunks is None else args.chunks
    print(f"perplexity: {len(tokens)} tokens, n_ctx {args.ctx_size}, "
          f"{min(n_chunks, len(tokens) // args.ctx_size)} chunks", file=sys.stderr)

    def progress(i: int, n: int, ppl: float) -> None:
        print(f"[{i}]{ppl:.4f},", end="\n" if i == n else "", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        res = perplexity(model, tokens, args.ctx_size, bos_id=bos, n_chunks=args.chunks,
                         progress=progress)
    except ValueError as e:
        raise CLIError(str(e)) from None
    t1 = time.perf_counter()
    n_eval = res.n_chunks * res.n_ctx
    print(f"load {t0 - start:.2f} s, evaluated {n_eval} tokens in {t1 - t0:.2f} s "
          f"({n_eval / (t1 - t0):.1f} tokens/s)", file=sys.stderr)
    print(f"PPL = {res.ppl:.4f} +/- {res.ppl_error:.5f}")
    return 0
