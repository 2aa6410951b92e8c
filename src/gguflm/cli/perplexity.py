"""``gguflm perplexity [MODEL] -f FILE [-c N_CTX]``: llama.cpp's perplexity of a text.

On a terminal, stderr shows the chunks done, the running perplexity and an ETA while it
works; at the end the running values as llama.cpp prints them (``[1]13.4288,[2]18.9891,...``)
go to stderr and the result to stdout: ``PPL = X +/- E`` (``--json``: one object instead,
and nothing on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import CLIError, UsageError
from .common import (
    Progress,
    add_kv_cache_options,
    add_load_options,
    add_model_argument,
    add_status_options,
    add_threads_argument,
    kv_cache_type,
    load_model,
    load_options,
    non_negative_int,
    positive_int,
    read_text,
    use_kv_cache_type,
    warm_up,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "perplexity", help="perplexity of a text file, computed as llama.cpp does",
        description="Perplexity of a text, as llama.cpp's llama-perplexity computes it: the "
                    "tokens are cut into chunks of N_CTX, each evaluated from an empty cache, "
                    "and the second half of each chunk is scored.")
    add_model_argument(p, optional=True)
    add_threads_argument(p)
    p.add_argument("-f", "--file", required=True, type=Path, help="the text file to score")
    p.add_argument("-c", "--ctx-size", type=non_negative_int, default=128, metavar="N_CTX",
                   help="tokens per chunk; 0: the model's training context (default 128)")
    p.add_argument("--chunks", type=positive_int, default=None, metavar="N",
                   help="score only the first N chunks")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: model, ppl, ppl_error, n_ctx, n_chunks, "
                        "n_tokens, n_scored, running (the estimate after each chunk), timings")
    add_kv_cache_options(p)
    add_status_options(p, perf=False)
    add_load_options(p)
    p.set_defaults(func=run, owns_cores=True)  # one user's command: spinning workers


def run(args: argparse.Namespace) -> int:
    text = read_text(args.file)
    if 0 < args.ctx_size < 4:
        raise UsageError(f"-c/--ctx-size must be at least 4 (or 0), got {args.ctx_size}")
    kv = kv_cache_type(args)

    from ..engine.perplexity import perplexity

    loaded = load_model(args.model, args.threads, load_options(args))
    model, tok = loaded.model, loaded.tokenizer
    use_kv_cache_type(model, kv)
    if args.ctx_size == 0:  # llama.cpp's -c 0: the model's own context
        args.ctx_size = int(model.config.n_ctx_train or 0) or 4096
    tokens = tok.encode(text, add_special=True)
    bos = tok.bos_id if tok.add_bos else None
    n_chunks = len(tokens) // args.ctx_size
    if args.chunks is not None:
        n_chunks = min(args.chunks, n_chunks)
    if not args.json:
        print(f"perplexity: {len(tokens)} tokens, n_ctx {args.ctx_size}, {n_chunks} chunks",
              file=sys.stderr)
    warmup = warm_up(model, join=False) if args.warmup else 0.0  # it measures
    progress = Progress("perplexity", n_chunks, "chunks", enabled=not args.json)

    def step(i: int, n: int, ppl: float) -> None:
        progress.update(i, f", PPL {ppl:.4f}")

    t0 = time.perf_counter()
    try:
        res = perplexity(model, tokens, args.ctx_size, bos_id=bos, n_chunks=args.chunks,
                         progress=step)
    except ValueError as e:
        raise CLIError(str(e)) from None
    finally:
        progress.close()
    t1 = time.perf_counter()
    n_eval = res.n_chunks * res.n_ctx
    if args.json:
        print(json.dumps({
            "model": str(loaded.path), "ppl": res.ppl, "ppl_error": res.ppl_error,
            "n_ctx": res.n_ctx, "n_chunks": res.n_chunks, "n_tokens": len(tokens),
            "n_scored": res.n_scored, "running": res.running,
            "timings": {"load_seconds": round(loaded.seconds, 6),
                        "warmup_seconds": round(warmup, 6), "seconds": round(t1 - t0, 6),
                        "tokens_per_second": round(n_eval / (t1 - t0), 3)}}))
        return 0
    print(",".join(f"[{i}]{p:.4f}" for i, p in enumerate(res.running, 1)) + ",",
          file=sys.stderr)
    print(f"load {loaded.seconds:.2f} s, warm-up {warmup:.2f} s, evaluated {n_eval} tokens in "
          f"{t1 - t0:.2f} s ({n_eval / (t1 - t0):.1f} tokens/s)", file=sys.stderr)
    print(f"PPL = {res.ppl:.4f} +/- {res.ppl_error:.5f}")
    return 0
