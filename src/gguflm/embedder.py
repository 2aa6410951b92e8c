"""Embeddings for an ``LLM``: OpenAI's ``embeddings`` object and plain vectors, from an
encoder (BERT: batched forwards in the engine thread) or a decoder (through the engine's
slots, each input its own sequence), as llama.cpp pools and normalizes them
(``engine/embed.py``).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .engine.errors import InvalidRequestError
from .engine.spec import GenerationSpec
from .intake import check_text, is_ids

if TYPE_CHECKING:
    from .api import LLM

__all__ = ["ENCODER_BATCH_TOKENS", "Embedder", "token_batches"]

ENCODER_BATCH_TOKENS = 8192  # tokens per encoder forward: bounds its activations' memory


class Embedder:
    """The embeddings of one ``LLM`` (its model, tokenizer, engine and pooling)."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm

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
        items = [input] if isinstance(input, str) or is_ids(input) and bool(input) \
            else list(input) if isinstance(input, list | tuple) else [input]
        pooling = self.pooling_of(pooling)
        if pooling == "none":
            raise InvalidRequestError("pooling 'none' gives a vector per token, which the "
                                      "OpenAI format cannot hold; use LLM.embed",
                                      param="pooling")
        vectors, n_tokens = self.vectors(items, pooling, normalize, cancel)
        if dims is not None and dims != self.llm.model.config.n_embd:
            raise InvalidRequestError(f"dimensions: this model's embeddings have "
                                      f"{self.llm.model.config.n_embd}", param="dimensions")
        data = []
        for i, v in enumerate(vectors):
            vec: Any = v.tolist() if encoding_format == "float" else base64.b64encode(
                v.astype("<f4").tobytes()).decode("ascii")
            data.append({"object": "embedding", "index": i, "embedding": vec})
        return {"object": "list", "data": data, "model": model or self.llm.model_id,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}

    def vectors(self, items: list[Any], pooling: str | None, normalize: bool | int,
               cancel: Callable[[], bool] | None = None, *, flash_attn: bool = True
               ) -> tuple[list[Any], int]:
        """The vectors of ``items`` (texts or id lists) and their token count, computed
        together, up to one per slot at a time (so that one request of many inputs takes at
        most that share of the queue and the engine, and others go in between).
        ``flash_attn``: a decoder's attention as llama.cpp's CPU flash attention rounds it
        (``EmbedRequest``), else in float32 over the f16 cache."""
        from .engine.embed import EmbedRequest

        if not items:
            raise InvalidRequestError("input is empty", param="input")
        pooling = self.pooling_of(pooling)
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
                check_text(item, "input")
                self.llm.intake.check_fits(item, "input")
                ids = self.llm.tokenizer.encode(item, add_special=True, parse_special=True)
            elif is_ids(item):
                ids = list(item)
            else:
                raise InvalidRequestError("input must be a string, a list of token ids, or "
                                          "a list of them", param="input")
            ids_list.append(ids)
        if self.llm.model.is_encoder:
            return (self._encoder_vectors(ids_list, pooling, norm, cancel or (lambda: False)),
                    sum(len(ids) for ids in ids_list))
        reqs = []
        for ids in ids_list:
            req = self.llm.intake.request(ids, GenerationSpec(max_tokens=0))  # a prompt's checks
            reqs.append(EmbedRequest(req.prompt_ids, pooling=pooling, normalize=norm,
                                     flash_attn=flash_attn))
        seqs = self._waves(reqs, cancel or (lambda: False))
        for seq in seqs:
            if seq.embedding is None:
                raise RuntimeError(f"embedding failed: {seq.error or seq.finish_reason}")
        return [s.embedding for s in seqs], sum(len(r.prompt_ids) for r in reqs)

    def _encoder_vectors(self, ids_list: list[list[int]], pooling: str, norm: int,
                         cancel: Callable[[], bool]) -> list[Any]:
        """An encoder's vectors: every input in batched forwards (in the engine thread, as
        the kernels want one thread), each row's numbers its own whatever its company;
        ``cancel()`` True between two forwards cancels the rest (code ``cancelled``)."""
        from .engine.embed import normalize, pool

        limit = self.llm.model.config.n_ctx_train
        for ids in ids_list:
            bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)
                   or not 0 <= t < self.llm.tokenizer.n_vocab]
            if bad or not ids:
                raise InvalidRequestError(
                    f"token id {bad[0]!r} is outside the vocabulary" if bad else
                    "an input is empty", param="input")
            if len(ids) > limit:
                raise InvalidRequestError(
                    f"an input is {len(ids)} tokens, more than this encoder's {limit} "
                    "positions", param="input", code="context_length_exceeded")
        out: list[Any] = []
        for batch in token_batches(ids_list, ENCODER_BATCH_TOKENS):
            if cancel():
                raise InvalidRequestError("the request was cancelled", param="input",
                                          code="cancelled")
            hidden = self.llm.engine.encode(batch)
            out += [normalize(pool(h, pooling), norm) for h in hidden]
        return out

    def _waves(self, reqs: list[Any], cancel: Callable[[], bool]) -> list[Any]:
        """Run ``reqs``, at most ``n_slots`` of them in the engine at once; ``cancel()``
        True cancels them all (InvalidRequestError, code ``cancelled``)."""
        seqs: list[Any] = []
        wave = max(1, self.llm.engine.n_slots)
        try:
            for i, req in enumerate(reqs):
                while i - wave >= 0 and not seqs[i - wave].wait(0.05):
                    if cancel():
                        raise InvalidRequestError("the request was cancelled", param="input",
                                                  code="cancelled")
                try:
                    seqs.append(self.llm.engine.submit(req))
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
    def check_pooling(pooling: str) -> str:
        from .engine.embed import POOLINGS

        if pooling not in POOLINGS:
            raise InvalidRequestError(f"pooling must be one of {', '.join(POOLINGS)}, got "
                                      f"{pooling!r}", param="pooling")
        return pooling

    def pooling_of(self, pooling: str | None) -> str:
        """A call's pooling: its own, checked, else the LLM's. A reranker's ``rank`` (the
        file's choice, kept because such a model may still generate) scores (``rerank``)
        but does not embed."""
        if pooling is not None:
            return self.check_pooling(pooling)
        if self.llm.pooling == "rank":
            raise InvalidRequestError(
                "the model's pooling_type is rank: a reranker, which scores documents "
                "(LLM.rerank, /v1/rerank); choose a pooling (mean, cls, last) to embed with "
                "its hidden states anyway", param="pooling")
        return self.llm.pooling


def token_batches(ids_list: list[list[int]], limit: int) -> Iterator[list[list[int]]]:
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
