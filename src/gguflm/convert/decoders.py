"""Decoder families -> GGUF, as llama.cpp's converter lays them out: ``LlamaForCausalLM``
(``llama``, with the Q/K row permutation llama.cpp's RoPE expects), ``Qwen2ForCausalLM`` and
``Qwen3ForCausalLM`` (``qwen2``/``qwen3``, no permutation), ``Gemma3ForCausalLM``
(``gemma3``: RMSNorm weights stored as 1 + w, the embedding cut to the tokenizer's size).
Vocabulary: byte-level BPE from ``tokenizer.json`` (the converter's ``_set_vocab_gpt2``); a
SentencePiece ``tokenizer.model`` is not read (it needs protobuf parsing gguflm does not
have) and is refused by name.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..gguf.types import ArrayType, ValueType
from .base import ModelConverter, register
from .errors import ConvertError
from .params import EMBED, HEADS, rope_parameters, text_parameters
from .vocab import (
    K,
    base_vocab,
    check_ids,
    n_vocab_real,
    pre_name,
    special_vocab,
    tokenizer_errors,
)

_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_BLOCK = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half Q/K rows -> llama.cpp's interleaved pairs: per head, rows
    (0..d/2, d/2..d) become (0, d/2, 1, d/2+1, ...). (llama.cpp's ``LlamaModel.permute``;
    ``LlamaConverter.out_shape`` has checked that the rows split so.)"""
    if w.ndim == 0 or w.shape[0] % (2 * n_head):
        raise ConvertError(f"its {w.shape[0] if w.ndim else 0} rows do not split into "
                           f"{n_head} heads of pairs")  # (the caller names the tensor)
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


class DecoderConverter(ModelConverter):
    layer_names: dict[str, str] = _LAYER

    def tensor_name(self, name: str) -> str | None:
        name = name.replace("language_model.", "")  # the converter's generic filter
        stem, _, suffix = name.rpartition(".")
        if stem in _GLOBAL and suffix in ("weight", "bias"):
            return f"{_GLOBAL[stem]}.{suffix}"
        m = _BLOCK.fullmatch(name)
        if m and m.group(2) in self.layer_names and int(m.group(1)) < self.n_layers:
            return f"blk.{m.group(1)}.{self.layer_names[m.group(2)]}.{m.group(3)}"
        return self.unmapped(name)

    def parameters(self) -> list[tuple[str, Any, Any]]:
        return text_parameters(self.gguf_arch, self.config, self.file_type)

    def vocabulary(self) -> list[tuple[str, Any, Any]]:
        if (self.folder / "tokenizer.model").is_file():  # llama.cpp would prefer it
            raise ConvertError("a SentencePiece tokenizer.model is not supported (gguflm "
                               "converts tokenizer.json vocabularies; llama.cpp's converter "
                               "reads this file first, so using tokenizer.json instead would "
                               "make a different file)",
                               path=str(self.folder / "tokenizer.model"))
        tokens, types, _ = base_vocab(self.folder, self.config.get("vocab_size"))
        specials = special_vocab(self.folder, len(tokens), load_merges=True)
        with tokenizer_errors(self.folder):
            pre = _bpe_pre(tokens, types, specials, self.folder)
        return [(K + "model", "gpt2", ValueType.STRING), (K + "pre", pre, ValueType.STRING),
                (K + "tokens", tokens, ArrayType(ValueType.STRING)),
                (K + "token_type", np.asarray(types, np.int32), ArrayType(ValueType.INT32)),
                *specials]


def _bpe_pre(tokens: list[str], types: list[int], specials: list, folder: Any) -> str:
    """The pre-tokenizer whose encoding of the check text hashes to a known entry: what the
    converter finds by running the checkpoint's own tokenizer. (The vocabulary is loaded
    once; each candidate only swaps its pre-tokenizer.)"""
    from dataclasses import replace

    from ..tokenizer import Tokenizer
    from ..tokenizer.pretokenize import PRE_NAMES
    from ..tokenizer.vocab import load_vocab
    from .pretok_hashes import PRE_BY_HASH

    meta: dict[str, Any] = {K + "model": "gpt2", K + "tokens": tokens, K + "token_type": types}
    meta.update({k: v for k, v, _ in specials})
    vocab = load_vocab(meta)
    for name in dict.fromkeys(n for n in PRE_BY_HASH.values() if n in PRE_NAMES):
        pre = PRE_NAMES[name]
        tok = Tokenizer(replace(vocab, pre=pre, pre_name=name, clean_spaces=pre.clean_spaces,
                                escape_whitespaces=pre.escape_whitespaces))
        try:
            return pre_name(check_ids(tok), folder / "tokenizer.json")
        except ConvertError:
            continue
    return pre_name(check_ids(Tokenizer(vocab)), folder / "tokenizer.json")


