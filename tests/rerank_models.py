"""Tiny random-weight rerankers in the layouts llama.cpp's converter writes, made the same
byte for byte on every run (fixed seeds, float32 weights), so that a test can remake them
where it needs them and compare with the scores llama.cpp gave for the same files.

- ``make_bert_reranker``: a BERT cross-encoder (bge-reranker / ms-marco-MiniLM layout):
  ``bert`` with ``pooling_type`` 4 (rank), ``cls.weight``/``cls.bias`` (dense + tanh) and
  ``cls.output.weight``/``cls.output.bias`` (one output), with all-MiniLM-L6-v2's WordPiece
  vocabulary (``[CLS] query [SEP] document [SEP]``).
- ``make_qwen3_reranker``: a Qwen3-Reranker: ``qwen3`` with ``pooling_type`` 4,
  ``classifier.output_labels`` ["yes", "no"], ``cls.output.weight`` (2 x n_embd) beside the
  LM head, and the converter's ``tokenizer.chat_template.rerank`` prompt, with the reference
  data's Qwen2 BPE vocabulary cut to 3003 tokens (from tiny-qwen3-yarn).

Used by tests/api_server/test_rerank.py, benchmarks/make_rerankers.py (which records llama.cpp's
scores) and benchmarks/bench_rerank.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from gguflm.gguf.reader import open as open_gguf
from gguflm.gguf.types import ArrayType, GGMLType, ValueType
from gguflm.gguf.writer import GGUFWriter

# Qwen3-Reranker's prompt as llama.cpp's converter (conversion/qwen.py) writes it
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
    "Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"."
    "<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant "
    "passages that answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")

F32_TABLES = ("position_embd.weight", "token_types.weight")
U32, F32, BOOL, STR = ValueType.UINT32, ValueType.FLOAT32, ValueType.BOOL, ValueType.STRING


def _tokenizer_keys(source: str | Path) -> list[tuple[str, Any, Any]]:
    """Every ``tokenizer.*`` key of ``source`` with its exact type (the chat template
    left out: a reranker has its own)."""
    f = open_gguf(source)
    return [(k, f.metadata[k], f.types[k]) for k in f.metadata
            if k.startswith("tokenizer.") and k != "tokenizer.chat_template"]


def _matrix(rng: np.random.Generator, rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
    return rng.standard_normal((rows, cols)) * (scale / math.sqrt(cols))


def _write(path: str | Path, meta: list[tuple[str, Any, Any]], tensors: dict[str, np.ndarray],
           dtype: GGMLType) -> Path:
    w = GGUFWriter(path)
    for key, value, vtype in meta:
        w.add(key, value, vtype)
    for name, arr in tensors.items():
        # 1-D tensors (norms, biases) and BERT's position and token-type tables stay
        # float32, as llama.cpp's converter keeps them
        half = dtype == GGMLType.F16 and arr.ndim == 2 and name not in F32_TABLES
        w.add_tensor(name, arr.astype(np.float16 if half else np.float32))
    return w.write()


def make_bert_reranker(path: str | Path, vocab_source: str | Path, *, n_layer: int = 2,
                       n_embd: int = 64, n_head: int = 4, n_ff: int = 128, n_ctx: int = 512,
                       seed: int = 0, dtype: GGMLType = GGMLType.F32, head: bool = True
                       ) -> Path:
    """A BERT cross-encoder with random weights (``seed``) and the WordPiece vocabulary of
    ``vocab_source`` (a bert GGUF such as all-MiniLM-L6-v2's); ``head`` False: the same
    encoder without the classifier, an embedding model (pooling mean)."""
    rng = np.random.default_rng(seed)
    vocab = _tokenizer_keys(vocab_source)
    n_vocab = len(next(v for k, v, _ in vocab if k == "tokenizer.ggml.tokens"))
    d = n_embd
    t: dict[str, np.ndarray] = {
        "token_embd.weight": rng.standard_normal((n_vocab, d)),
        "position_embd.weight": rng.standard_normal((n_ctx, d)) * 0.3,
        "token_types.weight": rng.standard_normal((2, d)) * 0.3,
        "token_embd_norm.weight": 1 + 0.1 * rng.standard_normal(d),
        "token_embd_norm.bias": 0.1 * rng.standard_normal(d)}
    for i in range(n_layer):
        for name, (rows, cols) in (("attn_q", (d, d)), ("attn_k", (d, d)), ("attn_v", (d, d)),
                                   ("attn_output", (d, d)), ("ffn_up", (n_ff, d)),
                                   ("ffn_down", (d, n_ff))):
            t[f"blk.{i}.{name}.weight"] = _matrix(rng, rows, cols)
            t[f"blk.{i}.{name}.bias"] = 0.1 * rng.standard_normal(rows)
        for name in ("attn_output_norm", "layer_output_norm"):
            t[f"blk.{i}.{name}.weight"] = 1 + 0.1 * rng.standard_normal(d)
            t[f"blk.{i}.{name}.bias"] = 0.1 * rng.standard_normal(d)
    if head:
        t["cls.weight"] = _matrix(rng, d, d, 2.0)
        t["cls.bias"] = 0.1 * rng.standard_normal(d)
        t["cls.output.weight"] = _matrix(rng, 1, d, 2.0)
        t["cls.output.bias"] = np.array([1.0])
    meta = [("general.architecture", "bert", STR), ("general.name", "tiny-bert-reranker", STR),
            ("bert.block_count", n_layer, U32), ("bert.context_length", n_ctx, U32),
            ("bert.embedding_length", d, U32), ("bert.feed_forward_length", n_ff, U32),
            ("bert.attention.head_count", n_head, U32),
            ("bert.attention.layer_norm_epsilon", 1e-12, F32),
            ("bert.attention.causal", False, BOOL), ("bert.pooling_type", 4 if head else 1, U32),
            ("general.file_type", 0 if dtype == GGMLType.F32 else 1, U32), *vocab]
    return _write(path, meta, t, dtype)


def make_qwen3_reranker(path: str | Path, vocab_source: str | Path, *, n_layer: int = 2,
                        n_embd: int = 128, n_head: int = 4, n_head_kv: int = 2,
                        head_dim: int = 32, n_ff: int = 256, n_ctx: int = 4096, seed: int = 0,
                        dtype: GGMLType = GGMLType.F32) -> Path:
    """A Qwen3-Reranker with random weights (``seed``) and the BPE vocabulary of
    ``vocab_source`` (a qwen2-vocabulary GGUF such as the reference's tiny-qwen3-yarn)."""
    rng = np.random.default_rng(seed)
    vocab = _tokenizer_keys(vocab_source)
    n_vocab = len(next(v for k, v, _ in vocab if k == "tokenizer.ggml.tokens"))
    d, q, kv = n_embd, n_head * head_dim, n_head_kv * head_dim
    t: dict[str, np.ndarray] = {"token_embd.weight": rng.standard_normal((n_vocab, d)) * 0.5}
    for i in range(n_layer):
        t[f"blk.{i}.attn_norm.weight"] = 1 + 0.1 * rng.standard_normal(d)
        for name, (rows, cols) in (("attn_q", (q, d)), ("attn_k", (kv, d)), ("attn_v", (kv, d)),
                                   ("attn_output", (d, q)), ("ffn_gate", (n_ff, d)),
                                   ("ffn_up", (n_ff, d)), ("ffn_down", (d, n_ff))):
            t[f"blk.{i}.{name}.weight"] = _matrix(rng, rows, cols)
        t[f"blk.{i}.attn_q_norm.weight"] = 1 + 0.1 * rng.standard_normal(head_dim)
        t[f"blk.{i}.attn_k_norm.weight"] = 1 + 0.1 * rng.standard_normal(head_dim)
        t[f"blk.{i}.ffn_norm.weight"] = 1 + 0.1 * rng.standard_normal(d)
    t["output_norm.weight"] = 1 + 0.1 * rng.standard_normal(d)
    t["output.weight"] = _matrix(rng, n_vocab, d)
    t["cls.output.weight"] = _matrix(rng, 2, d)  # the LM head's "yes" and "no" rows
    meta = [("general.architecture", "qwen3", STR), ("general.name", "tiny-qwen3-reranker", STR),
            ("qwen3.block_count", n_layer, U32), ("qwen3.context_length", n_ctx, U32),
            ("qwen3.embedding_length", d, U32), ("qwen3.feed_forward_length", n_ff, U32),
            ("qwen3.attention.head_count", n_head, U32),
            ("qwen3.attention.head_count_kv", n_head_kv, U32),
            ("qwen3.rope.freq_base", 1e6, F32),
            ("qwen3.attention.layer_norm_rms_epsilon", 1e-6, F32),
            ("qwen3.attention.key_length", head_dim, U32),
            ("qwen3.attention.value_length", head_dim, U32),
            ("qwen3.pooling_type", 4, U32),
            ("qwen3.classifier.output_labels", ["yes", "no"], ArrayType(STR)),
            ("general.file_type", 0 if dtype == GGMLType.F32 else 1, U32), *vocab,
            ("tokenizer.chat_template.rerank", QWEN3_RERANK_TEMPLATE, STR),
            ("tokenizer.chat_templates", ["rerank"], ArrayType(STR))]
    return _write(path, meta, t, dtype)
