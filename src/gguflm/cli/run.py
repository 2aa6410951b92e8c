"""``gguflm run [MODEL] -p PROMPT``: generate text, streamed to stdout as it is sampled.

The options are llama.cpp's (``llama-completion``/``llama-cli``) where they mean the same:
``-m``, ``-p``, ``-f``, ``-e``, ``-n``, ``-c`` (0: the model's context), ``-b``/``-ub``,
``-s``, ``-r``/``--stop``, ``-sys``/``-st`` (one chat turn through the model's template),
``--display-prompt``, ``--verbose-prompt``, ``--color``, ``-i``/``-cnv`` (hand over to
``gguflm chat``), ``-ctk``/``-ctv``; the rest of llama.cpp's are accepted with a note
(llama_options.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import NamedTuple

from . import CLIError, UsageError
from .common import (
    Progress,
    add_batch_options,
    add_color_option,
    add_constraint_options,
    add_kv_cache_options,
    add_load_options,
    add_lookup_option,
    add_model_argument,
    add_status_options,
    add_threads_argument,
    batch_size,
    color_on,
    constraint_spec,
    kv_cache_type,
    load_model,
    load_options,
    make_constraint,
    non_negative_int,
    process_escapes,
    read_text,
    use_kv_cache_type,
    warm_up,
)
from .serve import check_chat_template

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
    esc = p.add_mutually_exclusive_group()
    esc.add_argument("-e", "--escape", action="store_true",
                     help="process escapes in the prompt: \\n \\r \\t \\' \\\" \\\\ \\xHH")
    esc.add_argument("--no-escape", dest="escape", action="store_false",
                     help="take the prompt as it is (the default)")
    p.add_argument("-n", "--n-predict", "--predict", type=int, default=None, metavar="N",
                   help=f"tokens to generate at most; -1 (or -2, llama.cpp's 'until the "
                        f"context is filled'): until the end of generation or of the context "
                        f"(default: {DEFAULT_N_PREDICT})")
    p.add_argument("-c", "--ctx-size", type=non_negative_int, metavar="N_CTX",
                   help="context size in tokens; 0: the model's training context (default: "
                        "4096, llama.cpp's, or the model's training context if smaller; more "
                        "if the prompt and N need it)")
    add_batch_options(p)
    p.add_argument("--ignore-eos", action="store_true",
                   help="never end at an end-of-generation token (they are not sampled): "
                        "generate until -n or the context is full")
    shift = p.add_mutually_exclusive_group()
    shift.add_argument("--context-shift", action="store_true",
                       help="when the context is full, keep --keep tokens of the prompt, drop "
                            "half of the rest and go on (llama.cpp's; the kept text is "
                            "evaluated again, and each shift goes on with the next seed)")
    shift.add_argument("--no-context-shift", dest="context_shift", action="store_false",
                       help="stop when the context is full (the default, as llama.cpp's)")
    p.add_argument("--keep", type=int, default=0, metavar="N",
                   help="tokens of the prompt a context shift keeps (BOS besides); -1: all "
                        "(default: 0)")
    turn = p.add_argument_group("one chat turn (the prompt as the user's message, through "
                                "the model's chat template)")
    sysp = turn.add_mutually_exclusive_group()
    sysp.add_argument("-sys", "--system-prompt", dest="system", metavar="TEXT",
                      help="the system message (implies -st unless -i/-cnv)")
    sysp.add_argument("-sysf", "--system-prompt-file", dest="system_file", metavar="FILE",
                      help="read the system message from FILE")
    turn.add_argument("-st", "--single-turn", action="store_true",
                      help="answer the prompt as one chat turn, then stop")
    turn.add_argument("--jinja", action="store_true",
                      help="accepted: gguflm always renders chat templates with Jinja")
    add_cli_options(p)
    add_constraint_options(p)
    add_lookup_option(p)
    p.add_argument("-sp", "--special", action="store_true",
                   help="parse special tokens (e.g. <|im_start|>) in the prompt")
    show = p.add_mutually_exclusive_group()
    show.add_argument("--display-prompt", dest="display_prompt", action="store_true",
                      default=False, help="print the prompt before the generated text")
    show.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                      help="print only the generated text (the default)")
    p.add_argument("-v", "--verbose", "--log-verbose", action="store_true",
                   help="say on stderr how the model runs: the path its layers take and why")
    p.add_argument("--verbose-prompt", action="store_true",
                   help="print the prompt's tokens (id and text) to stderr first")
    add_color_option(p, "colour the displayed prompt (and, with -i, the chat's input)")
    chat = p.add_mutually_exclusive_group()
    chat.add_argument("-i", "--interactive", action="store_true",
                      help="chat instead (gguflm chat), with -p as the system message")
    chat.add_argument("-cnv", "--conversation", action="store_true", default=None,
                      help="the same as -i (llama.cpp's conversation mode; also what run "
                           "does without -p or -f)")
    chat.add_argument("-no-cnv", "--no-conversation", dest="conversation",
                      action="store_false", help="complete the prompt (the default with -p "
                                                 "or -f)")
    p.add_argument("--chat-template", "--chat-template-file", metavar="FILE",
                   help="with -i or -st: the chat template to use instead of the model's")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (tokens, text, stop reason, timings) at the end "
                        "instead of streaming text")
    add_kv_cache_options(p)
    add_status_options(p)
    add_load_options(p)
    p.set_defaults(func=run, owns_cores=True)  # one user's command: spinning workers


def _context_size(args: argparse.Namespace, n_prompt: int, n_predict: int,
                  n_ctx_train: int) -> tuple[int, bool]:
    """The context size, and whether the default was grown to fit the prompt and -n."""
    from ..engine.scheduler import default_n_ctx

    grown = False
    if args.ctx_size == 0:  # llama.cpp's -c 0: the model's own
        n_ctx = n_ctx_train or default_n_ctx(0)
    elif args.ctx_size is not None:
        n_ctx = args.ctx_size
    else:
        n_ctx = default = default_n_ctx(n_ctx_train)
        if n_predict >= 0:
            # the last generated token is never evaluated, so it needs no cache slot
            needed = n_prompt + max(n_predict - 1, 0)
            n_ctx = max(n_ctx, min(needed, n_ctx_train) if n_ctx_train > 0 else needed)
            grown = n_ctx > default
    if n_prompt > n_ctx:
        flag = f"-c {n_ctx}" if args.ctx_size else "the model's training context"
        raise CLIError(f"the prompt is {n_prompt} tokens, longer than the context of "
                       f"{n_ctx} ({flag})")
    return n_ctx, grown


def stop_description(stopped_by: str | None, n_predict: int, n_ctx: int) -> str:
    """Which limit ended the generation, in words (``stop: ...`` on stderr)."""
    return {"eos": "eos (the model ended it)", "stop_string": "stop string",
            "max_tokens": f"length (-n {n_predict})", "cancelled": "interrupted (Ctrl-C)",
            "context": f"context full (n_ctx {n_ctx})"}.get(stopped_by or "", str(stopped_by))


class Checked(NamedTuple):
    """What ``run`` takes from its options, checked before the model loads."""

    n_predict: int
    params: object      # engine.sampling.SamplerParams
    stops: list[str]
    spec: dict          # constraint_spec's keywords
    text: str           # the prompt (-p, or -f's file)
    system: str | None  # -sys, or -sysf's file


def _checked(args: argparse.Namespace) -> Checked:
    """-n, the sampling parameters, the stops, the constraint, the prompt and system texts
    (their files read) and the chat template file, checked before the model is loaded
    (UsageError / CLIError)."""
    from ..engine.params import cli_sampler_params, cli_stops
    from ..engine.sampling import SamplingError
    from ..engine.stops import StopError, check_stops

    if args.prompt is None and args.file is None:
        raise UsageError("-no-cnv needs a prompt: -p PROMPT or -f FILE")
    n_predict = DEFAULT_N_PREDICT if args.n_predict is None else args.n_predict
    if n_predict == -2:  # llama.cpp's "until the context is filled": -1 here stops there too
        n_predict = -1
    if n_predict < -1:
        raise UsageError(f"-n must be -1 (unlimited), -2 (until the context is full) or at "
                         f"least 0, got {n_predict}")
    try:
        params = cli_sampler_params(args)
    except SamplingError as e:
        raise UsageError(f"invalid sampling option: {e}".replace("_", "-")) from None
    try:
        stops = check_stops(cli_stops(args))
    except StopError as e:
        raise UsageError(f"--stop: {e}") from None
    kv_cache_type(args)
    spec = constraint_spec(args)
    if spec and args.context_shift:
        raise UsageError("--context-shift cannot go with --json-schema, --grammar or --regex "
                         "(a shift would restart the structure)")
    text = args.prompt if args.prompt is not None else read_text(args.file)
    if args.escape:
        text = process_escapes(text)
    check_chat_template(args)
    return Checked(n_predict, params, stops, spec, text, _system_text(args))


def _system_text(args: argparse.Namespace) -> str | None:
    if args.system_file is not None:
        return read_text(args.system_file, option="--system-prompt-file")
    return args.system


def _prompt_ids(args: argparse.Namespace, text: str, system: str | None, model: object,
                tokenizer: object) -> list[int]:
    """The prompt's tokens: as written, or (-sys / -st) one user turn through the chat
    template, with the system message if any."""
    if system is None and not args.single_turn:
        return tokenizer.encode(text, add_special=True, parse_special=args.special)
    from ..tokenizer.chat import ChatTemplate, ChatTemplateError, encode_prompt

    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": text}]
    try:
        template = ChatTemplate.for_tokenizer(tokenizer, model.gguf.metadata,
                                              override=args.chat_template)
        return encode_prompt(tokenizer, template.render(messages, True))
    except ChatTemplateError as e:
        raise CLIError(f"the chat template failed: {e}") from None


def say(args: argparse.Namespace, text: str) -> None:
    """A status line on stderr, unless --log-disable."""
    if not args.log_disable:
        print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.interactive or args.conversation or (
            args.prompt is None and args.file is None and args.conversation is None):
        return _to_chat(args)  # llama-cli without a prompt: a conversation
    n_predict, params, stops, spec, text, system = _checked(args)

    from ..engine.scheduler import Engine
    from ..engine.sequence import Request
    from ..model.kv_cache import ArenaTooLargeError

    path, model, tokenizer, load_seconds = load_model(args.model, args.threads,
                                                      load_options(args))
    use_kv_cache_type(model, kv_cache_type(args))
    prompt = _prompt_ids(args, text, system, model, tokenizer)
    if not prompt:
        raise CLIError("the prompt is empty (and the model adds no BOS token)")
    if args.verbose:
        print(f"layers run: {model.plan.describe()}", file=sys.stderr)
    if args.verbose_prompt:
        _print_prompt_tokens(text, prompt, tokenizer)
    n_ctx, grown = _context_size(args, len(prompt), n_predict, int(model.config.n_ctx_train or 0))
    if grown:
        say(args, f"note: context grown from the default to {n_ctx} tokens to fit the prompt "
                  f"({len(prompt)}) and -n {n_predict}")
    # not in the prompt's timing; a first run's compiled layers compile in the background
    warmup_seconds = warm_up(model, background=_interactive()) if args.warmup else 0.0
    progress = Progress("prompt", len(prompt), "tokens",
                        enabled=len(prompt) > PROGRESS_TOKENS and not args.json
                        and not args.log_disable)
    # smaller steps when the progress is shown, so that it moves (the logits are the same)
    n_batch = min(128, batch_size(args)) if progress.enabled else batch_size(args)
    try:
        engine = Engine(model, tokenizer, n_ctx=n_ctx, n_slots=1, threads=args.threads,
                        n_batch=n_batch)
    except ArenaTooLargeError as e:  # checked before anything is allocated
        raise CLIError(f"-c {n_ctx}: {e}") from None
    try:
        request = Request(prompt, params, n_predict, stops, make_constraint(spec, tokenizer),
                          args.lookup, ignore_eos=args.ignore_eos)
        seq, generated, out, shifts, interrupted = _generate(args, engine, request, tokenizer,
                                                             progress, _n_keep(args, prompt,
                                                                               tokenizer))
        if not args.json:
            sys.stdout.write("\n")  # the line ends, however the text did
            sys.stdout.flush()
    finally:
        engine.close()
    if seq.finish_reason == "error":
        raise CLIError(f"generation failed: {seq.error}")
    stopped_by = "cancelled" if interrupted else seq.stopped_by
    seed = (seq.seed - shifts) % 2 ** 32  # each shift went on with the next seed
    t = seq.timings_dict()
    if args.json:
        if interrupted:
            return 130
        timings = {k: t[k] for k in ("prompt_tokens", "prompt_seconds",
                                     "prompt_tokens_per_second", "generated_tokens",
                                     "generation_seconds", "generation_tokens_per_second")}
        stop = {"eos": "eos", "stop_string": "stop"}.get(seq.stopped_by or "", "length")
        print(json.dumps({
            "model": str(path), "prompt_tokens": prompt, "generated_tokens": generated,
            "text": out, "stop": stop, "stopped_by": seq.stopped_by, "seed": seed,
            "n_ctx": n_ctx,
            "timings": timings | {"load_seconds": round(load_seconds, 6),
                                  "warmup_seconds": round(warmup_seconds, 6)},
        }, ensure_ascii=False))
        return 0
    if args.perf:
        shifted = f"; context shifted {shifts} times" if shifts else ""
        say(args, f"[{len(generated)} tokens{shifted}, stop: "
                  f"{stop_description(stopped_by, n_predict, n_ctx)}; prompt "
                  f"{t['prompt_tokens']} tokens at {t['prompt_tokens_per_second']:.1f} tok/s, "
                  f"generation {t['generation_tokens_per_second']:.1f} tok/s; load "
                  f"{load_seconds:.2f} s, warm-up {warmup_seconds:.2f} s; seed "
                  f"{seed}{_lookup_note(t)}]")
    return 130 if interrupted else 0


def _n_keep(args: argparse.Namespace, prompt: list[int], tokenizer: object) -> int:
    """Tokens a context shift keeps: --keep of the prompt, BOS besides (-1 or more than the
    prompt: all of it), as llama.cpp counts them."""
    if args.keep < 0 or args.keep > len(prompt):
        return len(prompt)
    return args.keep + int(tokenizer.bos_id is not None and prompt[0] == tokenizer.bos_id)


def _interactive() -> bool:
    """Whether a first run may leave the compiled layers to a background process (docs/
    cli.md#first-run): for a person at a terminal, whom the first text should reach soon;
    a script (stderr not a terminal) compiles them here, so that nothing of this command
    goes on working after it. GGUFLM_BACKGROUND_COMPILE=1 or 0 decides instead."""
    choice = os.environ.get("GGUFLM_BACKGROUND_COMPILE", "")
    if choice in ("0", "1"):
        return choice == "1"
    return sys.stderr.isatty()


def _generate(args: argparse.Namespace, engine: object, request: object, tokenizer: object,
              progress: Progress, n_keep: int) -> tuple[object, list[int], str, int, bool]:
    """Run ``request``, streaming (``_stream``); with --context-shift, go on past a full
    context as llama.cpp does: the first ``n_keep`` tokens stay, half of the rest goes, the
    rest is the next request's prompt. (The last sequence, every generated token, the
    text, the shifts, whether Ctrl-C ended it.)"""
    import dataclasses

    generated: list[int] = []
    parts: list[str] = []
    shifts = 0
    while True:
        seq = engine.submit(request)
        try:
            parts.append(_stream(args, seq, request.prompt_ids, tokenizer, progress,
                                 first=not shifts))
        except KeyboardInterrupt:  # stop, and say what was done, as llama.cpp does
            seq.cancel()
            seq.wait()
            return seq, generated + seq.tokens, "".join(parts), shifts, True
        generated += seq.tokens
        left = request.max_tokens - len(seq.tokens) if request.max_tokens >= 0 else -1
        context = request.prompt_ids + seq.tokens
        n_left = len(context) - n_keep
        kept = context[:n_keep] + context[n_keep + n_left // 2:]
        if (not args.context_shift or seq.stopped_by != "context" or left == 0
                or len(kept) >= len(context) - 1):
            return seq, generated, "".join(parts), shifts, False
        shifts += 1
        params = dataclasses.replace(request.params, seed=(seq.seed + 1) % 2 ** 32)
        request = dataclasses.replace(request, prompt_ids=kept, max_tokens=left, params=params)


def _stream(args: argparse.Namespace, seq: object, prompt: list[int], tokenizer: object,
            progress: Progress, first: bool = True) -> str:
    """Show the prompt (--display-prompt) and its progress (the ``first`` part only), then
    stream the text to stdout; with --json, collect it instead. The text."""
    from ..engine.sequence import PREFILL, WAITING

    if not first:
        progress = Progress("", 0, enabled=False)
    elif args.display_prompt and not args.json:
        shown = tokenizer.decode(prompt, special=args.special)
        sys.stdout.write(f"{YELLOW}{shown}{RESET}" if color_on(args, sys.stdout) else shown)
        sys.stdout.flush()
    if progress.enabled:
        while not seq.done and seq.state in (WAITING, PREFILL):
            progress.update(seq.n_prompt_done)
            time.sleep(0.1)
        progress.close()
    if args.json:
        return "".join(piece.text for piece in seq)
    parts = []
    for piece in seq:
        parts.append(piece.text)
        sys.stdout.write(piece.text)
        sys.stdout.flush()
    return "".join(parts)


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
    """``-i`` / ``-cnv``: the same model and options in ``gguflm chat``; the system message
    is -sys's, else the prompt's (-p or -f), as in llama.cpp's conversation modes."""
    from . import chat

    ns = chat.default_args()
    for name, value in vars(args).items():
        if name.startswith("sampling_") or name in (
                "model", "threads", "ctx_size", "chat_template", "stop", "override_kv",
                "no_bos", "rope_style", "color", "lookup", "cache_type_k", "cache_type_v",
                "batch_size", "ubatch_size"):
            setattr(ns, name, value)
    if args.n_predict is not None:
        ns.n_predict = args.n_predict
    system = _system_text(args)
    if system is not None:  # -sys: the system message, as in llama-cli
        ns.system = system
    elif args.prompt is not None or args.file is not None:
        text = args.prompt if args.prompt is not None else read_text(args.file)
        ns.system = process_escapes(text) if args.escape else text
    return chat.chat(ns)
