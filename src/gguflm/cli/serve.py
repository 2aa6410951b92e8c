"""``gguflm serve [MODEL]``: an OpenAI-compatible HTTP API on one model, or on several
(``-m`` repeated, ``--models-dir``, ``--models-config``: ``serve_models.py``)."""

from __future__ import annotations

import argparse
import os
import sys

from . import CLIError, UsageError
from .common import (
    add_batch_options,
    add_kv_cache_options,
    add_load_options,
    add_lookup_option,
    add_status_options,
    add_threads_argument,
    batch_size,
    kv_cache_type,
    load_options,
    non_negative_int,
    positive_int,
    refuse_encoder,
    say_if_compiling,
    say_if_larger_than_memory,
    say_if_not_compiled,
)
from .reasoning import add_reasoning_options, chat_defaults
from .serve_models import add_pool_options, model_names, pool_for, several_models
from .textfiles import read_text_file


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..engine.params import add_cli_options
    from ..engine.scheduler import DEFAULT_MAX_QUEUE, DEFAULT_SLOTS
    from ..hub import DEFAULT_MODEL

    p = subparsers.add_parser(
        "serve", help="serve an OpenAI-, Anthropic- and Ollama-compatible HTTP API",
        description="Serve MODEL (a GGUF file or a known model name, default "
                    f"{DEFAULT_MODEL}) over HTTP: GET /health and /v1/models, POST "
                    "/v1/completions and /v1/chat/completions (JSON, or Server-Sent Events "
                    "with \"stream\": true), POST /v1/embeddings, POST /v1/rerank and "
                    "/v1/reranking (a reranker's scores), POST /v1/responses "
                    "(OpenAI's Responses API), POST /v1/messages and "
                    "/v1/messages/count_tokens (Anthropic's Messages API), Ollama's POST "
                    "/api/chat, /api/generate, /api/embed, /api/embeddings, /api/show, "
                    "/api/pull and GET /api/tags, /api/ps, /api/version, GET /slots and "
                    "/metrics, and a chat page at GET /. Up to --parallel requests are "
                    "computed together (continuous batching); the rest wait in arrival "
                    "order. With several models (-m repeated, --models-dir, "
                    "--models-config), the request's model field picks one, loaded on "
                    "first use; GET /models lists them, POST /models/load and "
                    "/models/unload load and free one.")
    add_models_arguments(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8080,
                   help="port to listen on; 0: any free port (default: 8080)")
    add_model_options(p)
    p.add_argument("-np", "--parallel", type=positive_int, default=None, metavar="N",
                   help=f"requests computed together (slots, each with its own context of "
                        f"N_CTX tokens; default: {DEFAULT_SLOTS})")
    p.add_argument("--max-queue", type=int, default=None, metavar="N",
                   help=f"requests running or waiting at most; more get 503 (default: "
                        f"{DEFAULT_MAX_QUEUE})")
    p.add_argument("--pooling", choices=("mean", "cls", "last", "none"),
                   help="pooling of /v1/embeddings (default: the model's pooling_type, else "
                        "mean; none is refused there: one vector per token)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request to stderr")
    p.add_argument("-a", "--alias", metavar="NAME",
                   help="the model's id in the API (default: the known name given, else the "
                        "file's name)")
    add_status_options(p, perf=False)
    add_lookup_option(p)
    add_cli_options(p, "sampling: the defaults of requests that leave a field out",
                    stops=False)
    add_access_options(p)
    add_load_options(p)
    add_pool_options(p)
    p.set_defaults(func=serve, serving=True)  # workers spin briefly between products


