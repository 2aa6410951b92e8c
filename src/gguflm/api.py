"""The Python API: ``gguflm.LLM``, a loaded model you complete text and chat with.

Results are shaped like OpenAI's (and llama-cpp-python's ``create_completion`` /
``create_chat_completion``) so code can switch between them::

    llm = gguflm.LLM("smollm2-135m")
    out = llm.generate("The capital of France is", max_tokens=8, temperature=0)
    out["choices"][0]["text"]
    for chunk in llm.chat([{"role": "user", "content": "Hi"}], stream=True):
        print(chunk["choices"][0]["delta"].get("content", ""), end="")

An ``LLM`` is a thin adapter over the serving engine (``engine/scheduler.py``): calls from
several threads run together in one continuously batched engine (``parallel`` slots, each
keeping its KV cache for the next call that shares its prefix), and ``generate`` given a
list of prompts computes them together. A sequence's result does not depend on what else
runs beside it: the same seed gives the same text under any load.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .chatformat.thinking import template_variables
from .chatplan import ChatDefaults
from .embedder import Embedder
from .engine.embed import DEFAULT_POOLING, model_pooling
from .engine.errors import InvalidRequestError
from .engine.scheduler import DEFAULT_MAX_QUEUE, DEFAULT_SLOTS, QueueFullError, default_n_ctx
from .engine.sequence import Job, Request
from .engine.spec import GenerationSpec
from .intake import Intake, check_lookup_value, is_ids
from .model.kv_cache import KV_TYPES
from .replies import ChatReply, ChatShaper, CompletionShaper, Shapes, stream_chunks
from .tokenizer.chat import ChatTemplate

__all__ = ["LLM", "ChatReply", "InvalidRequestError", "QueueFullError", "Shapes"]


# InvalidRequestError lives in engine/errors.py so that engine modules (constraints, tools)
# raise the same error the API and the server turn into an OpenAI error object


def thread_count(threads: int | None) -> int:
    """The kernel threads for ``threads`` (None: the cores this process may use)."""
    if threads is not None:
        return threads
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class LLM:
    """A GGUF model loaded for generation: ``generate``/``stream`` complete text, ``chat``
    answers a conversation through the model's chat template, ``tokenize``/``detokenize``.

    ``model`` is a GGUF file or a known model name (pulled on first use). ``n_ctx`` is each
    sequence's context size in tokens (default: 4096, at most the training context; 0: the
    training context); ``kv_cache_type`` the KV cache's numbers (``"f16"``, llama.cpp's
    default, ``"f32"``, or ``"q8_0"``: ggml Q8_0 blocks, about half f16's memory);
    ``n_batch`` prompt tokens per step (default and most: 512);
    ``threads`` the kernel threads (default: the cores available); ``chat_template`` a file
    that replaces the model's template (Jinja text or a ``tokenizer_config.json``);
    ``parallel`` the sequences computed together (slots, default 4; more calls wait in
    arrival order, at most ``max_queue`` in all). ``kv_overrides`` replace metadata values
    at load (``{"tokenizer.ggml.add_bos_token": False}``, llama.cpp's ``--override-kv``);
    ``rope_style`` (``"norm"``/``"neox"``) the architecture's RoPE pairing; ``pooling`` the
    embeddings' pooling (default: the file's ``pooling_type``, else mean); ``seed`` the seed
    of calls that give none (default: a random one each call); ``lookup`` the calls' default
    prompt-lookup draft (``lookup=K`` drafts up to K tokens per step from the prompt and the
    text so far and verifies them in one pass: faster on rewriting and editing, the same
    tokens; engine/lookup.py); ``verbose`` prints what was
    loaded to stderr. llama-cpp-python's names work too: ``model_path``, ``n_threads``
    (``n_ctx`` and ``seed`` are the same); ``n_gpu_layers``, ``use_mmap``, ``use_mlock``,
    ``flash_attn``, ``embedding`` and the like are accepted and ignored, with a
    warning for the GPU ones. Constructing an LLM sets process-wide state once: numpy's
    OpenBLAS runs on one thread (see ``quant.matrix.limit_blas_threads``).
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, *, n_ctx: int | None = None,
                 threads: int | None = None,
                 chat_template: str | os.PathLike[str] | None = None,
                 parallel: int = DEFAULT_SLOTS, max_queue: int = DEFAULT_MAX_QUEUE,
                 kv_overrides: Mapping[str, bool | int | float | str] | None = None,
                 rope_style: str | None = None, pooling: str | None = None,
                 seed: int | None = None, lookup: int = 0, verbose: bool = False,
                 kv_cache_type: str = "f16", n_batch: int | None = None,
                 model_path: str | os.PathLike[str] | None = None,
                 n_threads: int | None = None, **ignored: Any) -> None:
        from . import load_model
        from .engine.scheduler import N_BATCH, Engine
        from .hub import DEFAULT_MODEL, KNOWN_MODELS, resolve_model
        from .model.kv_cache import ArenaTooLargeError
        from .quant.matrix import entry_point_defaults
        from .tokenizer import Tokenizer

        # llama-cpp-python's names for the same things
        model, threads = _lcpp_aliases(model, model_path, threads, n_threads, ignored)
        name = os.fspath(model) if model is not None else DEFAULT_MODEL
        _check_sizes(threads=threads, parallel=parallel, max_queue=max_queue, n_ctx=n_ctx,
                     n_batch=n_batch)
        if kv_cache_type not in KV_TYPES:
            raise InvalidRequestError(f"kv_cache_type must be one of {', '.join(KV_TYPES)}, "
                                      f"got {kv_cache_type!r}", param="kv_cache_type")
        self.model_path = resolve_model(name)
        # the id clients see: a known name as given, else the file's name
        self.model_id = name if name in KNOWN_MODELS else self.model_path.name
        entry_point_defaults()  # an entry point's choice, not an import's side effect
        self.threads = thread_count(threads)
        self.verbose = bool(verbose)
        self.lookup = check_lookup_value(lookup)
        self.seed = _default_seed(seed)
        # sampling keywords for calls that leave them out (serve --temp ...); checked here
        self.sampling_defaults: dict[str, Any] = {}
        self.chat_defaults = ChatDefaults()  # serve --chat-template-kwargs, --reasoning-*
        if pooling is not None:  # checked before the file is opened
            Embedder.check_pooling(pooling)
        t0 = time.perf_counter()
        try:
            self.model = load_model(self.model_path, kv_overrides, rope_style)
        except ValueError as e:  # a bad override or rope_style (file errors pass as they are)
            raise InvalidRequestError(str(e), param="kv_overrides" if rope_style is None
                                      or "rope" not in str(e) else "rope_style") from None
        try:
            self.model.use_kv_type(kv_cache_type)
        except ValueError as e:  # a q8_0 cache for heads that are not whole Q8_0 blocks
            raise InvalidRequestError(str(e), param="kv_cache_type") from None
        self.tokenizer = Tokenizer.from_gguf(self.model.gguf)
        self.pooling = pooling or model_pooling(self.model.gguf.metadata) or DEFAULT_POOLING
        n_ctx_train = int(self.model.config.n_ctx_train or 0)
        self.n_ctx = n_ctx if n_ctx else (n_ctx_train if n_ctx == 0 and n_ctx_train
                                          else default_n_ctx(n_ctx_train))
        self.chat_template = ChatTemplate.for_tokenizer(
            self.tokenizer, self.model.gguf.metadata, override=chat_template)
        try:
            self.engine = Engine(self.model, self.tokenizer, n_ctx=self.n_ctx,
                                 n_slots=parallel, threads=self.threads, max_queue=max_queue,
                                 **({"n_batch": min(n_batch, N_BATCH)} if n_batch else {}))
        except ArenaTooLargeError as e:  # checked before anything is allocated
            raise InvalidRequestError(str(e), param="n_ctx") from None
        # usage and finish reason of the last run, however it ended (None: not ended)
        self.last_run: dict[str, Any] | None = None
        self.intake = Intake(self)  # requests: a spec checked into the engine's Request
        self.embedder = Embedder(self)
        if self.verbose:
            print(f"gguflm: loaded {self.model_path.name} in {time.perf_counter() - t0:.2f} s "
                  f"({self.model!r}; n_ctx {self.n_ctx}, {self.threads} threads, "
                  f"{parallel} slots, chat template {self.chat_template.name})",
                  file=sys.stderr, flush=True)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None,
                        revision: str | None = None, **kwargs: Any) -> LLM:
        """llama-cpp-python's ``Llama.from_pretrained``: the GGUF ``filename`` of the
        Hugging Face repository ``repo_id`` (a glob such as ``"*Q4_K_M.gguf"`` that must
        match one file; None: llama.cpp's default tag, Q4_K_M, then Q8_0, then the first
        GGUF) at ``revision`` (default: main), downloaded into the Hugging Face cache
        unless it is there (every shard of a split model), then loaded with ``kwargs``
        (``LLM``'s keywords). ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` apply
        (docs/models.md); a GGUFError says what went wrong."""
        from .hf import make_ref, resolve_ref

        ref = make_ref(repo_id, revision=revision or "main")
        return cls(resolve_ref(ref, pattern=filename), **kwargs)

    # --- tokens ------------------------------------------------------------------------------

    def tokenize(self, text: str | bytes, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` (BOS as the model asks when ``add_special``; special tokens
        written in the text recognised when ``parse_special``)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int], special: bool = False) -> str:
        """The text of ``ids`` (control tokens shown only when ``special``)."""
        return self.tokenizer.decode(ids, special=special)

    # --- the engine --------------------------------------------------------------------------

    def submit(self, prompt_ids: Sequence[int], *, constraint: Any = None,
               notify: Callable[[], None] | None = None, **options: Any) -> Job:
        """Start generating after ``prompt_ids`` and return the engine's ``Job`` at
        once: iterate it for text pieces; afterwards it has ``tokens``, ``finish_reason``,
        ``stopped_by``, ``seed``, ``usage()`` and ``timings_dict()``. ``options`` as in
        ``generate`` (``max_tokens`` default: no limit); ``constraint`` an
        ``engine.constraints.Constraint``. Raises InvalidRequestError, or QueueFullError
        when ``max_queue`` sequences are already running or waiting."""
        spec = GenerationSpec.from_kwargs("submit", options)
        return self.engine.submit(self.intake.request(list(prompt_ids), spec, constraint),
                                  notify)

    def _run(self, req: Request, cancel: Callable[[], bool] | None
             ) -> tuple[Job, Iterator[str]]:
        """Submit ``req``; the sequence and an iterator of its text pieces (closing the
        iterator early cancels the sequence)."""
        try:
            seq = self.engine.submit(req)
        except ValueError as e:
            raise InvalidRequestError(str(e), param="prompt") from None

        def texts() -> Iterator[str]:
            try:
                for piece in seq.pieces(cancel):
                    if piece.text:
                        yield piece.text
            finally:
                if not seq.done:
                    seq.cancel()
                    seq.wait()
                self.last_run = seq.usage() | {"finish_reason": seq.finish_reason}
            if seq.finish_reason == "error" and seq.error is not None:
                raise RuntimeError(f"generation failed: {seq.error}") from seq.error

        return seq, texts()

    # --- completion --------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]],
                 *, echo: bool = False, cancel: Callable[[], bool] | None = None,
                 **options: Any) -> dict[str, Any]:
        """Complete ``prompt`` and return an OpenAI ``text_completion``.

        ``prompt`` is text or token ids, or a list of them: then each is a choice (index in
        list order), all computed together in one batch, and ``usage`` adds them up.
        ``options`` are the generation fields of ``engine/spec.py``'s table:
        ``max_tokens`` (default 16; None or -1: until an end-of-generation token or the end
        of the context), ``stop`` (strings that end the text, not included), sampling
        (``temperature`` (0: greedy), ``top_p``, ``top_k``, ``min_p``, ``typical_p``,
        ``repeat_penalty``, ``repeat_last_n``, ``presence_penalty``, ``frequency_penalty``,
        ``seed``, ...: what is not given takes llama.cpp's default), ``logit_bias``
        (OpenAI's ``{token id: bias}``, bias -100..100, added to the logits before
        sampling), ``lookup`` (prompt-lookup drafts), and structured output, at most one of
        OpenAI's ``response_format``, a schema, a GBNF or Lark grammar, or a regex: every
        token is masked to keep the output valid (``engine/grammar.py``). ``echo`` puts the
        prompt before the completion. ``cancel``, if given, is polled between tokens: True
        ends the generation there (``finish_reason`` "cancelled").
        """
        spec = GenerationSpec.from_kwargs("completion", options)
        reqs = [self.completion_request(p, spec, echo) for p in _prompt_list(prompt)]
        runs = [self._run(req, cancel) for req, _ in reqs]
        choices, usage, shaper = [], None, None
        for i, ((seq, texts), (_, ptext)) in enumerate(zip(runs, reqs, strict=True)):
            shaper = CompletionShaper(self.model_id, ptext if echo else None)
            choices.append(shaper.choice(seq, "".join(texts), i))
            usage = _add_usage(usage, seq.usage())
        return Shapes("text_completion", self.model_id).completion_result(choices, usage)

    def stream(self, prompt: str | Sequence[int], *, echo: bool = False,
               include_usage: bool = False, cancel: Callable[[], bool] | None = None,
               **options: Any) -> Iterator[dict[str, Any]]:
        """Like ``generate``, as OpenAI ``text_completion`` chunks: one per piece of text,
        then one with the ``finish_reason`` (and with ``include_usage``, a last chunk with
        ``usage`` and no choices). The arguments are checked, and the generation started,
        before this returns. ``cancel``, if given, is polled between tokens."""
        req, ptext = self.completion_request(
            prompt, GenerationSpec.from_kwargs("completion", options), echo)
        seq, texts = self._run(req, cancel)
        shaper = CompletionShaper(self.model_id, ptext if echo else None, include_usage)
        return stream_chunks(shaper, seq, texts)

    def create_completion(self, prompt: str | Sequence[int], *, stream: bool = False,
                          **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's name: ``stream`` picks ``stream`` or ``generate``."""
        return self.stream(prompt, **kwargs) if stream else self.generate(prompt, **kwargs)

    __call__ = create_completion

    def completion_request(self, prompt: Any, spec: GenerationSpec, echo: bool = False
                           ) -> tuple[Request, str | None]:
        """The engine request for a completion and the prompt's text (for echo)."""
        return self.intake.completion(prompt, spec, echo)

    # --- chat --------------------------------------------------------------------------------

    def chat(self, messages: Sequence[Mapping[str, Any]], *, stream: bool = False,
             include_usage: bool = False, cancel: Callable[[], bool] | None = None,
             **options: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Answer a conversation (OpenAI ``messages``: dicts with ``role`` and ``content``).

        Returns a ``chat.completion``, or with ``stream`` an iterator of
        ``chat.completion.chunk`` (role first, then content pieces, then the finish reason).
        The prompt is the model's chat template rendered with ``add_generation_prompt``.
        ``tools`` (OpenAI function tools) go to the template, and the reply's calls come
        back as ``message.tool_calls`` (streamed as ``delta.tool_calls``) with
        ``finish_reason`` "tool_calls"; ``tool_choice`` "required" or a named function
        constrains the reply to a call whose arguments match the function's schema ("auto",
        the default: the model may call; "none": it may not); ``parallel_tool_calls``.
        A reasoning model's thinking comes back in ``message.reasoning_content`` (streamed
        as ``delta.reasoning_content``), never in the content: ``think`` turns the
        template's thinking on or off (``enable_thinking``), ``reasoning_effort`` sets its
        effort (gpt-oss), ``reasoning_budget_tokens`` closes the block after that many
        tokens, ``reasoning_format="none"`` leaves it in the content, and
        ``chat_template_kwargs`` gives the template more variables (docs/reasoning.md).
        Other options as in ``generate`` (``max_tokens`` default: until the model ends its
        turn or the context is full).
        """
        req, plan = self.chat_request(messages, GenerationSpec.from_kwargs("chat", options))
        seq, texts = self._run(req, cancel)
        shaper = ChatShaper(self.model_id, plan, include_usage)
        if stream:
            return stream_chunks(shaper, seq, texts)
        return shaper.whole(seq, "".join(texts))

    def chat_request(self, messages: Sequence[Mapping[str, Any]], spec: GenerationSpec
                     ) -> tuple[Request, Any]:
        """The engine request for a conversation and its tool plan (None without tools;
        see ``engine/tools.py``)."""
        return self.intake.chat(messages, spec)

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]],
                               **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's name for ``chat``."""
        return self.chat(messages, **kwargs)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True,
                            tools: Sequence[Mapping[str, Any]] | None = None,
                            chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The prompt text the chat template makes of ``messages`` (``chat_template_kwargs``:
        more template variables, such as ``enable_thinking``)."""
        return self.intake.render(messages, add_generation_prompt, tools,
                                  template_variables(chat_template_kwargs or {}))

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, Any]],
                        tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Token ids of the rendered conversation (BOS once, special tokens parsed)."""
        return self.intake.chat_ids(messages, tools)

    # --- embeddings (engine/embed.py) ---------------------------------------------------------

    def embed(self, input: str | Sequence[int] | Sequence[str | Sequence[int]], *,  # noqa: A002
              pooling: str | None = None, normalize: bool | int = True,
              ) -> list[float] | list[list[float]] | list[list[list[float]]]:
        """Embeddings of ``input`` (a text or token ids: one vector; a list of them: one
        vector each, computed together), as llama.cpp computes them: the final hidden
        states pooled (``pooling``: mean, cls, last or none, default the model's) and
        normalized (True: Euclidean, llama.cpp's default; False: not; an int: llama.cpp's
        ``embd_normalize``). Pooling ``none`` gives one vector per token."""
        single = isinstance(input, str) or is_ids(input) and bool(input)
        vectors, _ = self.embedder.vectors([input] if single else list(input), pooling,
                                            normalize)
        out = [v.tolist() for v in vectors]
        return out[0] if single else out

    def create_embedding(self, input: str | Sequence[Any], model: str | None = None,  # noqa: A002
                         **kwargs: Any) -> dict[str, Any]:
        """An OpenAI ``embeddings`` response (llama-cpp-python's name): ``data`` holds one
        ``{"object": "embedding", "index", "embedding"}`` per input, the vector as floats or
        (``encoding_format="base64"``) as base64 of little-endian float32, as OpenAI sends
        it; ``usage`` counts the tokens. ``pooling`` and ``normalize`` as in ``embed``;
        ``cancel``, if given, is polled while the vectors are computed: True cancels them
        (InvalidRequestError, code ``cancelled``)."""
        return self.embedder.create_embedding(input, model, **kwargs)

    def rerank(self, query: str, documents: Sequence[Any], top_n: int | None = None,
               **kwargs: Any) -> dict[str, Any]:
        """Rank ``documents`` (strings or ``{"text": ...}``) by relevance to ``query`` with
        a reranker's scoring head, as llama-server's ``/v1/rerank`` answers: ``results``
        ``[{"index", "relevance_score"}]`` best first, the first ``top_n``; keywords
        ``return_documents``, ``model``, ``cancel`` (``reranker.py``)."""
        from .reranker import Reranker

        return Reranker(self).rerank(query, documents, top_n, **kwargs)

    # --- the rest ----------------------------------------------------------------------------

    def warm_up(self) -> float:
        """Load (or, on a first run, compile) the kernels and touch the weights with a few
        tokens through the model (``Model.warm_up``, decoding and prompt paths both), and
        build the tables made on first use (the tokenizer's merge ranks, the longest
        token's length that bounds a prompt), so that the first real request, or batch of
        them, does not pay for it. Leaves
        the slots' caches alone; returns the seconds it took."""
        t0 = time.perf_counter()
        self.engine.call(lambda: self.model.warm_up(prompts=True))
        self.intake.check_fits("", "prompt")
        self.tokenizer.decode(self.tokenizer.encode("Hello, world", add_special=True))
        return time.perf_counter() - t0

    def reset(self) -> None:
        """Forget the cached prefixes (the next calls evaluate their whole prompt)."""
        self.engine.forget()

    def close(self) -> None:
        """Stop the engine and release the model file (the LLM is unusable afterwards)."""
        self.engine.close()
        self.model.gguf.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"LLM({self.model_id!r}, n_ctx={self.n_ctx}, threads={self.threads}, "
                f"parallel={self.engine.n_slots})")


def _check_sizes(**sizes: int | None) -> None:
    """Each of the LLM's sizes None or an integer of at least 1 (``n_ctx`` 0: the model's
    own, as in llama.cpp)."""
    for arg, value in sizes.items():
        least = 0 if arg == "n_ctx" else 1
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < least):
            raise InvalidRequestError(
                f"{arg} must be an integer of at least {least}, got {value!r}", param=arg)


def _default_seed(seed: Any) -> int | None:
    """The LLM's ``seed``: None for llama.cpp's "random" seeds, else checked."""
    if seed is None or seed == -1 or seed == 0xFFFFFFFF:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise InvalidRequestError(f"seed must be in 0..4294967295 (or -1), got {seed!r}",
                                  param="seed")
    return seed


def _prompt_list(prompt: Any) -> list[Any]:
    """A prompt, or a list of prompts (strings or id lists), as a list of prompts."""
    if isinstance(prompt, list | tuple) and prompt and all(
            isinstance(p, str) or (is_ids(p) and not isinstance(p, str)) for p in prompt) \
            and not is_ids(prompt):
        return list(prompt)
    return [prompt]


def _add_usage(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    if a is None:
        return b
    return {k: _add_usage(a[k], b[k]) if isinstance(b[k], dict) else a[k] + b[k] for k in b}


# llama-cpp-python's Llama() arguments with no meaning here: GPU and memory-mapping choices
# (warned about: the user may expect a GPU), and tuning knobs gguflm sets itself (silent)
# (name: llama-cpp-python's default; only another value is warned about)
_IGNORED_WARN = {"n_gpu_layers": 0, "main_gpu": 0, "tensor_split": None, "split_mode": 1,
                 "use_mlock": False, "use_mmap": True, "flash_attn": False,
                 "offload_kqv": True, "numa": False}
_IGNORED_SILENT = ("n_batch", "n_ubatch", "n_threads_batch", "embedding", "logits_all",
                   "last_n_tokens_size", "type_k", "type_v", "chat_format")


def _lcpp_aliases(model: Any, model_path: Any, threads: Any, n_threads: Any,
                  ignored: dict[str, Any]) -> tuple[Any, Any]:
    """Resolve llama-cpp-python's constructor names (``model_path``, ``n_threads``) and
    its arguments that mean nothing here; anything else unknown is a TypeError."""
    if model is not None and model_path is not None:
        raise TypeError("give model or model_path, not both")
    if threads is not None and n_threads is not None:
        raise TypeError("give threads or n_threads, not both")
    unknown = sorted(set(ignored) - set(_IGNORED_WARN) - set(_IGNORED_SILENT))
    if unknown:
        raise TypeError(f"LLM() got unexpected argument(s): {', '.join(unknown)}")
    gpu = [k for k, default in _IGNORED_WARN.items() if k in ignored and ignored[k] != default]
    if gpu:
        warnings.warn(f"{', '.join(gpu)}: ignored (gguflm runs on the CPU, from the "
                      "memory-mapped file)", stacklevel=3)
    return (model if model is not None else model_path,
            threads if threads is not None else n_threads)
