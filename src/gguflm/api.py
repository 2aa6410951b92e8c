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

import base64
import os
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .engine.embed import DEFAULT_POOLING, model_pooling
from .engine.errors import InvalidRequestError
from .engine.params import sampler_params
from .engine.scheduler import DEFAULT_MAX_QUEUE, DEFAULT_SLOTS, QueueFullError, default_n_ctx
from .engine.sequence import Request, check_logit_bias
from .engine.sequence import Sequence as EngineSequence
from .engine.stops import StopError, check_stops
from .model.kv_cache import KV_TYPES
from .tokenizer.chat import (
    ChatTemplate,
    ChatTemplateError,
    TemplateLimitError,
    check_messages,
    encode_prompt,
)

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
        for arg, value in (("threads", threads), ("parallel", parallel),
                           ("max_queue", max_queue), ("n_ctx", n_ctx), ("n_batch", n_batch)):
            least = 0 if arg == "n_ctx" else 1  # n_ctx 0: the model's own, as in llama.cpp
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < least):
                raise InvalidRequestError(
                    f"{arg} must be an integer of at least {least}, got {value!r}", param=arg)
        if kv_cache_type not in KV_TYPES:
            raise InvalidRequestError(f"kv_cache_type must be one of {', '.join(KV_TYPES)}, "
                                      f"got {kv_cache_type!r}", param="kv_cache_type")
        self.model_path = resolve_model(name)
        # the id clients see: a known name as given, else the file's name
        self.model_id = name if name in KNOWN_MODELS else self.model_path.name
        entry_point_defaults()  # an entry point's choice, not an import's side effect
        self.threads = thread_count(threads)
        self.verbose = bool(verbose)
        self.lookup = _check_lookup(lookup)
        self.seed = self._default_seed(seed)
        # sampling keywords for calls that leave them out (serve --temp ...); checked here
        self.sampling_defaults: dict[str, Any] = {}
        if pooling is not None:  # checked before the file is opened
            self._check_pooling(pooling)
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
        self._max_token_bytes: int | None = None  # the longest token's text (see _check_fits)
        if self.verbose:
            print(f"gguflm: loaded {self.model_path.name} in {time.perf_counter() - t0:.2f} s "
                  f"({self.model!r}; n_ctx {self.n_ctx}, {self.threads} threads, "
                  f"{parallel} slots, chat template {self.chat_template.name})",
                  file=sys.stderr, flush=True)

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

    def submit(self, prompt_ids: Sequence[int], *, max_tokens: int | None = -1,
               stop: str | Sequence[str] | None = None, seed: int | None = None,
               constraint: Any = None, notify: Callable[[], None] | None = None,
               **sampling: Any) -> EngineSequence:
        """Start generating after ``prompt_ids`` and return the engine's ``Sequence`` at
        once: iterate it for text pieces; afterwards it has ``tokens``, ``finish_reason``,
        ``stopped_by``, ``seed``, ``usage()`` and ``timings_dict()``. Arguments as in
        ``generate``. Raises InvalidRequestError, or QueueFullError when ``max_queue``
        sequences are already running or waiting."""
        req = self._request(list(prompt_ids), max_tokens, stop, seed, sampling, constraint)
        return self.engine.submit(req, notify)

    def _request(self, ids: list[int], max_tokens: Any, stop: Any, seed: Any,
                 sampling: dict[str, Any], constraint: Any = None) -> Request:
        from .engine.sampling import SamplingError

        self._require_generator()
        if not ids:
            raise InvalidRequestError("the prompt is empty (and the model adds no BOS token)",
                                      param="prompt")
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)
               or not 0 <= t < self.tokenizer.n_vocab]
        if bad:
            raise InvalidRequestError(f"token id {bad[0]!r} is outside the vocabulary "
                                      f"(0..{self.tokenizer.n_vocab - 1})", param="prompt")
        if len(ids) > self.n_ctx:
            raise InvalidRequestError(
                f"the prompt is {len(ids)} tokens, longer than the context of {self.n_ctx}",
                param="prompt", code="context_length_exceeded")
        if max_tokens is None:
            max_tokens = -1
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < -1:
            raise InvalidRequestError(
                f"max_tokens must be a non-negative integer (or null), got {max_tokens!r}",
                param="max_tokens")
        try:
            stops = check_stops(stop)
        except StopError as e:
            raise InvalidRequestError(str(e), param="stop") from None
        if seed is None:
            seed = self.seed  # the LLM's seed (llama-cpp-python's Llama(seed=...)), if any
        sampling = self.sampling_defaults | {k: v for k, v in sampling.items() if v is not None}
        lookup = sampling.pop("lookup", None)
        lookup = self.lookup if lookup is None else _check_lookup(lookup)
        try:
            bias = check_logit_bias(sampling.pop("logit_bias", None), self.tokenizer.n_vocab)
        except ValueError as e:
            raise InvalidRequestError(str(e), param="logit_bias") from None
        try:
            params = sampler_params(sampling | {"seed": seed})
        except SamplingError as e:
            raise InvalidRequestError(str(e), param=getattr(e, "param", None)) from None
        return Request(ids, params, max_tokens, stops, constraint, lookup, logit_bias=bias)

    def _run(self, req: Request, cancel: Callable[[], bool] | None
             ) -> tuple[EngineSequence, Iterator[str]]:
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
                 *, max_tokens: int | None = 16, stop: str | Sequence[str] | None = None,
                 seed: int | None = None, echo: bool = False,
                 cancel: Callable[[], bool] | None = None, response_format: Any = None,
                 json_schema: Any = None, grammar: Any = None, regex: Any = None,
                 **sampling: Any) -> dict[str, Any]:
        """Complete ``prompt`` and return an OpenAI ``text_completion``.

        ``prompt`` is text or token ids, or a list of them: then each is a choice (index in
        list order), all computed together in one batch, and ``usage`` adds them up.
        ``max_tokens``: at most this many tokens (None or -1: until an end-of-generation
        token or the end of the context). ``stop``: strings that end the text (not included).
        Sampling: ``temperature`` (0: greedy), ``top_p``, ``top_k``, ``min_p``,
        ``typical_p``, ``repeat_penalty``, ``repeat_last_n``, ``presence_penalty``,
        ``frequency_penalty`` and ``seed``; what is not given takes llama.cpp's default.
        ``logit_bias`` (OpenAI's ``{token id: bias}``, bias -100..100) is added to the
        logits before sampling (see ``engine.sequence.check_logit_bias``). ``echo`` puts
        the prompt before the completion. ``cancel``, if given, is polled between tokens:
        True ends the generation there (``finish_reason`` "cancelled").
        Structured output (at most one): ``response_format`` (OpenAI's ``{"type":
        "json_object"}`` or ``{"type": "json_schema", "json_schema": {"name", "schema"}}``),
        ``json_schema`` (a schema), ``grammar`` (GBNF or Lark text), ``regex``: every token
        is masked to keep the output valid (see ``engine/grammar.py``).
        """
        spec = dict(response_format=response_format, json_schema=json_schema, grammar=grammar,
                    regex=regex)
        prompts = _prompt_list(prompt)
        reqs = [self.completion_request(p, max_tokens, stop, seed, echo, sampling, **spec)
                for p in prompts]
        runs = [self._run(req, cancel) for req, _ in reqs]
        texts = ["".join(it) for _, it in runs]
        choices, usage = [], None
        for i, ((seq, _), (_, ptext), text) in enumerate(zip(runs, reqs, texts, strict=True)):
            if echo and ptext is not None:
                text = ptext + text
            choices.append({"text": text, "index": i, "logprobs": None,
                            "finish_reason": seq.finish_reason})
            usage = _add_usage(usage, seq.usage())
        return Shapes("text_completion", self.model_id).completion_result(choices, usage)

    def stream(self, prompt: str | Sequence[int], *, max_tokens: int | None = 16,
               stop: str | Sequence[str] | None = None, seed: int | None = None,
               echo: bool = False, include_usage: bool = False,
               cancel: Callable[[], bool] | None = None, response_format: Any = None,
               json_schema: Any = None, grammar: Any = None, regex: Any = None,
               **sampling: Any) -> Iterator[dict[str, Any]]:
        """Like ``generate``, as OpenAI ``text_completion`` chunks: one per piece of text,
        then one with the ``finish_reason`` (and with ``include_usage``, a last chunk with
        ``usage`` and no choices). The arguments are checked, and the generation started,
        before this returns. ``cancel``, if given, is polled between tokens."""
        req, ptext = self.completion_request(
            prompt, max_tokens, stop, seed, echo, sampling, response_format=response_format,
            json_schema=json_schema, grammar=grammar, regex=regex)
        seq, texts = self._run(req, cancel)
        return self._completion_chunks(seq, texts, ptext if echo else None, include_usage)

    def create_completion(self, prompt: str | Sequence[int], *, stream: bool = False,
                          **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's name: ``stream`` picks ``stream`` or ``generate``."""
        return self.stream(prompt, **kwargs) if stream else self.generate(prompt, **kwargs)

    __call__ = create_completion

    def _completion_chunks(self, seq: EngineSequence, texts: Iterator[str],
                           echo_text: str | None, include_usage: bool
                           ) -> Iterator[dict[str, Any]]:
        shape = Shapes("text_completion", self.model_id)
        try:
            if echo_text:
                yield shape.completion_chunk(echo_text, None)
            for piece in texts:
                yield shape.completion_chunk(piece, None)
        finally:
            texts.close()
        yield shape.completion_chunk("", seq.finish_reason)
        if include_usage:
            yield shape.usage_chunk(seq.usage())

    def completion_request(self, prompt: Any, max_tokens: Any, stop: Any, seed: Any,
                           echo: bool, sampling: dict[str, Any], **constraint: Any
                           ) -> tuple[Request, str | None]:
        """The engine request for a completion and the prompt's text (for echo);
        ``constraint``: response_format, json_schema, grammar, regex (see ``generate``)."""
        self._require_generator()
        if isinstance(prompt, str):
            _check_text(prompt, "prompt")
            self._check_fits(prompt, "prompt")
            ids = self.tokenizer.encode(prompt, add_special=True, parse_special=True)
            text: str | None = prompt
        elif _is_ids(prompt):
            ids = list(prompt)
            text = None
        else:
            raise InvalidRequestError("prompt must be a string or a list of token ids",
                                      param="prompt")
        req = self._request(ids, max_tokens, stop, seed, sampling,
                            self.constraint(**constraint))
        if text is None and echo:
            text = self.tokenizer.decode(ids)
        return req, text

    # --- chat --------------------------------------------------------------------------------

    def chat(self, messages: Sequence[Mapping[str, Any]], *, stream: bool = False,
             max_tokens: int | None = None, stop: str | Sequence[str] | None = None,
             seed: int | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
             tool_choice: Any = None, parallel_tool_calls: bool | None = None,
             include_usage: bool = False, cancel: Callable[[], bool] | None = None,
             response_format: Any = None, json_schema: Any = None, grammar: Any = None,
             regex: Any = None, **sampling: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Answer a conversation (OpenAI ``messages``: dicts with ``role`` and ``content``).

        Returns a ``chat.completion``, or with ``stream`` an iterator of
        ``chat.completion.chunk`` (role first, then content pieces, then the finish reason).
        The prompt is the model's chat template rendered with ``add_generation_prompt``.
        ``tools`` (OpenAI function tools) go to the template, and the reply's calls come
        back as ``message.tool_calls`` (streamed as ``delta.tool_calls``) with
        ``finish_reason`` "tool_calls"; ``tool_choice`` "required" or a named function
        constrains the reply to a call whose arguments match the function's schema ("auto",
        the default: the model may call; "none": it may not). Structured output and other
        arguments as in ``generate`` (``max_tokens`` default: until the model ends its turn
        or the context is full).
        """
        req, plan = self.chat_request(
            messages, max_tokens, stop, seed, sampling, tools=tools, tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls, response_format=response_format,
            json_schema=json_schema, grammar=grammar, regex=regex)
        seq, texts = self._run(req, cancel)
        reply = ChatReply(plan)
        if stream:
            return self._chat_chunks(seq, texts, reply, include_usage)
        reply.feed("".join(texts))
        reply.finish()
        return Shapes("chat.completion", self.model_id).chat_result(
            reply.message(), reply.finish_reason(seq.finish_reason), seq.usage(),
            reply.detail())

    def chat_request(self, messages: Sequence[Mapping[str, Any]], max_tokens: Any, stop: Any,
                     seed: Any, sampling: dict[str, Any],
                     tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
                     parallel_tool_calls: bool | None = None, **constraint: Any
                     ) -> tuple[Request, Any]:
        """The engine request for a conversation (arguments checked as in ``chat``) and its
        tool plan (None without tools; see ``engine/tools.py``)."""
        from .engine.tools import plan_tools

        self._require_generator()
        plan = plan_tools(messages, tools, tool_choice,
                          self.chat_template.source, parallel_tool_calls)
        if plan is not None:
            messages, template_tools = plan.messages, plan.template_tools
        else:
            template_tools = None
        c = self.constraint(**constraint)
        if plan is not None and plan.grammar is not None:
            if c is not None:
                raise InvalidRequestError("a required tool call cannot be combined with "
                                          "response_format or a grammar", param="tool_choice")
            from .engine.constraints import Constraint

            c = Constraint(plan.grammar, self.tokenizer)
        ids = self.chat_prompt_ids(messages, tools=template_tools)
        req = self._request(ids, max_tokens, stop, seed, sampling, c)
        if plan is not None:
            req.watch = plan.watcher()  # stops a model that repeats a call
        return req, plan

    def constraint(self, response_format: Any = None, json_schema: Any = None,
                   grammar: Any = None, regex: Any = None) -> Any:
        """The ``Constraint`` a request asks for (None: free text); InvalidRequestError
        (``param`` set) for an invalid or unsupported schema or grammar."""
        if response_format is None and json_schema is None and grammar is None and regex is None:
            return None
        from .engine.constraints import Constraint
        from .engine.grammar import constraint_from_request

        g = constraint_from_request(response_format, json_schema, grammar, regex,
                                    tokenizer=self.tokenizer)
        return None if g is None else Constraint(g, self.tokenizer)

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]],
                               **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's name for ``chat``."""
        return self.chat(messages, **kwargs)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True,
                            tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The prompt text the chat template makes of ``messages``."""
        try:
            return self.chat_template.render(_text_messages(messages), add_generation_prompt,
                                             tools=tools)
        except TemplateLimitError as e:  # an untrusted template broke a bound
            raise InvalidRequestError(str(e), param="messages",
                                      code="invalid_chat_template") from None
        except ChatTemplateError as e:
            raise InvalidRequestError(str(e), param="messages") from None

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, Any]],
                        tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Token ids of the rendered conversation (BOS once, special tokens parsed)."""
        text = self.apply_chat_template(messages, tools=tools)
        self._check_fits(text, "messages")
        return encode_prompt(self.tokenizer, text)

    def _check_fits(self, text: str, param: str) -> None:
        """Refuse, before tokenizing it, text too long for the context: no token covers
        more bytes of text than the longest token's text, so the byte length bounds the
        token count from below (a 16 MB prompt is refused at once, not after seconds of
        tokenizing and hundreds of MB)."""
        if self._max_token_bytes is None:
            tok = self.tokenizer
            self._max_token_bytes = max(
                4, max(len(tok.token_text(i).encode("utf-8", "surrogatepass"))
                       for i in range(tok.n_vocab)))
        n_bytes = len(text.encode("utf-8", "surrogatepass"))
        if n_bytes > self.n_ctx * self._max_token_bytes:
            at_least = -(-n_bytes // self._max_token_bytes)
            raise InvalidRequestError(
                f"the {param} is at least {at_least} tokens ({n_bytes} bytes), longer than "
                f"the context of {self.n_ctx}", param=param, code="context_length_exceeded")

    def _chat_chunks(self, seq: EngineSequence, texts: Iterator[str], reply: ChatReply,
                     include_usage: bool) -> Iterator[dict[str, Any]]:
        shape = Shapes("chat.completion.chunk", self.model_id)
        try:
            yield shape.chat_chunk({"role": "assistant", "content": ""}, None)
            for piece in texts:
                for delta in reply.feed(piece):
                    yield shape.chat_chunk(delta, None)
        finally:
            texts.close()
        for delta in reply.finish():
            yield shape.chat_chunk(delta, None)
        yield shape.chat_chunk({}, reply.finish_reason(seq.finish_reason), reply.detail())
        if include_usage:
            yield shape.usage_chunk(seq.usage())

    # --- embeddings (engine/embed.py) ---------------------------------------------------------

    def embed(self, input: str | Sequence[int] | Sequence[str | Sequence[int]], *,  # noqa: A002
              pooling: str | None = None, normalize: bool | int = True,
              ) -> list[float] | list[list[float]] | list[list[list[float]]]:
        """Embeddings of ``input`` (a text or token ids: one vector; a list of them: one
        vector each, computed together), as llama.cpp computes them: the final hidden
        states pooled (``pooling``: mean, cls, last or none, default the model's) and
        normalized (True: Euclidean, llama.cpp's default; False: not; an int: llama.cpp's
        ``embd_normalize``). Pooling ``none`` gives one vector per token."""
        single = isinstance(input, str) or _is_ids(input) and bool(input)
        vectors, _ = self._embed([input] if single else list(input), pooling, normalize)
        out = [v.tolist() for v in vectors]
        return out[0] if single else out

    def create_embedding(self, input: str | Sequence[Any], model: str | None = None,  # noqa: A002
                         *, encoding_format: str = "float", pooling: str | None = None,
                         normalize: bool | int = True, cancel: Callable[[], bool] | None = None,
                         **unused: Any) -> dict[str, Any]:
        """An OpenAI ``embeddings`` response (llama-cpp-python's name): ``data`` holds one
        ``{"object": "embedding", "index", "embedding"}`` per input, the vector as floats or
        (``encoding_format="base64"``) as base64 of little-endian float32, as OpenAI sends
        it; ``usage`` counts the tokens. ``cancel``, if given, is polled while the vectors
        are computed: True cancels them (InvalidRequestError, code ``cancelled``)."""
        if encoding_format not in ("float", "base64"):
            raise InvalidRequestError("encoding_format must be 'float' or 'base64', got "
                                      f"{encoding_format!r}", param="encoding_format")
        dims = unused.pop("dimensions", None)
        if unused:
            raise TypeError(f"unexpected argument(s): {', '.join(sorted(unused))}")
        items = [input] if isinstance(input, str) or _is_ids(input) and bool(input) \
            else list(input) if isinstance(input, list | tuple) else [input]
        pooling = self._embed_pooling(pooling)
        if pooling == "none":
            raise InvalidRequestError("pooling 'none' gives a vector per token, which the "
                                      "OpenAI format cannot hold; use LLM.embed",
                                      param="pooling")
        vectors, n_tokens = self._embed(items, pooling, normalize, cancel)
        if dims is not None and dims != self.model.config.n_embd:
            raise InvalidRequestError(f"dimensions: this model's embeddings have "
                                      f"{self.model.config.n_embd}", param="dimensions")
        data = []
        for i, v in enumerate(vectors):
            vec: Any = v.tolist() if encoding_format == "float" else base64.b64encode(
                v.astype("<f4").tobytes()).decode("ascii")
            data.append({"object": "embedding", "index": i, "embedding": vec})
        return {"object": "list", "data": data, "model": model or self.model_id,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}

    def _embed(self, items: list[Any], pooling: str | None, normalize: bool | int,
               cancel: Callable[[], bool] | None = None) -> tuple[list[Any], int]:
        """The vectors of ``items`` (texts or id lists) and their token count, computed
        together, up to one per slot at a time (so that one request of many inputs takes at
        most that share of the queue and the engine, and others go in between)."""
        from .engine.embed import EmbedRequest

        if not items:
            raise InvalidRequestError("input is empty", param="input")
        pooling = self._embed_pooling(pooling)
        if isinstance(normalize, bool):
            norm = 2 if normalize else -1
        elif isinstance(normalize, int) and normalize >= -1:
            norm = normalize
        else:
            raise InvalidRequestError(f"normalize must be True, False or an integer of at "
                                      f"least -1, got {normalize!r}", param="normalize")
        ids_list = []
        for item in items:
            if isinstance(item, str):
                _check_text(item, "input")
                self._check_fits(item, "input")
                ids = self.tokenizer.encode(item, add_special=True, parse_special=True)
            elif _is_ids(item):
                ids = list(item)
            else:
                raise InvalidRequestError("input must be a string, a list of token ids, or "
                                          "a list of them", param="input")
            ids_list.append(ids)
        if self.model.is_encoder:
            return (self._encoder_vectors(ids_list, pooling, norm, cancel or (lambda: False)),
                    sum(len(ids) for ids in ids_list))
        reqs = []
        for ids in ids_list:
            req = self._request(ids, 0, None, None, {})  # the same checks as a prompt's
            reqs.append(EmbedRequest(req.prompt_ids, pooling=pooling, normalize=norm))
        seqs = self._embed_waves(reqs, cancel or (lambda: False))
        for seq in seqs:
            if seq.embedding is None:
                raise RuntimeError(f"embedding failed: {seq.error or seq.finish_reason}")
        return [s.embedding for s in seqs], sum(len(r.prompt_ids) for r in reqs)

    def _require_generator(self) -> None:
        """Refuse generation with an encoder (an embedding model has no next-token head)."""
        if self.model.is_encoder:
            raise InvalidRequestError(
                f"{self.model_id} is an embedding model ({self.model.config.arch} encoder): "
                "it cannot generate text; use embeddings (/v1/embeddings, LLM.embed)",
                param="model", code="model_not_supported")

    def _encoder_vectors(self, ids_list: list[list[int]], pooling: str, norm: int,
                         cancel: Callable[[], bool]) -> list[Any]:
        """An encoder's vectors: every input in batched forwards (in the engine thread, as
        the kernels want one thread), each row's numbers its own whatever its company;
        ``cancel()`` True between two forwards cancels the rest (code ``cancelled``)."""
        from .engine.embed import normalize, pool

        limit = self.model.config.n_ctx_train
        for ids in ids_list:
            bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)
                   or not 0 <= t < self.tokenizer.n_vocab]
            if bad or not ids:
                raise InvalidRequestError(
                    f"token id {bad[0]!r} is outside the vocabulary" if bad else
                    "an input is empty", param="input")
            if len(ids) > limit:
                raise InvalidRequestError(
                    f"an input is {len(ids)} tokens, more than this encoder's {limit} "
                    "positions", param="input", code="context_length_exceeded")
        out: list[Any] = []
        for batch in _token_batches(ids_list, ENCODER_BATCH_TOKENS):
            if cancel():
                raise InvalidRequestError("the request was cancelled", param="input",
                                          code="cancelled")
            hidden = self.engine.call(lambda b=batch: self.model.embed_batch(b))
            out += [normalize(pool(h, pooling), norm) for h in hidden]
        return out

    def _embed_waves(self, reqs: list[Any], cancel: Callable[[], bool]) -> list[Any]:
        """Run ``reqs``, at most ``n_slots`` of them in the engine at once; ``cancel()``
        True cancels them all (InvalidRequestError, code ``cancelled``)."""
        seqs: list[Any] = []
        wave = max(1, self.engine.n_slots)
        try:
            for i, req in enumerate(reqs):
                while i - wave >= 0 and not seqs[i - wave].wait(0.05):
                    if cancel():
                        raise InvalidRequestError("the request was cancelled", param="input",
                                                  code="cancelled")
                try:
                    seqs.append(self.engine.submit(req))
                except ValueError as e:  # QueueFullError is not one: 503 for the server
                    raise InvalidRequestError(str(e), param="input") from None
            for seq in seqs:
                while not seq.wait(0.05):
                    if cancel():
                        raise InvalidRequestError("the request was cancelled",
                                                  param="input", code="cancelled")
        finally:
            for seq in seqs:
                seq.cancel()  # a no-op for those that ended
        return seqs

    @staticmethod
    def _check_pooling(pooling: str) -> str:
        from .engine.embed import POOLINGS

        if pooling not in POOLINGS:
            raise InvalidRequestError(f"pooling must be one of {', '.join(POOLINGS)}, got "
                                      f"{pooling!r}", param="pooling")
        return pooling

    def _embed_pooling(self, pooling: str | None) -> str:
        """A call's pooling: its own, checked, else the LLM's. A reranker's ``rank`` (the
        file's choice, kept because such a model may still generate) cannot embed."""
        if pooling is not None:
            return self._check_pooling(pooling)
        if self.pooling == "rank":
            raise InvalidRequestError(
                "the model's pooling_type is rank: a reranker's scoring head, which gguflm "
                "does not run yet; choose a pooling (mean, cls, last) to embed with its "
                "hidden states anyway", param="pooling")
        return self.pooling

    @staticmethod
    def _default_seed(seed: Any) -> int | None:
        if seed is None or seed == -1 or seed == 0xFFFFFFFF:  # llama.cpp's "random" seeds
            return None
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise InvalidRequestError(f"seed must be in 0..4294967295 (or -1), got {seed!r}",
                                      param="seed")
        return seed

    # --- the rest ----------------------------------------------------------------------------

    def warm_up(self) -> float:
        """Load (or, on a first run, compile) the kernels and touch the weights with a few
        tokens through the model (``Model.warm_up``, decoding and prompt paths both), and
        build the tables made on first use (the tokenizer's merge ranks, the longest
        token's length that bounds a prompt), so that the first real request, or batch of
        them, does not pay for it (about 0.2 s of SmolLM2's tables, 0.3 s of code). Leaves
        the slots' caches alone; returns the seconds it took."""
        t0 = time.perf_counter()
        self.engine.call(lambda: self.model.warm_up(prompts=True))
        self._check_fits("", "prompt")
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


