"""The Python API: ``gguflm.LLM``, a loaded model you complete text and chat with.

Results are shaped like OpenAI's (and llama-cpp-python's ``create_completion`` /
``create_chat_completion``) so code can switch between them::

    llm = gguflm.LLM("smollm2-135m")
    out = llm.generate("The capital of France is", max_tokens=8, temperature=0)
    out["choices"][0]["text"]
    for chunk in llm.chat([{"role": "user", "content": "Hi"}], stream=True):
        print(chunk["choices"][0]["delta"].get("content", ""), end="")

One ``LLM`` holds one KV cache. Each call reuses the longest prefix of its prompt that is
already cached (a chat's earlier turns, a shared system prompt) and evaluates only the rest;
calls are serialized by a lock, so an ``LLM`` may be shared between threads.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .tokenizer.chat import ChatTemplate, ChatTemplateError, check_messages, encode_prompt

__all__ = ["LLM", "InvalidRequestError"]

# Context when none is given: llama.cpp's default size, capped by the training context.
DEFAULT_N_CTX = 4096

# sampling argument -> SamplerParams field; None means "llama.cpp's default"
_SAMPLING_ARGS = {
    "temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "typical_p": "typical_p", "repeat_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
}


class InvalidRequestError(ValueError):
    """A request the model cannot serve as asked: a bad argument value, a prompt longer than
    the context, a conversation the chat template rejects. ``param`` names the argument;
    ``code`` is OpenAI's error code where it has one (``context_length_exceeded``)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass
class _Request:
    """One prepared generation: validated, tokenized, ready to run."""

    prompt_ids: list[int]
    max_tokens: int  # -1: until the end of the context
    params: Any  # SamplerParams
    stop: list[str]
    prompt_text: str | None = None  # for echo
    # filled in while running
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    text_parts: list[str] = field(default_factory=list)

    def usage(self) -> dict[str, Any]:
        n_prompt = len(self.prompt_ids)
        return {"prompt_tokens": n_prompt, "completion_tokens": self.completion_tokens,
                "total_tokens": n_prompt + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


class StopScanner:
    """Finds stop strings in streamed text. ``feed`` returns the text that is safe to emit
    (held back: any tail that could still grow into a stop string) and whether a stop
    string was found (text from it on is dropped, as OpenAI does)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.hit = False

    def feed(self, text: str) -> str:
        if self.hit:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            self._held = ""
            return buf[:cut]
        keep = 0  # the longest tail of buf that is a proper prefix of some stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        out, self._held = ("" if self.hit else self._held), ""
        return out


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class LLM:
    """A GGUF model loaded for generation: ``generate``/``stream`` complete text, ``chat``
    answers a conversation through the model's chat template, ``tokenize``/``detokenize``.

    ``model`` is a GGUF file or a known model name (pulled on first use). ``n_ctx`` is the
    context size in tokens (default: 4096, at most the training context); ``threads`` the
    kernel threads (default: the cores available); ``chat_template`` a file that replaces
    the model's template (Jinja text or a ``tokenizer_config.json``).
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, *, n_ctx: int | None = None,
                 threads: int | None = None,
                 chat_template: str | os.PathLike[str] | None = None) -> None:
        from . import load_model
        from .hub import DEFAULT_MODEL, KNOWN_MODELS, resolve_model
        from .quant.matrix import set_threads
        from .tokenizer import Tokenizer

        name = os.fspath(model) if model is not None else DEFAULT_MODEL
        self.model_path = resolve_model(name)
        # the id clients see: a known name as given, else the file's name
        self.model_id = name if name in KNOWN_MODELS else self.model_path.name
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InvalidRequestError(f"threads must be a positive integer, got {threads!r}",
                                      param="threads")
        self.threads = set_threads(threads)
        self.model = load_model(self.model_path)
        self.tokenizer = Tokenizer.from_gguf(self.model.gguf)
        n_train = int(self.model.config.n_ctx_train or 0)
        if n_ctx is None:
            n_ctx = min(DEFAULT_N_CTX, n_train) if n_train > 0 else DEFAULT_N_CTX
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
            raise InvalidRequestError(f"n_ctx must be a positive integer, got {n_ctx!r}",
                                      param="n_ctx")
        self.n_ctx = n_ctx
        self.chat_template = ChatTemplate.for_tokenizer(
            self.tokenizer, self.model.gguf.metadata, override=chat_template)
        self._cache = None  # KVCache, made on first use
        self._cached: list[int] = []  # the ids whose keys/values the cache holds
        self._lock = FairLock()  # runs are served in the order they ask
        self._owner: int | None = None  # thread holding the lock (to catch self-deadlock)
        # usage and finish reason of the last run, however it ended (None: not ended)
        self.last_run: dict[str, Any] | None = None

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

    # --- completion --------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int | None = 16,
                 stop: str | Sequence[str] | None = None, seed: int | None = None,
                 echo: bool = False, cancel: Callable[[], bool] | None = None,
                 **sampling: Any) -> dict[str, Any]:
        """Complete ``prompt`` (text, or token ids) and return an OpenAI ``text_completion``.

        ``max_tokens``: at most this many tokens (None or -1: until an end-of-generation
        token or the end of the context). ``stop``: strings that end the text (not included).
        Sampling: ``temperature`` (0: greedy), ``top_p``, ``top_k``, ``min_p``,
        ``typical_p``, ``repeat_penalty``, ``presence_penalty``, ``frequency_penalty`` and
        ``seed``; what is not given takes llama.cpp's default. ``echo`` puts the prompt
        before the completion. ``cancel``, if given, is polled between tokens: True ends
        the generation there.
        """
        req = self._completion_request(prompt, max_tokens, stop, seed, echo, sampling)
        text = "".join(self._pieces(req, cancel))
        if echo and req.prompt_text is not None:
            text = req.prompt_text + text
        return {
            "id": _new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
            "model": self.model_id,
            "choices": [{"text": text, "index": 0, "logprobs": None,
                         "finish_reason": req.finish_reason}],
            "usage": req.usage(),
        }

    def stream(self, prompt: str | Sequence[int], *, max_tokens: int | None = 16,
               stop: str | Sequence[str] | None = None, seed: int | None = None,
               echo: bool = False, include_usage: bool = False,
               cancel: Callable[[], bool] | None = None,
               **sampling: Any) -> Iterator[dict[str, Any]]:
        """Like ``generate``, as OpenAI ``text_completion`` chunks: one per piece of text,
        then one with the ``finish_reason`` (and with ``include_usage``, a last chunk with
        ``usage`` and no choices). The arguments are checked before this returns.
        ``cancel``, if given, is polled between tokens: True ends the generation."""
        req = self._completion_request(prompt, max_tokens, stop, seed, echo, sampling)
        return self._completion_chunks(req, echo, include_usage, cancel)

    def create_completion(self, prompt: str | Sequence[int], *, stream: bool = False,
                          **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's name: ``stream`` picks ``stream`` or ``generate``."""
        return self.stream(prompt, **kwargs) if stream else self.generate(prompt, **kwargs)

    __call__ = create_completion

    def _completion_chunks(self, req: _Request, echo: bool, include_usage: bool,
                           cancel: Callable[[], bool] | None) -> Iterator[dict[str, Any]]:
        cid, created = _new_id("cmpl"), int(time.time())

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            return {"id": cid, "object": "text_completion", "created": created,
                    "model": self.model_id,
                    "choices": [{"text": text, "index": 0, "logprobs": None,
                                 "finish_reason": finish}]}

        if echo and req.prompt_text:
            yield chunk(req.prompt_text, None)
        for piece in self._pieces(req, cancel):
            yield chunk(piece, None)
        yield chunk("", req.finish_reason)
        if include_usage:
            yield {"id": cid, "object": "text_completion", "created": created,
                   "model": self.model_id, "choices": [], "usage": req.usage()}

    # --- chat --------------------------------------------------------------------------------

    def chat(self, messages: Sequence[Mapping[str, Any]], *, stream: bool = False,
             max_tokens: int | None = None, stop: str | Sequence[str] | None = None,
             seed: int | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
             include_usage: bool = False, cancel: Callable[[], bool] | None = None,
             **sampling: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Answer a conversation (OpenAI ``messages``: dicts with ``role`` and ``content``).

        Returns a ``chat.completion``, or with ``stream`` an iterator of
        ``chat.completion.chunk`` (role first, then content pieces, then the finish reason).
        The prompt is the model's chat template rendered with ``add_generation_prompt``;
        ``tools`` is passed to the template. Other arguments as in ``generate``
        (``max_tokens`` default: until the model ends its turn or the context is full).
        """
        req = self._request(self.chat_prompt_ids(messages, tools=tools), max_tokens, stop,
                            seed, sampling)
        if stream:
            return self._chat_chunks(req, include_usage, cancel)
        text = "".join(self._pieces(req, cancel))
        return {
            "id": _new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
            "model": self.model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": req.finish_reason}],
            "usage": req.usage(),
        }

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
        except ChatTemplateError as e:
            raise InvalidRequestError(str(e), param="messages") from None

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, Any]],
                        tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Token ids of the rendered conversation (BOS once, special tokens parsed)."""
        return encode_prompt(self.tokenizer, self.apply_chat_template(messages, tools=tools))

    def _chat_chunks(self, req: _Request, include_usage: bool,
                     cancel: Callable[[], bool] | None) -> Iterator[dict[str, Any]]:
        cid, created = _new_id("chatcmpl"), int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": self.model_id,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish}]}

        yield chunk({"role": "assistant", "content": ""}, None)
        for piece in self._pieces(req, cancel):
            yield chunk({"content": piece}, None)
        yield chunk({}, req.finish_reason)
        if include_usage:
            yield {"id": cid, "object": "chat.completion.chunk", "created": created,
                   "model": self.model_id, "choices": [], "usage": req.usage()}

    # --- the shared machinery ----------------------------------------------------------------

    def _completion_request(self, prompt: Any, max_tokens: Any, stop: Any, seed: Any,
                            echo: bool, sampling: dict[str, Any]) -> _Request:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special=True, parse_special=True)
            text = prompt
        elif (isinstance(prompt, Sequence) and not isinstance(prompt, bytes)
              and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.tokenizer.n_vocab]
            if bad:
                raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary "
                                          f"(0..{self.tokenizer.n_vocab - 1})", param="prompt")
            text = self.tokenizer.decode(ids) if echo else None
        else:
            raise InvalidRequestError("prompt must be a string or a list of token ids",
                                      param="prompt")
        req = self._request(ids, max_tokens, stop, seed, sampling)
        req.prompt_text = text
        return req

    def _request(self, ids: list[int], max_tokens: Any, stop: Any, seed: Any,
                 sampling: dict[str, Any]) -> _Request:
        from .engine.sampling import SamplerParams, SamplingError

        if not ids:
            raise InvalidRequestError("the prompt is empty (and the model adds no BOS token)",
                                      param="prompt")
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
        if stop is None:
            stops: list[str] = []
        elif isinstance(stop, str):
            stops = [stop]
        elif isinstance(stop, Sequence) and all(isinstance(s, str) for s in stop):
            stops = list(stop)
        else:
            raise InvalidRequestError("stop must be a string or a list of strings",
                                      param="stop")
        unknown = set(sampling) - set(_SAMPLING_ARGS)
        if unknown:
            raise TypeError(f"unexpected argument(s): {', '.join(sorted(unknown))}")
        given = {_SAMPLING_ARGS[k]: v for k, v in sampling.items() if v is not None}
        if seed is not None and seed != -1:  # -1: a random seed, as in llama.cpp
            given["seed"] = seed
        try:
            params = SamplerParams(**given)
        except SamplingError as e:
            name = str(e).split(" ", 1)[0]
            arg = {v: k for k, v in _SAMPLING_ARGS.items()}.get(name, name)
            raise InvalidRequestError(str(e).replace(name, arg, 1), param=arg) from None
        return _Request(ids, max_tokens, params, stops)

    def _pieces(self, req: _Request,
                cancel: Callable[[], bool] | None = None) -> Iterator[str]:
        """Run ``req``: text pieces as they are generated (stop strings cut out); fills in
        the request's counts and finish reason. Holds the model for the whole run."""
        from .engine.generate import generate
        from .engine.sampling import Sampler
        from .quant.matrix import set_threads

        with self._hold():
            if cancel is not None and cancel():  # e.g. the client left while it waited
                req.finish_reason = "cancelled"
                return
            set_threads(self.threads)  # numba's thread count is per calling thread
            if self._cache is None:
                self._cache = self.model.new_cache(self.n_ctx)
            cache = self._cache
            prompt = req.prompt_ids
            # reuse what is cached of this prompt, but evaluate at least its last token
            req.cached_tokens = min(common_prefix(self._cached, prompt), len(prompt) - 1)
            gen = generate(self.model, prompt, Sampler(req.params), max_tokens=req.max_tokens,
                           eog_ids=self.tokenizer.eog_ids, cache=cache,
                           n_reuse=req.cached_tokens)
            self._cached = []  # unknown until the run ends (or is interrupted)
            decoder = self.tokenizer.decoder(special=False)
            scanner = StopScanner(req.stop)
            try:
                for token in gen:
                    if token in gen.eog_ids:
                        continue  # the end-of-turn marker is not part of the text
                    out = scanner.feed(decoder.feed(token))
                    if out:
                        yield out
                    if scanner.hit:
                        req.finish_reason = "stop"
                        return
                    if cancel is not None and cancel():
                        req.finish_reason = "cancelled"
                        return
                out = scanner.feed(decoder.flush())
                out += scanner.flush()
                if out:
                    yield out
                req.finish_reason = "stop" if gen.stop == "eos" or scanner.hit else "length"
            finally:
                req.completion_tokens = len(gen.tokens)
                self._cached = (prompt + gen.tokens)[:cache.n]
                self.last_run = req.usage() | {"finish_reason": req.finish_reason}

    def warm_up(self) -> float:
        """Load (or, on a first run, compile) the kernels and touch the weights with one
        token through the model, so that the first real request does not pay for it.
        Leaves the context alone; returns the seconds it took."""
        from .quant.matrix import set_threads

        t0 = time.perf_counter()
        with self._hold():
            set_threads(self.threads)
            token = self.tokenizer.bos_id if self.tokenizer.bos_id is not None else 0
            self.model.forward([token], self.model.new_cache(1))
        return time.perf_counter() - t0

    def _hold(self) -> _Held:
        return _Held(self)

    def reset(self) -> None:
        """Forget the cached context (the next call evaluates its whole prompt)."""
        with self._hold():
            self._cached = []
            if self._cache is not None:
                self._cache.clear()

    def close(self) -> None:
        """Release the model file (the LLM is unusable afterwards)."""
        self._cache = None
        self.model.gguf.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LLM({self.model_id!r}, n_ctx={self.n_ctx}, threads={self.threads})"