def add_models_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL, and ``-m MODEL`` that may be repeated (``common.add_model_argument``'s ``-m``
    is one model: ``serve`` reconciles its own, in ``serve``)."""
    from ..hub import DEFAULT_MODEL
    from .pull import add_hf_options

    add_hf_options(p)
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help=f"GGUF file or known model name (default: {DEFAULT_MODEL})")
    p.add_argument("-m", "--model", dest="model_flags", action="append", default=[],
                   metavar="MODEL", help="a model to serve (the same as MODEL); repeat to "
                                         "serve several")
    p.set_defaults(model_default=DEFAULT_MODEL)


def add_access_options(p: argparse.ArgumentParser) -> None:
    """The chat page and who may use the server (see gguflm.access)."""
    ui = p.add_mutually_exclusive_group()
    ui.add_argument("--no-webui", "--no-ui", dest="webui", action="store_false",
                    help="do not serve the chat page at GET /")
    ui.add_argument("--webui", "--ui", dest="webui", action="store_true", default=True,
                    help="serve the chat page at GET / (the default)")
    p.add_argument("--cors", "--cors-origins", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN (scheme://host[:port], or * for any) use "
                        "the API; repeat or separate with commas (default: only the server's "
                        "own page)")
    p.add_argument("--allowed-host", dest="allowed_hosts", action="append", default=[],
                   metavar="NAME",
                   help="also answer requests for the host NAME (a DNS name this server is "
                        "reached by; * for any); repeat or separate with commas (default: IP "
                        "addresses, localhost and the --host name; see docs/security.md)")
    p.add_argument("--api-key", metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on the API (not on /health or "
                        "the page, which asks for it); default: $GGUFLM_API_KEY if set")


def access_options(args: argparse.Namespace) -> dict:
    """``make_server`` keyword arguments from --no-webui, --cors, --allowed-host and
    --api-key."""
    from ..access import check_host, check_origin

    cors = _listed(args.cors, check_origin, "--cors")
    hosts = _listed(args.allowed_hosts, check_host, "--allowed-host")
    key = args.api_key if args.api_key is not None else os.environ.get("GGUFLM_API_KEY") or None
    if key is not None and not key.strip():
        raise CLIError("--api-key must not be empty")
    return {"webui": args.webui, "cors": cors, "api_key": key and key.strip(),
            "allowed_hosts": hosts}


def _listed(values: list[str], check, flag: str) -> list[str]:  # noqa: ANN001 - a checker
    """A repeatable, comma-separated option's items, each checked (CLIError naming ``flag``)."""
    items = [v for value in values for v in value.split(",") if v.strip()]
    for item in items:
        try:
            check(item)
        except ValueError as e:
            raise CLIError(f"{flag}: {e}") from None
    return items


def add_model_options(p: argparse.ArgumentParser) -> None:
    """-c, -t, -b/-ub, -ctk/-ctv, --chat-template and --jinja, shared with ``gguflm chat``."""
    p.add_argument("-c", "--ctx-size", type=non_negative_int, metavar="N_CTX",
                   help="context size in tokens; 0: the model's training context (default: "
                        "4096, at most the model's training context)")
    add_threads_argument(p)
    add_reasoning_options(p)
    add_batch_options(p)
    add_kv_cache_options(p)
    p.add_argument("--chat-template", "--chat-template-file", metavar="FILE",
                   help="use this chat template (Jinja text, or a tokenizer_config.json) "
                        "instead of the model's")
    p.add_argument("--jinja", action="store_true",
                   help="accepted: gguflm always renders chat templates with Jinja")


def check_chat_template(args: argparse.Namespace) -> None:
    """``--chat-template FILE``: UTF-8 text in a regular file within its cap (textfiles.py),
    checked before the model loads (the template module reads it again then)."""
    if getattr(args, "chat_template", None) is not None:
        read_text_file(args.chat_template, "--chat-template")


def load_llm(args: argparse.Namespace, parallel: int | None = None,  # noqa: ANN201 - an LLM
             max_queue: int | None = None, generate: bool = False):
    """The LLM for ``args`` (model, -c, -t, --chat-template) with ``parallel`` slots, errors
    as CLIError; ``generate``: an embedding model is refused at once (``chat``)."""
    from ..api import LLM, InvalidRequestError
    from ..engine.scheduler import DEFAULT_MAX_QUEUE, DEFAULT_SLOTS
    from ..hub import KNOWN_MODELS
    from .pull import resolve

    check_chat_template(args)
    defaults = chat_defaults(args)  # checked before the model loads
    path = resolve(args.model)  # pulls a known model with progress shown
    try:
        llm = LLM(path, n_ctx=args.ctx_size, threads=args.threads,
                  chat_template=args.chat_template, parallel=parallel or DEFAULT_SLOTS,
                  max_queue=max_queue or DEFAULT_MAX_QUEUE, pooling=getattr(args, "pooling", None),
                  lookup=getattr(args, "lookup", 0), kv_cache_type=kv_cache_type(args),
                  n_batch=batch_size(args), **load_options(args))
    except InvalidRequestError as e:
        raise CLIError(str(e)) from None
    if getattr(args, "alias", None):
        llm.model_id = args.alias
    elif args.model in KNOWN_MODELS:
        llm.model_id = args.model  # the name the user gave, as clients will see it
    llm.chat_defaults = defaults
    if generate:
        refuse_encoder(llm.model, path)
    say_if_not_compiled(llm.model)
    say_if_larger_than_memory(path)
    if getattr(args, "warmup", True):
        say_if_compiling()
        llm.warm_up()  # the first request should not pay for loading the kernels
    return llm