class ChatReply:
    """A chat reply's text as OpenAI deltas and message: plain content, or with tools
    (``plan`` from ``engine.tools.plan_tools``) tool calls parsed out as they stream."""

    def __init__(self, plan: Any = None) -> None:
        self.parser = plan.parser() if plan is not None else None
        self.text: list[str] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        self.text.append(text)
        if self.parser is not None:
            return self.parser.feed(text)
        return [{"content": text}] if text else []

    def finish(self) -> list[dict[str, Any]]:
        return self.parser.finish() if self.parser is not None else []

    def finish_reason(self, reason: str | None) -> str | None:
        if self.parser is None or reason is None:
            return reason
        return self.parser.result().finish_reason(reason)

    def detail(self) -> str | None:
        """Why it ended, when finish_reason alone would mislead (a call cut off)."""
        return self.parser.result().detail() if self.parser is not None else None

    def message(self) -> dict[str, Any]:
        if self.parser is not None:
            return self.parser.result().message()
        return {"role": "assistant", "content": "".join(self.text)}


class Shapes:
    """OpenAI's response objects for one response: ``object`` (``text_completion``,
    ``chat.completion`` or ``chat.completion.chunk``), one id and creation time."""

    def __init__(self, object: str, model_id: str) -> None:  # noqa: A002 - OpenAI's name
        prefix = "cmpl" if object == "text_completion" else "chatcmpl"
        self.head = {"id": _new_id(prefix), "object": object, "created": int(time.time()),
                     "model": model_id}

    def completion_chunk(self, text: str, finish: str | None, index: int = 0
                         ) -> dict[str, Any]:
        return self.head | {"choices": [{"text": text, "index": index, "logprobs": None,
                                         "finish_reason": finish}]}

    def completion_result(self, choices: list[dict[str, Any]], usage: dict[str, Any]
                          ) -> dict[str, Any]:
        return self.head | {"choices": choices, "usage": usage}

    def chat_chunk(self, delta: dict[str, Any], finish: str | None,
                   detail: str | None = None) -> dict[str, Any]:
        return self.head | {"choices": [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish} | _detail(detail)]}

    def chat_result(self, message: dict[str, Any], finish: str | None,
                    usage: dict[str, Any], detail: str | None = None) -> dict[str, Any]:
        return self.head | {"choices": [{"index": 0, "message": message, "logprobs": None,
                                         "finish_reason": finish} | _detail(detail)],
                            "usage": usage}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return self.head | {"choices": [], "usage": usage}


