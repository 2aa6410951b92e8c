"""``gguflm run [MODEL] -p PROMPT``: generate text, streamed to stdout as it is sampled.

The options are llama.cpp's (``llama-cli``/``llama-completion``) where they mean the same:
``-m``, ``-p``, ``-f``, ``-e``, ``-n``, ``-c``, ``-s``, ``-r``/``--stop``, ``--display-prompt``,
``--verbose-prompt``, ``--color``, ``-i``/``-cnv`` (hand over to ``gguflm chat``); its GPU
options are accepted and ignored.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import CLIError, UsageError
from .common import (
    Progress,
    add_constraint_options,
    add_ignored_options,
    add_load_options,
    add_lookup_option,
    add_model_argument,
    add_threads_argument,
    constraint_spec,
    load_model,
    load_options,
    make_constraint,
    positive_int,
    process_escapes,
    read_text,
    warm_up,
)

DEFAULT_N_PREDICT = 128
PROGRESS_TOKENS = 512   # prompts longer than this show their evaluation's progress
YELLOW, RESET = "\033[33m", "\033[0m"


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..engine.params import add_cli_options
    from ..hub import DEFAULT_MODEL

    p = subparsers.add_parser(
        "run", help="generate text from a prompt",
        description="Generate text after PROMPT with MODEL (a GGUF file or a known model "
                    f"name, default {DEFAULT_MODEL}), streaming it to stdout. Sampling "
                    "follows llama.cpp: its defaults, its order (penalties, top-k, typical-p, "
                    "top-p, min-p, temperature) and, for a given --seed, its random numbers. "
                    "Options are spelled as llama.cpp's.")
    add_model_argument(p, optional=True)
    add_threads_argument(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE ('-': stdin)")
    p.add_argument("-e", "--escape", action="store_true",
                   help="process escapes in the prompt: \\n \\r \\t \\' \\\" \\\\ \\xHH")
    p.add_argument("-n", "--n-predict", type=int, default=None, metavar="N",
                   help=f"tokens to generate at most; -1: until the end of generation or "
                        f"of the context (default: {DEFAULT_N_PREDICT})")
    p.add_argument("-c", "--ctx-size", type=positive_int, metavar="N_CTX",
                   help="context size in tokens (default: 4096, llama.cpp's, or the model's "
                        "training context if smaller; more if the prompt and N need it)")
    add_cli_options(p)
    add_constraint_options(p)
    add_lookup_option(p)
    p.add_argument("--special", action="store_true",
                   help="parse special tokens (e.g. <|im_start|>) in the prompt")
    show = p.add_mutually_exclusive_group()
    show.add_argument("--display-prompt", dest="display_prompt", action="store_true",
                      default=False, help="print the prompt before the generated text")
    show.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                      help="print only the generated text (the default)")
    p.add_argument("--verbose-prompt", action="store_true",
                   help="print the prompt's tokens (id and text) to stderr first")
    p.add_argument("--color", action="store_true",
                   help="colour the displayed prompt (and, with -i, the chat's input)")
    chat = p.add_mutually_exclusive_group()
    chat.add_argument("-i", "--interactive", action="store_true",
                      help="chat instead (gguflm chat), with -p as the system message")
    chat.add_argument("-cnv", "--conversation", action="store_true",
                      help="the same as -i (llama.cpp's conversation mode)")
    p.add_argument("--chat-template", metavar="FILE",
                   help="with -i: the chat template to use instead of the model's")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (tokens, text, stop reason, timings) at the end "
                        "instead of streaming text")
    add_load_options(p)
    add_ignored_options(p)
    p.set_defaults(func=run, owns_cores=True)  # one user's command: spinning workers


def _context_size(args: argparse.Namespace, n_prompt: int, n_predict: int,
                  n_ctx_train: int) -> tuple[int, bool]:
    """The context size, and whether the default was grown to fit the prompt and -n."""
    from ..engine.scheduler import default_n_ctx

    grown = False
    if args.ctx_size is not None:
        n_ctx = args.ctx_size
    else:
        n_ctx = default = default_n_ctx(n_ctx_train)
        if n_predict >= 0:
            # the last generated token is never evaluated, so it needs no cache slot
            needed = n_prompt + max(n_predict - 1, 0)
            n_ctx = max(n_ctx, min(needed, n_ctx_train) if n_ctx_train > 0 else needed)
            grown = n_ctx > default
    if n_prompt > n_ctx:
        flag = f"-c {n_ctx}" if args.ctx_size is not None else "the model's training context"
        raise CLIError(f"the prompt is {n_prompt} tokens, longer than the context of "
                       f"{n_ctx} ({flag})")
    return n_ctx, grown


def stop_description(stopped_by: str | None, n_predict: int, n_ctx: int) -> str:
    """Which limit ended the generation, in words (``stop: ...`` on stderr)."""
    return {"eos": "eos (the model ended it)", "stop_string": "stop string",
            "max_tokens": f"length (-n {n_predict})",
            "context": f"context full (n_ctx {n_ctx})"}.get(stopped_by or "", str(stopped_by))


def run(args: argparse.Namespace) -> int:
    from ..engine.params import cli_sampler_params, cli_stops
    from ..engine.sampling import SamplingError
    from ..engine.stops import StopError, check_stops

    if args.interactive or args.conversation:
        return _to_chat(args)
    if args.prompt is None and args.file is None:
        raise UsageError("one of -p PROMPT or -f FILE is required (or -i / -cnv to chat)")
    n_predict = DEFAULT_N_PREDICT if args.n_predict is None else args.n_predict
    if n_predict < -1:
        raise UsageError(f"-n must be -1 (unlimited) or at least 0, got {n_predict}")
    try:
        params = cli_sampler_params(args)
    except SamplingError as e:
        raise UsageError(f"invalid sampling option: {e}".replace("_", "-")) from None
    try:
        stops = check_stops(cli_stops(args))
    except StopError as e:
        raise UsageError(f"--stop: {e}") from None
    spec = constraint_spec(args)
    text = args.prompt if args.prompt is not None else read_text(args.file)
    if args.escape:
        text = process_escapes(text)

    from ..engine.scheduler import N_BATCH, Engine
    from ..engine.sequence import PREFILL, WAITING, Request
    from ..model.kv_cache import ArenaTooLargeError

    path, model, tokenizer, load_seconds = load_model(args.model, args.threads,
                                                      load_options(args))
    prompt = tokenizer.encode(text, add_special=True, parse_special=args.special)
    if not prompt:
        raise CLIError("the prompt is empty (and the model adds no BOS token)")
    if args.verbose_prompt:
        _print_prompt_tokens(text, prompt, tokenizer)
    n_ctx, grown = _context_size(args, len(prompt), n_predict, int(model.config.n_ctx_train or 0))
    if grown:
        print(f"note: context grown from the default to {n_ctx} tokens to fit the prompt "
              f"({len(prompt)}) and -n {n_predict}", file=sys.stderr)
    warmup_seconds = warm_up(model)  # not part of the prompt's timing
    progress = Progress("prompt", len(prompt), "tokens",
                        enabled=len(prompt) > PROGRESS_TOKENS and not args.json)
    # smaller steps when the progress is shown, so that it moves (the logits are the same)
    try:
        engine = Engine(model, tokenizer, n_ctx=n_ctx, n_slots=1, threads=args.threads,
                        n_batch=128 if progress.enabled else N_BATCH)
    except ArenaTooLargeError as e:  # checked before anything is allocated
        raise CLIError(f"-c {n_ctx}: {e}") from None
    try:
        seq = engine.submit(Request(prompt, params, n_predict, stops,
                                    make_constraint(spec, tokenizer), args.lookup))
        if args.display_prompt and not args.json:
            shown = tokenizer.decode(prompt, special=args.special)
            sys.stdout.write(f"{YELLOW}{shown}{RESET}" if args.color else shown)
            sys.stdout.flush()
        if progress.enabled:
            while not seq.done and seq.state in (WAITING, PREFILL):
                progress.update(seq.n_prompt_done)
                time.sleep(0.1)
            progress.close()
        if args.json:
            out = "".join(piece.text for piece in seq)
        else:
            for piece in seq:
                sys.stdout.write(piece.text)
                sys.stdout.flush()
            sys.stdout.write("\n")
            sys.stdout.flush()
    finally:
        engine.close()
    if seq.finish_reason == "error":
        raise CLIError(f"generation failed: {seq.error}")
    t = seq.timings_dict()
    if args.json:
        timings = {k: t[k] for k in ("prompt_tokens", "prompt_seconds",
                                     "prompt_tokens_per_second", "generated_tokens",
                                     "generation_seconds", "generation_tokens_per_second")}
        stop = {"eos": "eos", "stop_string": "stop"}.get(seq.stopped_by or "", "length")
        print(json.dumps({
            "model": str(path), "prompt_tokens": prompt, "generated_tokens": seq.tokens,
            "text": out, "stop": stop, "stopped_by": seq.stopped_by, "seed": seq.seed,
            "n_ctx": n_ctx,
            "timings": timings | {"load_seconds": round(load_seconds, 6),
                                  "warmup_seconds": round(warmup_seconds, 6)},
        }, ensure_ascii=False))
        return 0
    print(f"[{t['generated_tokens']} tokens, stop: "
          f"{stop_description(seq.stopped_by, n_predict, n_ctx)}; prompt {t['prompt_tokens']} "
          f"tokens at {t['prompt_tokens_per_second']:.1f} tok/s, generation "
          f"{t['generation_tokens_per_second']:.1f} tok/s; load {load_seconds:.2f} s, "
          f"warm-up {warmup_seconds:.2f} s; seed {seq.seed}{_lookup_note(t)}]", file=sys.stderr)
    return 0


def _lookup_note(t: dict[str, float]) -> str:
    if "draft_n" not in t:
        return ""
    return f"; lookup: {t['draft_n_accepted']} of {t['draft_n']} drafted tokens kept"


def _print_prompt_tokens(text: str, ids: list[int], tokenizer) -> None:  # noqa: ANN001
    """llama.cpp's --verbose-prompt: the prompt, its token count, then each id and text."""
    lines = [f"prompt: {text!r}", f"number of tokens in prompt = {len(ids)}"]
    for tid in ids:
        piece = tokenizer.token_to_piece(tid, special=True).decode("utf-8", "replace")
        lines.append(f"{tid:6d} -> {piece!r}")
    print("\n".join(lines), file=sys.stderr, flush=True)


def _to_chat(args: argparse.Namespace) -> int:
    """``-i`` / ``-cnv``: the same model and options in ``gguflm chat``; the prompt (-p or
    -f), if any, becomes the system message, as in llama.cpp's conversation mode."""
    from . import chat

    ns = chat.default_args()
    for name, value in vars(args).items():
        if name.startswith("sampling_") or name in (
                "model", "threads", "ctx_size", "chat_template", "stop", "override_kv",
                "no_bos", "rope_style", "color", "lookup"):
            setattr(ns, name, value)
    if args.n_predict is not None:
        ns.n_predict = args.n_predict
    if args.prompt is not None or args.file is not None:
        text = args.prompt if args.prompt is not None else read_text(args.file)
        ns.system = process_escapes(text) if args.escape else text
    return chat.chat(ns)