def serve(args: argparse.Namespace) -> int:
    from ..engine.params import cli_sampler_params
    from ..engine.sampling import SamplingError
    from ..engine.scheduler import DEFAULT_MAX_QUEUE
    from ..server import make_server

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {args.port}")
    max_queue = DEFAULT_MAX_QUEUE if args.max_queue is None else args.max_queue
    if max_queue < 1:
        raise UsageError(f"--max-queue must be at least 1, got {max_queue}")
    access = access_options(args)
    try:
        cli_sampler_params(args)  # bad defaults fail here, not in every request
    except SamplingError as e:
        raise UsageError(f"invalid sampling option: {e}".replace("_", "-")) from None
    if several_models(args):
        target, what = _several(args, max_queue)
    else:
        target = _one(args, max_queue)
        what = _describe(target)
    try:
        server = make_server(target, args.host, args.port, verbose=args.verbose, **access)
    except OSError as e:
        raise CLIError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    log = (lambda *a, **k: None) if args.log_disable else print  # noqa: E731
    log(f"gguflm serve: {what} listening on {server.url}/v1", file=sys.stderr, flush=True)
    if access["webui"]:
        # 0.0.0.0 means every address; a browser on this machine reaches it as 127.0.0.1
        page = server.url.replace("//0.0.0.0:", "//127.0.0.1:") + "/"
        log(f"gguflm serve: chat page at {page}"
              + (" (it will ask for the API key)" if access["api_key"] else ""),
              file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("gguflm serve: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0


def _sampling_setup(args: argparse.Namespace):  # noqa: ANN202 - a setter of LLMs
    """What sets a loaded model's request defaults from the sampling options."""
    from ..engine.params import cli_values

    defaults = {k: v for k, v in cli_values(args).items() if v is not None and k != "seed"}

    def setup(llm) -> None:  # noqa: ANN001 - an LLM
        llm.sampling_defaults = dict(defaults)
        if args.sampling_seed is not None and args.sampling_seed >= 0:
            llm.seed = args.sampling_seed
    return setup


def _one(args: argparse.Namespace, max_queue: int):  # noqa: ANN202 - an LLM
    from .common import finish_model_argument

    names = model_names(args)
    args.model, args.model_flag = None, names[0] if names else None
    finish_model_argument(args)  # -hf, the default model
    llm = load_llm(args, parallel=args.parallel, max_queue=max_queue)
    _sampling_setup(args)(llm)
    return llm


def _describe(llm) -> str:  # noqa: ANN001 - an LLM
    what = ("a reranker: /v1/rerank" if llm.model.is_encoder and llm.model.classifier
            else "an embedding model: /v1/embeddings only" if llm.model.is_encoder
            else f"chat template: {llm.chat_template.name}")
    return (f"{llm.model_id} (n_ctx {llm.n_ctx}, {llm.engine.n_slots} slots, "
            f"{llm.threads} threads, {what})")


def _several(args: argparse.Namespace, max_queue: int) -> tuple:
    """The ModelPool of ``args`` and a line saying what it serves."""
    from ..engine.scheduler import DEFAULT_SLOTS

    setup = _sampling_setup(args)
    defaults = chat_defaults(args)  # checked before any model loads

    def prepare(llm) -> None:  # noqa: ANN001 - an LLM
        setup(llm)
        llm.chat_defaults = defaults
        if getattr(args, "warmup", True):
            llm.warm_up()

    base = {"n_ctx": args.ctx_size, "threads": args.threads, "chat_template":
            args.chat_template, "parallel": args.parallel or DEFAULT_SLOTS,
            "max_queue": max_queue, "pooling": args.pooling, "lookup": args.lookup,
            "kv_cache_type": kv_cache_type(args), "n_batch": batch_size(args),
            **load_options(args)}
    pool = pool_for(args, base, prepare)
    budget = f"{pool.budget / 2**20:.0f} MiB"
    return pool, (f"{len(pool.specs)} models ({', '.join(s.name for s in pool.specs)}; "
                  f"loaded on first use, memory budget {budget}"
                  + (f", at most {pool.max_loaded} at once" if pool.max_loaded else "")
                  + f", idle ttl {args.ttl:g} s)")
