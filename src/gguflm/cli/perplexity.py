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
from .common import add_model_argument, add_threads_argument, load_model, positive_int, read_text


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "perplexity", help="perplexity of a text file, computed as llama.cpp does",
        description="Perplexity of a text, as llama.cpp's llama-perplexity computes it: the "
                    "tokens are cut into chunks of N_CTX, each evaluated from an empty cache, "
                    "and the second half of each chunk is scored.")
    add_model_argument(p, optional=True)
    add_threads_argument(p)
    p.add_argument("-f", "--file", required=True, type=Path, help="the text file to score")
    p.add_argument("-c", "--ctx-size", type=positive_int, default=128, metavar="N_CTX",
                   help="tokens per chunk (default 128)")
    p.add_argument("--chunks", type=positive_int, default=None, metavar="N",
                   help="score only the first N chunks")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = read_text(args.file)
    if args.ctx_size < 4:
        raise CLIError(f"-c/--ctx-size must be at least 4, got {args.ctx_size}")

    from ..engine.perplexity import perplexity

    loaded = load_model(args.model, args.threads)
    model, tok = loaded.model, loaded.tokenizer
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
    print(f"load {loaded.seconds:.2f} s, evaluated {n_eval} tokens in {t1 - t0:.2f} s "
          f"({n_eval / (t1 - t0):.1f} tokens/s)", file=sys.stderr)
    print(f"PPL = {res.ppl:.4f} +/- {res.ppl_error:.5f}")
    return 0
