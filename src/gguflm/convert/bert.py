"""``BertModel`` (and its sentence-transformers packaging) -> GGUF ``bert``, as llama.cpp's
``conversion/bert.py`` lays it out: phantom-space WordPiece vocabulary, pooling from the
sentence-transformers ``modules.json``, no pooler or masked-LM head."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..gguf.types import ArrayType, ValueType
from .base import ModelConverter, register
from .errors import ConvertError
from .params import text_parameters
from .vocab import CONTROL, K, base_vocab, check_ids, pre_name, read_json, special_vocab

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
        keys = text_parameters(self.gguf_arch, self.hparams, self.file_type)
        keys.append((f"{self.gguf_arch}.attention.causal", False, ValueType.BOOL))
        if (pooling := self.pooling_type()) is not None:
            keys.append((f"{self.gguf_arch}.pooling_type", pooling, ValueType.UINT32))
        return keys

    def pooling_type(self) -> int | None:
        """From the sentence-transformers Pooling module's config, if there is one."""
        modules = read_json(self.folder / "modules.json", required=False)
        path = next((m.get("path") for m in modules or [] if isinstance(m, dict)
                     and str(m.get("type", "")).endswith("Pooling")), None)
        if not isinstance(path, str):
            return None
        config_path = self.folder / path / "config.json"
        cfg = read_json(config_path)
        for flag, mode in (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"),
                           ("pooling_mode_lasttoken", "lasttoken")):
            if isinstance(cfg, dict) and cfg.get(flag):
                return POOLING[mode]
        if isinstance(cfg, dict) and cfg.get("pooling_mode") in POOLING:
            return POOLING[cfg["pooling_mode"]]
        raise ConvertError("only mean, CLS and last-token pooling are supported",
                           path=str(config_path))

    def vocabulary(self) -> list[tuple[str, Any, Any]]:
        tokens, types, tj = base_vocab(self.folder, self.hparams.get("vocab_size"))
        tokens = [t if ty == CONTROL else t[2:] if t.startswith("##") else "\u2581" + t
                  for t, ty in zip(tokens, types)]
        keys = [(K + "token_type_count", self.hparams.get("type_vocab_size", 1),
                 ValueType.UINT32), (K + "model", "bert", ValueType.STRING)]
        specials = special_vocab(self.folder, len(tokens))
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
    norm = tj.get("normalizer") if isinstance(tj.get("normalizer"), dict) else {}
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

    def __init__(self, folder: Any, hparams: dict, file_type: int) -> None:
        where = str(folder / "config.json")
        if hparams.get("moe_every_n_layers"):
            raise ConvertError("nomic-bert-moe is not supported", path=where)
        for key, want in _NOMIC_CONFIG.items():
            if hparams.get(key, "absent") != want:
                raise ConvertError(f"{key} is {hparams.get(key, 'absent')!r}; the converter "
                                   f"supports {want!r}", path=where)
        npos, mtp = hparams.get("n_positions"), hparams.get("max_trained_positions", 2048)
        if (npos, mtp) not in ((8192, 2048), (2048, 2048)):
            raise ConvertError(f"unrecognized n_positions {npos} / max_trained_positions "
                               f"{mtp}", path=where)
        hparams["n_positions"] = 2048 if npos == 8192 else 512  # what they were trained for
        super().__init__(folder, hparams, file_type)

    def tensor_name(self, name: str) -> str | None:
        if name == "emb_ln.weight" or name == "emb_ln.bias":
            return "token_embd_norm." + name.rpartition(".")[2]
        m = _NOMIC_BLOCK.fullmatch(name)
        if m and m.group(2) in _NOMIC_LAYER and int(m.group(1)) < self.n_layers:
            return f"blk.{m.group(1)}.{_NOMIC_LAYER[m.group(2)]}.{m.group(3)}"
        return super().tensor_name(name)
