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
from .params import find, rope_parameters, text_parameters
from .vocab import K, base_vocab, check_ids, pre_name, special_vocab

_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_BLOCK = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """HF's rotate-half Q/K rows -> llama.cpp's interleaved pairs: per head, rows
    (0..d/2, d/2..d) become (0, d/2, 1, d/2+1, ...). (llama.cpp's ``LlamaModel.permute``.)"""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    if w.shape[0] % (2 * n_head):
        raise ConvertError(f"{w.shape[0]} rows do not split into {n_head} heads of pairs")
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
        return text_parameters(self.gguf_arch, self.hparams, self.file_type)

    def vocabulary(self) -> list[tuple[str, Any, Any]]:
        if (self.folder / "tokenizer.model").is_file():  # llama.cpp would prefer it
            raise ConvertError("a SentencePiece tokenizer.model is not supported (gguflm "
                               "converts tokenizer.json vocabularies; llama.cpp's converter "
                               "reads this file first, so using tokenizer.json instead would "
                               "make a different file)",
                               path=str(self.folder / "tokenizer.model"))
        tokens, types, _ = base_vocab(self.folder, self.hparams.get("vocab_size"))
        specials = special_vocab(self.folder, len(tokens), load_merges=True)
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

    def parameters(self) -> list[tuple[str, Any, Any]]:
        hp = self.hparams
        keys = super().parameters()
        if not isinstance(hp.get("vocab_size"), int):
            raise ConvertError("config.json has no vocab_size", path=str(self.folder))
        keys.append(("llama.vocab_size", hp["vocab_size"], ValueType.UINT32))
        head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
        keys.append(("llama.rope.dimension_count", head_dim, ValueType.UINT32))
        return keys

    def modify(self, gguf_name: str, data: np.ndarray) -> np.ndarray:
        n_head = find(self.hparams, ["n_heads", "num_attention_heads"])
        n_kv = find(self.hparams, ["n_kv_heads", "num_key_value_heads"])
        if gguf_name.endswith(("attn_q.weight", "attn_q.bias")):
            return permute(data, n_head, n_head)
        if gguf_name.endswith(("attn_k.weight", "attn_k.bias")):
            return permute(data, n_head, n_kv)
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
        hp, a = self.hparams, self.gguf_arch
        keys = {k: (v, t) for k, v, t in super().parameters()}  # later values replace
        theta = rope_parameters(hp)
        theta = theta.get("full_attention", theta).get("rope_theta", 1_000_000.0)
        u32, f32 = ValueType.UINT32, ValueType.FLOAT32
        extra = [(f"{a}.context_length", hp.get("max_position_embeddings", 131072), u32),
                 (f"{a}.attention.head_count", hp.get("num_attention_heads", 8), u32),
                 (f"{a}.attention.layer_norm_rms_epsilon", hp.get("rms_norm_eps", 1e-6), f32),
                 (f"{a}.attention.key_length", hp.get("head_dim", 256), u32),
                 (f"{a}.attention.value_length", hp.get("head_dim", 256), u32),
                 (f"{a}.rope.freq_base", theta, f32)]
        if hp.get("attn_logit_softcapping") is not None:
            raise ConvertError("attn_logit_softcapping is set: not a Gemma 3 config",
                               path=str(self.folder / "config.json"))
        if hp.get("final_logit_softcapping"):
            extra.append((f"{a}.final_logit_softcapping", hp["final_logit_softcapping"], f32))
        if hp.get("sliding_window_pattern") != 1:
            extra.append((f"{a}.attention.sliding_window", hp.get("sliding_window"), u32))
        extra.append((f"{a}.attention.head_count_kv", hp.get("num_key_value_heads", 4), u32))
        for key, value, vtype in extra:
            keys[key] = (value, vtype)
        return [(k, v, t) for k, (v, t) in keys.items()]

    def out_shape(self, gguf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        if gguf_name == "token_embd.weight":
            return (min(shape[0], self._n_vocab_real()), *shape[1:])
        return shape

    def _n_vocab_real(self) -> int:
        """The converter's count: the vocab plus the added tokens (even those it repeats)."""
        from .vocab import read_json

        tj = read_json(self.folder / "tokenizer.json")
        return len(tj.get("model", {}).get("vocab", {})) + len(tj.get("added_tokens", []))

    def modify(self, gguf_name: str, data: np.ndarray) -> np.ndarray:
        if gguf_name == "token_embd.weight":
            data = data[:self._n_vocab_real()]
        if gguf_name.endswith("norm.weight"):  # Gemma3RMSNorm scales by 1 + w
            data = data + np.asarray(1.0, data.dtype)
        return data