@register("LlamaForCausalLM", "MistralForCausalLM")
class LlamaConverter(DecoderConverter):
    gguf_arch = "llama"

    def __init__(self, folder: Any, config: Any, file_type: int) -> None:
        super().__init__(folder, config, file_type)
        config.find(HEADS, optional=False)  # the Q/K permutation splits rows by it

    def parameters(self) -> list[tuple[str, Any, Any]]:
        config = self.config
        keys = super().parameters()
        keys.append(("llama.vocab_size", config.find(["vocab_size"], optional=False),
                     ValueType.UINT32))
        head_dim = config.get("head_dim") or \
            config.find(EMBED, optional=False) // config.find(HEADS, optional=False)
        keys.append(("llama.rope.dimension_count", head_dim, ValueType.UINT32))
        return keys

    def _permuted_heads(self, gguf_name: str) -> tuple[int, str] | None:
        """The heads the Q/K permutation splits this tensor's rows into, and the key that
        says so (the converter's lookups: Q by the heads, K by the key/value heads)."""
        heads_keys, kv_keys = ["n_heads", "num_attention_heads"], ["n_kv_heads",
                                                                   "num_key_value_heads"]
        if not gguf_name.endswith((".attn_q.weight", ".attn_q.bias", ".attn_k.weight",
                                   ".attn_k.bias")):
            return None
        if ".attn_k." in gguf_name and self.config.find(kv_keys) is not None:
            return self.config.find(kv_keys), self.config.which(kv_keys)
        return self.config.find(heads_keys, optional=False), self.config.which(heads_keys)

    def out_shape(self, gguf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        if (split := self._permuted_heads(gguf_name)) is not None:
            heads, key = split
            if not shape or shape[0] % (2 * heads):
                raise self.config.error(f"its {shape[0] if shape else 0} rows do not split "
                                        f"into {heads} heads of pairs (the Q/K permutation)",
                                        key)
        return shape

    def modify(self, gguf_name: str, data: np.ndarray) -> np.ndarray:
        if (split := self._permuted_heads(gguf_name)) is not None:
            return permute(data, split[0])
        return data


@register("Qwen2ForCausalLM")
class Qwen2Converter(DecoderConverter):
    gguf_arch = "qwen2"


@register("Qwen3ForCausalLM")
class Qwen3Converter(DecoderConverter):
    gguf_arch = "qwen3"


@register("Gemma3ForCausalLM")
class Gemma3Converter(DecoderConverter):
    """llama.cpp's ``Gemma3Model`` (text only; a SentencePiece ``tokenizer.model`` is refused
    by the shared vocabulary step, so this is its ``tokenizer.json`` branch)."""

    gguf_arch = "gemma3"
    layer_names = {**_LAYER, "post_attention_layernorm": "post_attention_norm",
                   "pre_feedforward_layernorm": "ffn_norm",
                   "post_feedforward_layernorm": "post_ffw_norm"}

    def parameters(self) -> list[tuple[str, Any, Any]]:
        config, a = self.config, self.gguf_arch
        keys = {k: (v, t) for k, v, t in super().parameters()}  # later values replace
        rp = rope_parameters(config)
        full = rp["full_attention"] if rp.get("full_attention") is not None else rp
        theta = 1_000_000.0 if full.get("rope_theta") is None else full["rope_theta"]
        u32, f32 = ValueType.UINT32, ValueType.FLOAT32
        extra = [(f"{a}.context_length", config.get("max_position_embeddings", 131072), u32),
                 (f"{a}.attention.head_count", config.get("num_attention_heads", 8), u32),
                 (f"{a}.attention.layer_norm_rms_epsilon", config.get("rms_norm_eps", 1e-6),
                  f32),
                 (f"{a}.attention.key_length", config.get("head_dim", 256), u32),
                 (f"{a}.attention.value_length", config.get("head_dim", 256), u32),
                 (f"{a}.rope.freq_base", theta, f32)]
        if config.get("attn_logit_softcapping") is not None:
            raise config.error("set: not a Gemma 3 config", "attn_logit_softcapping")
        if config.get("final_logit_softcapping"):
            extra.append((f"{a}.final_logit_softcapping",
                          config.get("final_logit_softcapping"), f32))
        if config.get("sliding_window_pattern") != 1:
            extra.append((f"{a}.attention.sliding_window",
                          config.find(["sliding_window"], optional=False), u32))
        extra.append((f"{a}.attention.head_count_kv", config.get("num_key_value_heads", 4),
                      u32))
        for key, value, vtype in extra:
            keys[key] = (value, vtype)
        return [(k, v, t) for k, (v, t) in keys.items()]

    def out_shape(self, gguf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        if gguf_name == "token_embd.weight" and shape:
            return (min(shape[0], n_vocab_real(self.folder)), *shape[1:])
        return shape

    def modify(self, gguf_name: str, data: np.ndarray) -> np.ndarray:
        if gguf_name == "token_embd.weight" and data.ndim:
            data = data[:n_vocab_real(self.folder)]
        if gguf_name.endswith("norm.weight"):  # Gemma3RMSNorm scales by 1 + w
            data = data + np.asarray(1.0, data.dtype)
        return data