def _detail(detail: str | None) -> dict[str, str]:
    """gguflm's own choice field ``finish_detail``: why finish_reason is what it is, when
    it alone would mislead (OpenAI's clients keep unknown fields: ``choice.model_extra``)."""
    return {"finish_detail": detail} if detail else {}


ENCODER_BATCH_TOKENS = 8192  # tokens per encoder forward: bounds its activations' memory


def _token_batches(ids_list: list[list[int]], limit: int) -> Iterator[list[list[int]]]:
    """Consecutive groups of inputs of at most ``limit`` tokens (an input longer alone)."""
    batch: list[list[int]] = []
    n = 0
    for ids in ids_list:
        if batch and n + len(ids) > limit:
            yield batch
            batch, n = [], 0
        batch.append(ids)
        n += len(ids)
    if batch:
        yield batch


def _is_ids(x: Any) -> bool:
    return (isinstance(x, Sequence) and not isinstance(x, str | bytes)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in x))


def _prompt_list(prompt: Any) -> list[Any]:
    """A prompt, or a list of prompts (strings or id lists), as a list of prompts."""
    if isinstance(prompt, list | tuple) and prompt and all(
            isinstance(p, str) or (_is_ids(p) and not isinstance(p, str)) for p in prompt) \
            and not _is_ids(prompt):
        return list(prompt)
    return [prompt]


