"""``gguflm run [MODEL] -p PROMPT``: generate text, streamed to stdout as it is sampled."""

from __future__ import annotations

import argparse
import json
import sys

from . import CLIError
from .common import add_model_argument, add_threads_argument, load_model, read_text

DEFAULT_N_PREDICT = 128


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..engine.params import add_cli_options
    from ..hub import DEFAULT_MODEL

    p = subparsers.add_parser(
        "run", help="generate text from a prompt",
        description="Generate text after PROMPT with MODEL (a GGUF file or a known model "
                    f"name, default {DEFAULT_MODEL}), streaming it to stdout. Sampling "
                    "follows llama.cpp: its defaults, its order (penalties, top-k, typical-p, "
                    "top-p, min-p, temperature) and, for a given --seed, its random numbers.")
    add_model_argument(p, optional=True)
    add_threads_argument(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE ('-': stdin)")
    p.add_argument("-n", "--n-predict", type=int, default=DEFAULT_N_PREDICT, metavar="N",
                   help=f"tokens to generate at most; -1: until the end of generation or "
                        f"of the context (default: {DEFAULT_N_PREDICT})")
    p.add_argument("-c", "--ctx-size", type=int, metavar="N_CTX",
                   help="context size in tokens (default: 4096, llama.cpp's, or the model's "
                        "training context if smaller; more if the prompt and N need it)")
    add_cli_options(p)
    p.add_argument("--special", action="store_true",
                   help="parse special tokens (e.g. <|im_start|>) in the prompt")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (tokens, text, stop reason, timings) at the end "
                        "instead of streaming text")
    p.set_defaults(func=run)


def _context_size(args: argparse.Namespace, n_prompt: int, n_ctx_train: int) -> int:
    from ..engine.scheduler import default_n_ctx

    if args.ctx_size is not None:
        n_ctx = args.ctx_size
    else:
        n_ctx = default_n_ctx(n_ctx_train)
        if args.n_predict >= 0:
            # the last generated token is never evaluated, so it needs no cache slot
            needed = n_prompt + max(args.n_predict - 1, 0)
            n_ctx = max(n_ctx, min(needed, n_ctx_train) if n_ctx_train > 0 else needed)
    if n_prompt > n_ctx:
        flag = "-c" if args.ctx_size is not None else "the model's training context"
        raise CLIError(f"the prompt is {n_prompt} tokens, longer than the context of "
                       f"{n_ctx} ({flag})")
    return n_ctx


def run(args: argparse.Namespace) -> int:
    from ..engine.params import cli_sampler_params
    from ..engine.sampling import SamplingError

    if args.n_predict < -1:
        raise CLIError(f"-n must be -1 (unlimited) or at least 0, got {args.n_predict}")
    if args.ctx_size is not None and args.ctx_size < 1:
        raise CLIError(f"-c must be at least 1, got {args.ctx_size}")
    try:
        params = cli_sampler_params(args)
    except SamplingError as e:
        raise CLIError(f"invalid sampling option: {e}".replace("_", "-")) from None
    text = args.prompt if args.prompt is not None else read_text(args.file)

    from ..engine.scheduler import Engine
    from ..engine.sequence import Request

    path, model, tokenizer, load_seconds = load_model(args.model, args.threads)
    prompt = tokenizer.encode(text, add_special=True, parse_special=args.special)
    if not prompt:
        raise CLIError("the prompt is empty (and the model adds no BOS token)")
    n_ctx = _context_size(args, len(prompt), int(model.config.n_ctx_train or 0))
    engine = Engine(model, tokenizer, n_ctx=n_ctx, n_slots=1, threads=args.threads)
    seq = engine.submit(Request(prompt, params, args.n_predict))

    if args.json:
        out = "".join(piece.text for piece in seq)
        t = seq.timings_dict()
        timings = {k: t[k] for k in ("prompt_tokens", "prompt_seconds",
                                     "prompt_tokens_per_second", "generated_tokens",
                                     "generation_seconds", "generation_tokens_per_second")}
        stop = "eos" if seq.stopped_by == "eos" else "length"
        print(json.dumps({
            "model": str(path), "prompt_tokens": prompt, "generated_tokens": seq.tokens,
            "text": out, "stop": stop, "seed": seq.seed, "n_ctx": n_ctx,
            "timings": timings | {"load_seconds": round(load_seconds, 6)},
        }, ensure_ascii=False))
        return 0

    for piece in seq:
        sys.stdout.write(piece.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    stop = "eos" if seq.stopped_by == "eos" else "length"
    t = seq.timings_dict()
    print(f"[{t['generated_tokens']} tokens, stop: {stop}; prompt {t['prompt_tokens']} tokens "
          f"at {t['prompt_tokens_per_second']:.1f} tok/s, generation "
          f"{t['generation_tokens_per_second']:.1f} tok/s; seed {seq.seed}]", file=sys.stderr)
    return 0
