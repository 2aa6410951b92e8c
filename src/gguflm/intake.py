"""The intake: a prompt or a conversation and its ``GenerationSpec`` (``engine/spec.py``)
turned into the engine's ``Request``, the one place a spec is checked.

``Intake`` belongs to an ``LLM`` and reads its state (tokenizer, chat template, context size,
the defaults ``serve`` sets) when a request comes: ``completion`` tokenizes a prompt,
``chat`` plans tools, renders the chat template and tokenizes; both compile the constraint
and end in ``request``, which checks the ids, ``max_tokens``, the stops, ``logit_bias``,
``lookup`` and the sampling values. Text too long for the context is refused before it is
tokenized (``check_fits``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .chatformat.thinking import template_variables
from .chatplan import ChatPlan, ChatSetup, Speller, check_budget, check_reasoning_format
from .engine.errors import InvalidRequestError
from .engine.params import sampler_params
from .engine.sequence import Request, check_logit_bias
from .engine.spec import GenerationSpec
from .engine.stops import StopError, check_stops
from .tokenizer.chat import ChatTemplateError, TemplateLimitError, check_messages, encode_prompt

if TYPE_CHECKING:
    from .api import LLM

__all__ = ["Intake", "check_lookup_value", "check_text", "is_ids", "text_messages"]


class Intake:
    """Requests for one ``LLM`` (see the module's docstring)."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self._max_token_bytes: int | None = None  # the longest token's text (check_fits)
        self._format: Any = None  # chat_format()
        self._speller: Speller | None = None
        self._tool_template: Any = None  # template_for()

    def require_generator(self) -> None:
        """Refuse generation with an encoder (an embedding model has no next-token head),
        or with a decoder whose attention is bidirectional (``attention.causal`` false)."""
        if self.llm.model.is_encoder:
            c = self.llm.model.config
            kind = ("encoder" if not self.llm.model.blocks else "decoder with bidirectional "
                    "attention" if not c.causal else "decoder without a next-token head")
            raise InvalidRequestError(
                f"{self.llm.model_id} is an embedding model ({c.arch} {kind}): it cannot "
                "generate text; use embeddings (/v1/embeddings, LLM.embed)",
                param="model", code="model_not_supported")

    def completion(self, prompt: Any, spec: GenerationSpec, echo: bool = False
                           ) -> tuple[Request, str | None]:
        """The engine request for a completion and the prompt's text (for echo)."""
        self.require_generator()
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
            self.check_fits(prompt, "prompt")
            ids = self.llm.tokenizer.encode(prompt, add_special=True, parse_special=True)
            text: str | None = prompt
        elif is_ids(prompt):
            ids = list(prompt)
            text = None
        else:
            raise InvalidRequestError("prompt must be a string or a list of token ids",
                                      param="prompt")
        req = self.request(ids, spec, self.constraint(**spec.constraint))
        if text is None and echo:
            text = self.llm.tokenizer.decode(ids)
        return req, text

    def chat(self, messages: Sequence[Mapping[str, Any]], spec: GenerationSpec
             ) -> tuple[Request, ChatPlan]:
        """The engine request for a conversation and how its reply is read (``chatplan``:
        the tool plan, reasoning and calls in the family's format)."""
        from .engine.tools import plan_tools

        self.require_generator()
        with template_errors():  # the chat format renders the template too
            setup = self.chat_setup(spec)
        template = self.template_for(spec.tools is not None and spec.tool_choice != "none")
        tools = plan_tools(messages, spec.tools, spec.tool_choice, template.source,
                           spec.parallel_tool_calls, setup.native())
        if tools is not None:
            messages, template_tools = tools.messages, tools.template_tools
        else:
            template_tools = None
        with template_errors():
            prompt, tags = setup.tags(text_messages(messages), template_tools)
        g = self.grammar(**spec.constraint)
        forced_call = tools is not None and tools.grammar is not None
        if forced_call:
            if g is not None:
                raise InvalidRequestError("a required tool call cannot be combined with "
                                          "response_format or a grammar", param="tool_choice")
            g = tools.grammar
        if g is not None:
            g = setup.constrained(g, tags, forced_call and tools.format == "native")
        ids = self.chat_ids(messages, tools=template_tools, kwargs=setup.kwargs,
                            template=template)
        req = self.request(ids, spec, None if g is None else self.compile(g))
        req.budget = setup.budget_state(tags, self.llm.tokenizer)
        if tools is not None:
            req.watch = tools.watcher()  # stops a model that repeats a call
        plan = setup.plan(tools, prompt, tags)
        # the family's markers may be control tokens (Harmony's <|channel|>): its parser
        # reads them, so they are text here, as llama-server's preserved tokens are
        req.special = plan.stream is not None
        return req, plan

    def chat_setup(self, spec: GenerationSpec) -> ChatSetup:
        """The request's template variables and reasoning options, over the defaults
        ``serve`` sets (``LLM.chat_defaults``)."""
        d = self.llm.chat_defaults
        kwargs = dict(d.kwargs)
        given = spec.chat.get("chat_template_kwargs") or {}
        if not isinstance(given, Mapping):
            raise InvalidRequestError("chat_template_kwargs must be an object",
                                      param="chat_template_kwargs")
        kwargs.update(given)
        if "think" in spec.chat:
            kwargs["enable_thinking"] = spec.chat["think"]
        if "reasoning_effort" in spec.chat:
            kwargs["reasoning_effort"] = spec.chat["reasoning_effort"]
        rf = check_reasoning_format(spec.chat.get("reasoning_format", d.reasoning_format))
        budget = check_budget(spec.chat.get("reasoning_budget_tokens", d.budget))
        return ChatSetup(self.chat_format(), template_variables(kwargs), rf, budget,
                         self.speller, d.budget_message)

    def chat_format(self) -> Any:
        """The chat format of the model's template (built on first use)."""
        if self._format is None:
            from .chatformat import ChatFormat

            self._format = ChatFormat(self.llm.chat_template)
        return self._format

    def speller(self) -> Speller:
        if self._speller is None:
            self._speller = Speller(self.llm.tokenizer)
        return self._speller

    def template_for(self, tools: bool) -> Any:
        """The template to render with: the file's ``tokenizer.chat_template.tool_use``
        variant when the request offers tools and the file has one (llama.cpp's rule; not
        when a template was given), else the model's."""
        t = self.llm.chat_template
        if not tools or t.name != "tokenizer.chat_template":
            return t
        source = self.llm.model.gguf.metadata.get("tokenizer.chat_template.tool_use")
        if not isinstance(source, str) or not source.strip():
            return t
        if self._tool_template is None:
            from .tokenizer.chat import ChatTemplate

            self._tool_template = ChatTemplate(source, t.special_tokens,
                                               name="tokenizer.chat_template.tool_use")
        return self._tool_template

    def grammar(self, **fields: Any) -> Any:
        """The ``Grammar`` a request's constraint fields ask for (None: free text);
        InvalidRequestError (``param`` set) for an invalid or unsupported schema or
        grammar."""
        if not any(v is not None for v in fields.values()):
            return None
        from .engine.grammar import constraint_from_request

        return constraint_from_request(**fields, tokenizer=self.llm.tokenizer)

    def compile(self, g: Any) -> Any:
        from .engine.constraints import Constraint

        return Constraint(g, self.llm.tokenizer)

    def constraint(self, **fields: Any) -> Any:
        """The ``Constraint`` a request's constraint fields ask for (None: free text)."""
        g = self.grammar(**fields)
        return None if g is None else self.compile(g)

    def request(self, ids: list[int], spec: GenerationSpec, constraint: Any = None
                 ) -> Request:
        """The engine's Request: ``spec`` checked (the one place it is), with ``ids``."""
        from .engine.sampling import SamplingError

        self.require_generator()
        self.check_ids(ids)
        max_tokens = -1 if spec.max_tokens is None else spec.max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < -1:
            raise InvalidRequestError(
                f"max_tokens must be a non-negative integer (or null), got {max_tokens!r}",
                param="max_tokens")
        try:
            stops = check_stops(spec.stop)
        except StopError as e:
            raise InvalidRequestError(str(e), param="stop") from None
        seed = self.llm.seed if spec.seed is None else spec.seed  # Llama(seed=...)'s, if any
        sampling = self.llm.sampling_defaults | spec.sampling
        lookup = self.llm.lookup if spec.lookup is None else check_lookup_value(spec.lookup)
        try:
            bias = check_logit_bias(spec.logit_bias, self.llm.tokenizer.n_vocab)
        except ValueError as e:
            raise InvalidRequestError(str(e), param="logit_bias") from None
        try:
            params = sampler_params(sampling | {"seed": seed})
        except SamplingError as e:
            raise InvalidRequestError(str(e), param=getattr(e, "param", None)) from None
        return Request(ids, params, max_tokens, stops, constraint, lookup, logit_bias=bias)

    def check_ids(self, ids: list[int]) -> None:
        if not ids:
            raise InvalidRequestError("the prompt is empty (and the model adds no BOS token)",
                                      param="prompt")
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)
               or not 0 <= t < self.llm.tokenizer.n_vocab]
        if bad:
            raise InvalidRequestError(f"token id {bad[0]!r} is outside the vocabulary "
                                      f"(0..{self.llm.tokenizer.n_vocab - 1})", param="prompt")
        if len(ids) > self.llm.n_ctx:
            raise InvalidRequestError(
                f"the prompt is {len(ids)} tokens, longer than the context of {self.llm.n_ctx}",
                param="prompt", code="context_length_exceeded")

    def render(self, messages: Sequence[Mapping[str, Any]],
               add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None,
               kwargs: Mapping[str, Any] | None = None, template: Any = None) -> str:
        """The prompt text the chat template (``template``, default the model's) makes of
        ``messages``, with ``kwargs`` as its extra variables."""
        template = template or self.llm.chat_template
        with template_errors():
            return template.render(text_messages(messages), add_generation_prompt,
                                   tools=tools, **dict(kwargs or {}))

    def chat_ids(self, messages: Sequence[Mapping[str, Any]],
                 tools: Sequence[Mapping[str, Any]] | None = None,
                 kwargs: Mapping[str, Any] | None = None, template: Any = None) -> list[int]:
        """Token ids of the rendered conversation (BOS once, special tokens parsed)."""
        text = self.render(messages, tools=tools, kwargs=kwargs, template=template)
        self.check_fits(text, "messages")
        return encode_prompt(self.llm.tokenizer, text)

    def check_fits(self, text: str, param: str) -> None:
        """Refuse, before tokenizing it, text too long for the context: no token covers
        more bytes of text than the longest token's text, so the byte length bounds the
        token count from below (a 16 MB prompt is refused at once, not after seconds of
        tokenizing and hundreds of MB)."""
        if self._max_token_bytes is None:
            tok = self.llm.tokenizer
            self._max_token_bytes = max(
                4, max(len(tok.token_text(i).encode("utf-8", "surrogatepass"))
                       for i in range(tok.n_vocab)))
        n_bytes = len(text.encode("utf-8", "surrogatepass"))
        if n_bytes > self.llm.n_ctx * self._max_token_bytes:
            at_least = -(-n_bytes // self._max_token_bytes)
            raise InvalidRequestError(
                f"the {param} is at least {at_least} tokens ({n_bytes} bytes), longer than "
                f"the context of {self.llm.n_ctx}", param=param, code="context_length_exceeded")


@contextmanager
def template_errors() -> Iterator[None]:
    """A chat template's failure as the API's 400 (``invalid_chat_template`` when an
    untrusted template broke a bound)."""
    try:
        yield
    except TemplateLimitError as e:
        raise InvalidRequestError(str(e), param="messages",
                                  code="invalid_chat_template") from None
    except ChatTemplateError as e:
        raise InvalidRequestError(str(e), param="messages") from None


def check_text(text: str, param: str) -> None:
    """Refuse text that is not valid Unicode (lone surrogates from JSON escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(f"{param} is not valid Unicode (a lone surrogate at "
                                  f"character {e.start})", param=param) from None


def is_ids(x: Any) -> bool:
    return (isinstance(x, Sequence) and not isinstance(x, str | bytes)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in x))


def text_messages(messages: Any) -> list[dict[str, Any]]:
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
            check_text(m["content"], "messages")
        out.append(m)
    return out


def check_lookup_value(value: Any) -> int:
    """A prompt-lookup draft length (engine/lookup.py), as an API error when it is bad."""
    from .engine.lookup import check_lookup

    try:
        return check_lookup(value)
    except ValueError as e:
        raise InvalidRequestError(str(e), param="lookup") from None
