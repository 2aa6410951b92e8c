"""``BertModel`` (and its sentence-transformers packaging) -> GGUF ``bert``, as llama.cpp's
``conversion/bert.py`` lays it out: phantom-space WordPiece vocabulary, pooling from the
sentence-transformers ``modules.json``, no pooler or masked-LM head."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ..gguf.types import ArrayType, ValueType
from .base import ModelConverter, register
from .errors import ConvertError
from .files import read_json
from .params import Config, text_parameters
from .schema import Flag, ListOf, Obj, Text, show
from .vocab import (
    CONTROL,
    K,
    base_vocab,
    check_ids,
    pre_name,
    special_vocab,
    tokenizer_errors,
)

POOLING = {"mean": 1, "cls": 2, "lasttoken": 3}  # llama.cpp's enum llama_pooling_type
_LAYER = {
    "attention.self.query": "attn_q", "attention.self.key": "attn_k",
    "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm", "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm",
}
_GLOBAL = {
    "embeddings.word_embeddings": "token_embd", "embeddings.token_type_embeddings": "token_types",
    "embeddings.position_embeddings": "position_embd", "embeddings.LayerNorm": "token_embd_norm",
}
_DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
_BLOCK = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
# what is read of sentence-transformers' files (schema.py)
MODULES_JSON = ListOf(Obj({"type": Text(), "path": Text()}))
_POOLING_FLAGS = (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"),
                  ("pooling_mode_lasttoken", "lasttoken"))
POOLING_CONFIG = Obj({**{flag: Flag() for flag, _ in _POOLING_FLAGS}, "pooling_mode": Text()})


@register("BertModel", "BertForMaskedLM", "CamembertModel")
class BertConverter(ModelConverter):
    gguf_arch = "bert"

    def tensor_name(self, name: str) -> str | None:
        name = name.removeprefix("bert.")
        if name.endswith(".gamma"):
            name = name[:-6] + ".weight"
        if name.endswith(".beta"):
            name = name[:-5] + ".bias"
        if name in _DROPPED or name.startswith(("cls.predictions", "cls.seq_relationship")):
            return None
        stem, _, suffix = name.rpartition(".")
        if stem in _GLOBAL and suffix in ("weight", "bias"):
            return f"{_GLOBAL[stem]}.{suffix}"
        m = _BLOCK.fullmatch(name)
        if m and m.group(2) in _LAYER and int(m.group(1)) < self.n_layers:
            return f"blk.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"
        return self.unmapped(name)

    def forced_f32(self, gguf_name: str) -> bool:
        return gguf_name in ("position_embd.weight", "token_types.weight")

    def parameters(self) -> list[tuple[str, Any, Any]]:
        keys = text_parameters(self.gguf_arch, self.config, self.file_type)
        keys.append((f"{self.gguf_arch}.attention.causal", False, ValueType.BOOL))
        if (pooling := self.pooling_type()) is not None:
            keys.append((f"{self.gguf_arch}.pooling_type", pooling, ValueType.UINT32))
        return keys

    def pooling_type(self) -> int | None:
        """From the sentence-transformers Pooling module's config, if there is one."""
        modules_path = self.folder / "modules.json"
        modules = read_json(modules_path, required=False, schema=MODULES_JSON) or []
        i, path = next(((i, m.get("path")) for i, m in enumerate(modules)
                        if (m.get("type") or "").endswith("Pooling")), (0, None))
        if path is None:
            return None
        if Path(path).is_absolute() or ".." in Path(path).parts:
            raise ConvertError(f"{path!r} is not a folder inside the checkpoint",
                               path=str(modules_path), key=f"[{i}].path")
        config_path = self.folder / path / "config.json"
        cfg = read_json(config_path, schema=POOLING_CONFIG)
        for flag, mode in _POOLING_FLAGS:
            if cfg.get(flag):
                return POOLING[mode]
        if cfg.get("pooling_mode") in POOLING:
            return POOLING[cfg["pooling_mode"]]
        raise ConvertError("only mean, CLS and last-token pooling are supported",
                           path=str(config_path))

    def vocabulary(self) -> list[tuple[str, Any, Any]]:
        tokens, types, tj = base_vocab(self.folder, self.config.get("vocab_size"))
        tokens = [t if ty == CONTROL else t[2:] if t.startswith("##") else "\u2581" + t
                  for t, ty in zip(tokens, types)]
        keys = [(K + "token_type_count", self.config.get("type_vocab_size", 1),
                 ValueType.UINT32), (K + "model", "bert", ValueType.STRING)]
        specials = special_vocab(self.folder, len(tokens))
        with tokenizer_errors(self.folder):
            pre = pre_name(check_ids(_wordpiece(tokens, types, specials, tj)),
                           self.folder / "tokenizer.json")
        keys += [(K + "pre", pre, ValueType.STRING),
                 (K + "tokens", tokens, ArrayType(ValueType.STRING)),
                 (K + "token_type", np.asarray(types, np.int32), ArrayType(ValueType.INT32))]
        return keys + specials