def _add_usage(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    if a is None:
        return b
    return {k: _add_usage(a[k], b[k]) if isinstance(b[k], dict) else a[k] + b[k] for k in b}


def _check_text(text: str, param: str) -> None:
    """Refuse text that is not valid Unicode (lone surrogates from JSON escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(f"{param} is not valid Unicode (a lone surrogate at "
                                  f"character {e.start})", param=param) from None


def _text_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages with text-only content lists joined into strings (most templates concatenate
    ``content`` as a string); anything but text parts is refused."""
    try:
        check_messages(messages)
    except ChatTemplateError as e:
        raise InvalidRequestError(str(e), param="messages") from None
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not (isinstance(part, Mapping) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise InvalidRequestError(
                        f"messages[{i}].content[{j}]: only text parts are supported",
                        param="messages")
                texts.append(part["text"])
            m["content"] = "".join(texts)
        elif content is None:
            m["content"] = ""
        if isinstance(m["content"], str):
            _check_text(m["content"], "messages")
        out.append(m)
    return out


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


# llama-cpp-python's Llama() arguments with no meaning here: GPU and memory-mapping choices
# (warned about: the user may expect a GPU), and tuning knobs gguflm sets itself (silent)
# (name: llama-cpp-python's default; only another value is warned about)
_IGNORED_WARN = {"n_gpu_layers": 0, "main_gpu": 0, "tensor_split": None, "split_mode": 1,
                 "use_mlock": False, "use_mmap": True, "flash_attn": False,
                 "offload_kqv": True, "numa": False}
_IGNORED_SILENT = ("n_batch", "n_ubatch", "n_threads_batch", "embedding", "logits_all",
                   "last_n_tokens_size", "type_k", "type_v", "chat_format")


def _check_lookup(value: Any) -> int:
    """A prompt-lookup draft length (engine/lookup.py), as an API error when it is bad."""
    from .engine.lookup import check_lookup

    try:
        return check_lookup(value)
    except ValueError as e:
        raise InvalidRequestError(str(e), param="lookup") from None


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
