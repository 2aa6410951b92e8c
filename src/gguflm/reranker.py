"""Reranking for an ``LLM``: how relevant each document is to a query, as llama-server's
``/v1/rerank`` scores it, for models with a scoring head (``model/classifier.py``):
BERT-family cross-encoders and Qwen3-Reranker-style decoders.

Each (query, document) pair becomes one sequence (llama.cpp's ``format_prompt_rerank``):
with a ``tokenizer.chat_template.rerank`` template in the file, the template with
``{query}`` then ``{document}`` replaced, tokenized with special tokens parsed (so special
token text inside the query or a document is parsed too, as llama.cpp does); otherwise
``[BOS] query [EOS] [SEP] document [EOS]``, each special where the vocabulary adds it
(``add_bos``/``add_eos``/``add_sep``; SEP stands in for a missing EOS), query and document
tokenized as plain text. The sequences run through the embeddings' path (``Embedder``:
an encoder's batched forwards, a decoder's engine slots), pooled as the head asks, and the
head gives each its score alone, so a score never depends on the other documents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .engine.errors import InvalidRequestError
from .intake import check_text

if TYPE_CHECKING:
    from .api import LLM

__all__ = ["MAX_DOCUMENTS", "Reranker"]

MAX_DOCUMENTS = 1000  # documents per request (Cohere's limit): bounds one request's work
TEMPLATE_KEY = "tokenizer.chat_template.rerank"  # llama_model_chat_template(model, "rerank")
# the classifier's pooling as the embeddings' path names it
POOLING = {"first": "cls", "last": "last", "mean": "mean"}


class Reranker:
    """The reranking of one ``LLM`` (its model's head, tokenizer and embeddings path)."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm

    def head(self) -> Any:
        """The model's scoring head, or an InvalidRequestError saying why there is none."""
        head = self.llm.model.classifier
        if head is None:
            raise InvalidRequestError(
                f"model {self.llm.model_id!r} is not a reranker: its pooling is "
                f"{self.llm.pooling} and it has no classifier head (cls / cls.output "
                "tensors, pooling_type rank)", param="model", code="model_not_reranker")
        return head

    def input_ids(self, query: str, document: str) -> list[int]:
        """The token ids of one (query, document) pair (see the module docstring)."""
        tok = self.llm.tokenizer
        template = self.llm.model.gguf.metadata.get(TEMPLATE_KEY)
        if isinstance(template, str):
            text = template.replace("{query}", query).replace("{document}", document)
            return tok.encode(text, add_special=False, parse_special=True)
        v = tok.vocab
        bos, eos, sep = v.special.get("bos"), v.special.get("eos"), v.special.get("sep")
        eos = sep if eos is None else eos
        if v.add_bos and bos is None or v.add_eos and eos is None or v.add_sep and sep is None:
            raise InvalidRequestError("the vocabulary lacks the BOS, EOS or SEP token its "
                                      "reranking input needs", param="model")
        ids = [bos] if v.add_bos else []
        ids += tok.encode(query, add_special=False)
        ids += [eos] if v.add_eos else []
        ids += [sep] if v.add_sep else []
        ids += tok.encode(document, add_special=False)
        return ids + ([eos] if v.add_eos else [])

    def scores(self, query: str, documents: Sequence[str],
               cancel: Callable[[], bool] | None = None) -> tuple[list[float], int]:
        """Each document's relevance score to ``query`` and the tokens evaluated."""
        head = self.head()
        check_documents(query, documents)
        model = self.llm.model
        limit = model.config.n_ctx_train if model.is_encoder else self.llm.n_ctx
        ids = []
        for i, doc in enumerate(documents):
            self.llm.intake.check_fits(query + doc, "documents")
            ids.append(self.input_ids(query, doc))
            if len(ids[-1]) > limit:
                raise InvalidRequestError(
                    f"documents[{i}] with the query is {len(ids[-1])} tokens, more than the "
                    f"model's {limit}", param="documents", code="context_length_exceeded")
        # attention in float32 over the f16 cache: within 1e-3 of llama.cpp's scores with
        # flash attention on or off, where the flash rounding alone moved them 2e-3
        hidden, n_tokens = self.llm.embedder.vectors(ids, POOLING[head.pooling], -1, cancel,
                                                     flash_attn=False)
        # the head's products are kernels too: they run in the engine thread, between steps
        return self.llm.engine.call(lambda: [head.score(h) for h in hidden]), n_tokens

    def rerank(self, query: str, documents: Sequence[Any], top_n: int | None = None, *,
               return_documents: bool = False, model: str | None = None,
               cancel: Callable[[], bool] | None = None) -> dict[str, Any]:
        """llama-server's (Jina's, Cohere's) rerank response: ``results`` ``[{"index",
        "relevance_score"}]`` best first (ties keep the documents' order), the first
        ``top_n``; with ``return_documents`` each also has ``document: {"text"}``.
        Documents are strings or ``{"text": ...}`` objects."""
        texts = document_texts(documents)
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                                  or top_n < 0):
            raise InvalidRequestError(f"top_n must be a non-negative integer, got {top_n!r}",
                                      param="top_n")
        scores, n_tokens = self.scores(query, texts, cancel)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        results = []
        for i in order[:len(order) if top_n is None else top_n]:
            item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
            if return_documents:
                item["document"] = {"text": texts[i]}
            results.append(item)
        return {"object": "list", "model": model or self.llm.model_id, "results": results,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def document_texts(documents: Any) -> list[str]:
    """The documents' texts: a list of strings or of ``{"text": str}`` objects."""
    if not isinstance(documents, list | tuple):
        raise InvalidRequestError("documents must be a list of strings", param="documents")
    texts = []
    for i, doc in enumerate(documents):
        if isinstance(doc, dict) and isinstance(doc.get("text"), str):
            doc = doc["text"]
        if not isinstance(doc, str):
            raise InvalidRequestError(f"documents[{i}] must be a string or an object with "
                                      "a string 'text'", param="documents")
        texts.append(doc)
    return texts


def check_documents(query: Any, documents: Sequence[Any]) -> None:
    """The query is a string; documents are 1..MAX_DOCUMENTS valid strings."""
    if not isinstance(query, str):
        raise InvalidRequestError("query must be a string", param="query")
    check_text(query, "query")
    if not documents:
        raise InvalidRequestError("documents must be a non-empty list", param="documents")
    if len(documents) > MAX_DOCUMENTS:
        raise InvalidRequestError(f"{len(documents)} documents: at most {MAX_DOCUMENTS} a "
                                  "request", param="documents")
    for doc in documents:
        check_text(doc, "documents")