def _wordpiece(tokens: list[str], types: list[int], specials: list, tj: dict) -> Any:
    """Our WordPiece tokenizer on these keys: it encodes the check text as Hugging Face's
    BertTokenizer does, which is what the converter hashes."""
    from ..tokenizer import Tokenizer

    meta: dict[str, Any] = {K + "model": "bert", K + "tokens": tokens, K + "token_type": types}
    meta.update({k: v for k, v, _ in specials})
    norm = tj.get("normalizer") or {}
    if norm.get("type") == "BertNormalizer":
        meta[K + "normalizer.lowercase"] = bool(norm.get("lowercase", True))
        if norm.get("strip_accents") is not None:
            meta[K + "normalizer.strip_accents"] = bool(norm["strip_accents"])
    return Tokenizer.from_metadata(meta)


_NOMIC_LAYER = {"attn.Wqkv": "attn_qkv", "attn.out_proj": "attn_output",
                "norm1": "attn_output_norm", "mlp.fc11": "ffn_up", "mlp.fc12": "ffn_gate",
                "mlp.fc2": "ffn_down", "norm2": "layer_output_norm"}
_NOMIC_BLOCK = re.compile(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)")
# what llama.cpp's converter asserts of a (non-MoE) nomic-bert config
_NOMIC_CONFIG = {"activation_function": "swiglu", "causal": False, "qkv_proj_bias": False,
                 "mlp_fc1_bias": False, "mlp_fc2_bias": False, "prenorm": False,
                 "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
                 "rotary_emb_scale_base": None}


@register("NomicBertModel")
class NomicBertConverter(BertConverter):
    """nomic-embed-text v1/v1.5 -> ``nomic-bert`` (llama.cpp's ``NomicBertModel``; the MoE
    v2 and XLM-RoBERTa vocabularies are not supported)."""

    gguf_arch = "nomic-bert"

    def __init__(self, folder: Any, config: Config, file_type: int) -> None:
        if config.get("moe_every_n_layers"):
            raise config.error("set: nomic-bert-moe is not supported", "moe_every_n_layers")
        for key, want in _NOMIC_CONFIG.items():
            got = config.get(key) if config.has(key) else "absent"
            if got != want:
                raise config.error(f"is {show(got)}; the converter supports {want!r}", key)
        npos, mtp = config.get("n_positions"), config.get("max_trained_positions", 2048)
        if (npos, mtp) not in ((8192, 2048), (2048, 2048)):
            raise config.error(f"unrecognized n_positions {npos} / max_trained_positions "
                               f"{mtp}", "n_positions")
        config.set("n_positions", 2048 if npos == 8192 else 512)  # what they were trained for
        super().__init__(folder, config, file_type)

    def tensor_name(self, name: str) -> str | None:
        if name == "emb_ln.weight" or name == "emb_ln.bias":
            return "token_embd_norm." + name.rpartition(".")[2]
        m = _NOMIC_BLOCK.fullmatch(name)
        if m and m.group(2) in _NOMIC_LAYER and int(m.group(1)) < self.n_layers:
            return f"blk.{m.group(1)}.{_NOMIC_LAYER[m.group(2)]}.{m.group(3)}"
        return super().tensor_name(name)