class FairLock:
    """A lock granted in the order it was asked for (first come, first served), so queued
    requests are answered in turn; ``threading.Lock`` lets any waiter win."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiters: deque[threading.Event] = deque()
        self._held = False

    def acquire(self) -> None:
        with self._mutex:
            if not self._held:
                self._held = True
                return
            turn = threading.Event()
            self._waiters.append(turn)
        try:
            turn.wait()  # release() hands the lock over by setting it
        except BaseException:  # interrupted while waiting: leave the queue cleanly
            with self._mutex:
                if turn in self._waiters:
                    self._waiters.remove(turn)
                    raise
            self.release()  # it was handed over in the meantime: pass it on
            raise

    def release(self) -> None:
        with self._mutex:
            if not self._held:
                raise RuntimeError("release of an unlocked FairLock")
            if self._waiters:
                self._waiters.popleft().set()  # stays held, by the next in line
            else:
                self._held = False

    def locked(self) -> bool:
        return self._held

    @property
    def n_waiting(self) -> int:
        return len(self._waiters)


class _Held:
    """The model lock, refusing the deadlock of one thread starting a second run while its
    own stream is still open."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm

    def __enter__(self) -> None:
        me = threading.get_ident()
        if self.llm._owner == me:
            raise RuntimeError("this thread's previous stream from this LLM is still open: "
                               "finish it or close() it first")
        self.llm._lock.acquire()
        self.llm._owner = me

    def __exit__(self, *exc: object) -> None:
        self.llm._owner = None
        self.llm._lock.release()


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
        out.append(m)
    return out


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"
