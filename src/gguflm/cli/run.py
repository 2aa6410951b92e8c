"""``gguflm run [MODEL] -p PROMPT``: generate text, streamed to stdout as it is sampled."""

from __future__ import annotations

import argparse
import json
import sys

from . import CLIError
from .common import add_model_argument, add_threads_argument, load_model, read_text

DEFAULT_N_PREDICT = 128
# Default context without -c: llama.cpp's default size (as gguflm.LLM and serve use),
# capped by the model's training context and grown when the prompt and N need more.
DEFAULT_N_CTX = 4096


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..hub import DEFAULT_MODEL

    p = subparsers.add_parser(
        "run", help="generate text from a prompt",
        description="Generate text after PROMPT with MODEL (a GGUF file or a known model "
                    f"name, default {DEFAULT_MODEL}), streaming it to stdout. Sampling "
                    "follows llama.cpp: its defaults, its order (penalties, top-k, top-p, "
                    "min-p, temperature) and, for a given --seed, its random numbers.")
    add_model_argument(p, optional=True)
    add_threads_argument(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE ('-': stdin)")
    p.add_argument("-n", "--n-predict", type=int, default=DEFAULT_N_PREDICT, metavar="N",
                   help=f"tokens to generate at most; -1: until the end of generation or "
                        f"of the context (default: {DEFAULT_N_PREDICT})")
    p.add_argument("-c", "--ctx-size", type=int, metavar="N_CTX",
                   help=f"context size in tokens (default: {DEFAULT_N_CTX}, llama.cpp's, or "
                        "the model's training context if smaller; more if the prompt and N "
                        "need it)")
    s = p.add_argument_group("sampling (defaults: llama.cpp's)")
    s.add_argument("--temp", type=float, help="temperature; 0 or less: greedy (default 0.8)")
    s.add_argument("--top-k", type=int, help="keep the K most likely tokens; 0: off (40)")
    s.add_argument("--top-p", type=float, help="nucleus: keep probability mass P; 1: off (0.95)")
    s.add_argument("--min-p", type=float,
                   help="keep tokens at least P times as likely as the best; 0: off (0.05)")
    s.add_argument("--typical-p", type=float, help="locally typical sampling; 1: off (1.0)")
    s.add_argument("--repeat-penalty", type=float, help="penalize repeated tokens; 1: off (1.0)")
    s.add_argument("--repeat-last-n", type=int,
                   help="tokens of history the penalties consider; 0: off, -1: all (64)")
    s.add_argument("--presence-penalty", type=float, help="(0.0)")
    s.add_argument("--frequency-penalty", type=float, help="(0.0)")
    s.add_argument("--seed", type=int, default=-1,
                   help="random seed, 0..4294967295; -1: a random one (default)")
    p.add_argument("--special", action="store_true",
                   help="parse special tokens (e.g. <|im_start|>) in the prompt")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (tokens, text, stop reason, timings) at the end "
                        "instead of streaming text")
    p.set_defaults(func=run)


_SAMPLING_FLAGS = {  # argparse dest -> SamplerParams field
    "temp": "temp", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "typical_p": "typical_p", "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def _sampler_params(args: argparse.Namespace):
    from ..engine.sampling import SamplerParams, SamplingError

    given = {field: getattr(args, dest) for dest, field in _SAMPLING_FLAGS.items()
             if getattr(args, dest) is not None}
    if args.seed != -1:
        given["seed"] = args.seed
    try:
        return SamplerParams(**given)
    except SamplingError as e:
        raise CLIError(f"invalid sampling option: {e}".replace("_", "-")) from None


def _context_size(args: argparse.Namespace, n_prompt: int, n_ctx_train: int) -> int:
    if args.ctx_size is not None:
        n_ctx = args.ctx_size
    else:
        n_ctx = min(DEFAULT_N_CTX, n_ctx_train) if n_ctx_train > 0 else DEFAULT_N_CTX
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
    if args.n_predict < -1:
        raise CLIError(f"-n must be -1 (unlimited) or at least 0, got {args.n_predict}")
    if args.ctx_size is not None and args.ctx_size < 1:
        raise CLIError(f"-c must be at least 1, got {args.ctx_size}")
    params = _sampler_params(args)
    text = args.prompt if args.prompt is not None else read_text(args.file)

    from ..engine.generate import generate, stream_text
    from ..engine.sampling import Sampler

    path, model, tokenizer, load_seconds = load_model(args.model, args.threads)

    prompt = tokenizer.encode(text, add_special=True, parse_special=args.special)
    if not prompt:
        raise CLIError("the prompt is empty (and the model adds no BOS token)")
    n_ctx = _context_size(args, len(prompt), int(model.config.n_ctx_train or 0))
    sampler = Sampler(params)
    gen = generate(model, prompt, sampler, max_tokens=args.n_predict, n_ctx=n_ctx,
                   eog_ids=tokenizer.eog_ids)
    pieces = stream_text(gen, tokenizer.decoder(special=False))

    if args.json:
        out = "".join(pieces)
        timings = gen.timings.as_dict() | {"load_seconds": round(load_seconds, 6)}
        print(json.dumps({
            "model": str(path), "prompt_tokens": prompt, "generated_tokens": gen.tokens,
            "text": out, "stop": gen.stop, "seed": sampler.seed, "n_ctx": n_ctx,
            "timings": timings,
        }, ensure_ascii=False))
        return 0

    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    t = gen.timings
    print(f"[{t.generated_tokens} tokens, stop: {gen.stop}; prompt {t.prompt_tokens} tokens "
          f"at {t.prompt_tokens_per_second:.1f} tok/s, generation "
          f"{t.generation_tokens_per_second:.1f} tok/s; seed {sampler.seed}]", file=sys.stderr)
    return 0
