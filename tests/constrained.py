"""Constrained generation on the real models, for test_constraints.py and test_tools.py.

A ``Chat`` holds one model, its tokenizer and chat template, and one KV cache that every run
reuses up to the prompt it shares with the previous run (the chat template's system prefix,
the same prompt at a second temperature), as ``LLM`` does; that keeps the many short runs
of the schema matrix quick.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguflm import load_model
from gguflm.engine.constraints import ConstrainedSampler, Constraint, Grammar
from gguflm.engine.generate import generate
from gguflm.engine.sampling import Sampler, SamplerParams
from gguflm.tokenizer import Tokenizer
from gguflm.tokenizer.chat import ChatTemplate, encode_prompt

N_CTX = 1024
SEED = 1234


@dataclass
class Run:
    ids: list[int]
    text: str  # without the final end-of-generation token
    stop: str  # "eos" or "length"
    constraint: Constraint | None


class Chat:
    def __init__(self, path: Path) -> None:
        self.model = load_model(path)
        self.tokenizer = Tokenizer.from_gguf(self.model.gguf)
        self.template = ChatTemplate.for_tokenizer(self.tokenizer, self.model.gguf.metadata)
        self.cache = self.model.new_cache(N_CTX)
        self.cached: list[int] = []  # what the cache holds

    def prompt(self, messages: list[dict[str, Any]], template: ChatTemplate | None = None,
               tools: list[dict[str, Any]] | None = None) -> list[int]:
        text = (template or self.template).render(messages, tools=tools)
        return encode_prompt(self.tokenizer, text)

    def ask(self, user: str) -> list[int]:
        return self.prompt([{"role": "user", "content": user}])

    def run(self, prompt: list[int], grammar: Grammar | None, temp: float = 0.0,
            max_tokens: int = 64, **params: Any) -> Run:
        sampler: Any = Sampler(SamplerParams(temp=temp, seed=SEED, **params))
        constraint = Constraint(grammar, self.tokenizer) if grammar is not None else None
        if constraint is not None:
            sampler = ConstrainedSampler(sampler, constraint)
        reuse = 0
        for a, b in zip(self.cached, prompt):
            if a != b:
                break
            reuse += 1
        gen = generate(self.model, prompt, sampler, max_tokens=max_tokens,
                       eog_ids=self.tokenizer.eog_ids, cache=self.cache, n_reuse=reuse)
        ids = list(gen)
        self.cached = (prompt + ids)[:self.cache.n]
        body = ids[:-1] if gen.stop == "eos" else ids
        return Run(ids, self.tokenizer.decode(body), gen.stop, constraint)
