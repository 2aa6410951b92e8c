"""``config.json`` and the hyperparameter keys every text model gets (llama.cpp's
``TextModel.set_gguf_parameters``), in the converter's order and with its GGUF types.

Every value is read through ``Config``, which checks it against ``CONFIG_KEYS`` (its kind
and range) when it is read: a hostile config gets one error naming ``config.json`` and the
key. Counts written as U32 are integers that fit it, floats written as F32 are finite and
fit float32, nested objects are objects. ``check_attention`` adds the checks between keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..gguf.types import ArrayType, ValueType
from .errors import ConvertError
from .files import check
from .schema import (
    I32_MAX,
    U32_MAX,
    Anything,
    Flag,
    Int,
    Kind,
    ListOf,
    Obj,
    Real,
    Text,
)

U32, F32, BOOL = ValueType.UINT32, ValueType.FLOAT32, ValueType.BOOL
Keys = list[tuple[str, Any, Any]]
MAX_LAYERS = 4096
MAX_VOCAB = 1 << 20  # tokens; the largest real vocabularies have about 262k (Gemma 3)

# the names the converter tries for one hyperparameter, in its order (find_hparam's lists)
LAYERS = ["n_layers", "num_hidden_layers", "n_layer", "num_layers"]
CONTEXT = ["max_position_embeddings", "n_ctx", "n_positions", "max_length",
           "max_sequence_length", "model_max_length"]
EMBED = ["hidden_size", "n_embd", "dim"]
FFN = ["prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size",
       "n_inner", "hidden_dim"]
HEADS = ["num_attention_heads", "n_head", "n_heads"]
KV_HEADS = ["num_key_value_heads", "n_kv_heads"]
THETA = ["global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
         "rotary_emb_base"]
LOCAL_THETA = ["local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
               "rope_local_base_freq"]
ROTARY_FRACTION = ["partial_rotary_factor", "rope_pct", "rope_percent"]
RMS_EPS = ["rms_norm_eps", "norm_eps"]
LN_EPS = ["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"]
EXPERTS = ["num_local_experts", "num_experts", "n_routed_experts"]
EXPERTS_USED = ["num_experts_per_tok", "num_experts_per_token", "top_k_experts"]

COUNT = Int(1, U32_MAX)  # a size written as U32 that cannot be zero
THETA_KIND = Real(0.0, open_lo=True)  # a RoPE base, written as F32
_ROPE_FIELDS: dict[str, Kind | str] = {
    "rope_type": Text(), "type": Text(), "factor": Real(0.0, open_lo=True),
    "original_max_position_embeddings": COUNT, "rope_theta": THETA_KIND,
    "partial_rotary_factor": Real(0.0, 1.0, open_lo=True),
    "mrope_section": ListOf(Int(0, I32_MAX), max_len=4)}
ROPE = Obj({**_ROPE_FIELDS, "full_attention": Obj(_ROPE_FIELDS),
            "sliding_attention": Obj(_ROPE_FIELDS)})

CONFIG_KEYS: dict[str, Kind] = {
    **dict.fromkeys(LAYERS, Int(1, MAX_LAYERS)),
    **dict.fromkeys(CONTEXT, COUNT),
    **dict.fromkeys(EMBED, COUNT),
    **dict.fromkeys(FFN, COUNT),
    **dict.fromkeys(HEADS, COUNT),
    **dict.fromkeys(KV_HEADS, COUNT),
    **dict.fromkeys(THETA + LOCAL_THETA, THETA_KIND),
    **dict.fromkeys(ROTARY_FRACTION, Real(0.0, 1.0, open_lo=True)),
    **dict.fromkeys(RMS_EPS + LN_EPS, Real(0.0)),
    **dict.fromkeys(EXPERTS + EXPERTS_USED, Int(0, U32_MAX)),
    "original_max_position_embeddings": COUNT,
    "rope_parameters": ROPE, "rope_scaling": ROPE,
    "architectures": ListOf(Text(), min_len=1),
    "text_config": Obj({}),
    "_name_or_path": Text(),
    "head_dim": COUNT,
    "vocab_size": Int(1, MAX_VOCAB),
    "is_causal": Flag(),
    "type_vocab_size": Int(0, U32_MAX),
    "sliding_window": COUNT,
    "sliding_window_pattern": Int(0, U32_MAX),
    "final_logit_softcapping": Real(0.0),
    "attn_logit_softcapping": Anything(),  # only "is it set" is asked
    "moe_every_n_layers": Int(0, U32_MAX),
    "max_trained_positions": COUNT,
    # nomic-bert's fixed settings: compared with the one value the converter supports
    **dict.fromkeys(["activation_function", "causal", "qkv_proj_bias", "mlp_fc1_bias",
                     "mlp_fc2_bias", "prenorm", "rotary_emb_fraction",
                     "rotary_emb_interleaved", "rotary_emb_scale_base"], Anything()),
}


class Config:
    """``config.json``'s values (a multimodal ``text_config`` merged over the top level, as
    the converter does), each checked against ``CONFIG_KEYS`` when it is read."""

    def __init__(self, data: Any, path: Path) -> None:
        if not isinstance(data, dict):
            raise ConvertError("expected a JSON object", path=str(path))
        self.path = path
        self._data = dict(data)
        self._spelled: dict[str, str] = {}  # key -> where in the file it came from
        text = self.get("text_config")
        if text is not None:
            self._data.update(text)
            self._spelled.update((k, f"text_config.{k}") for k in text)

    def has(self, name: str) -> bool:
        return name in self._data

    def get(self, name: str, default: Any = None) -> Any:
        """The value of ``name`` (``default`` when absent or null), checked."""
        value = self._data.get(name)
        if value is None:
            return default
        check(value, CONFIG_KEYS[name], self.path, self._spelled.get(name, name))
        return value

    def find(self, names: list[str], optional: bool = True) -> Any:
        """The first of ``names`` present in the config (gguf-py's ``find_hparam``)."""
        name = self.which(names)
        value = None if name is None else self.get(name)
        if value is not None or optional:
            return value
        raise self.error("missing: the converter needs it" if len(names) == 1 else
                         "missing: the converter needs one of these", name or "/".join(names))

    def which(self, names: list[str]) -> str | None:
        """The first of ``names`` present (its value may be null)."""
        return next((n for n in names if n in self._data), None)

    def set(self, name: str, value: Any) -> None:
        self._data[name] = value

    def error(self, reason: str, name: str) -> ConvertError:
        return ConvertError(reason, path=str(self.path), key=self._spelled.get(name, name))


def block_count(config: Config) -> int:
    return config.find(LAYERS, optional=False)


def check_attention(config: Config) -> None:
    """What must hold between the attention sizes: the key/value heads divide the heads,
    and without a ``head_dim`` the heads divide the embedding."""
    heads, kv = config.find(HEADS), config.find(KV_HEADS)
    if heads is not None and kv is not None and heads % kv:
        raise config.error(f"{kv} key/value heads do not divide {config.which(HEADS)} "
                           f"{heads}", config.which(KV_HEADS))
    embed = config.find(EMBED)
    if config.get("head_dim") is None and heads is not None and embed is not None \
            and embed % heads:
        raise config.error(f"{config.which(EMBED)} {embed} does not split into {heads} heads "
                           "(and there is no head_dim)", config.which(HEADS))


def rope_parameters(config: Config) -> dict:
    """RoPE settings in transformers' newer ``rope_parameters`` form (checked)."""
    rp = dict(config.find(["rope_parameters", "rope_scaling"]) or {})
    theta, local = config.find(THETA), config.find(LOCAL_THETA)
    if "full_attention" not in rp and "sliding_attention" not in rp:
        if local is not None:
            rp["sliding_attention"] = {"rope_theta": local}
        if rp.get("rope_theta") is None and theta is not None:
            rp["rope_theta"] = theta
        if rp.get("rope_type") is None and rp.get("type") is not None:
            rp["rope_type"] = rp["type"]
        if rp.get("partial_rotary_factor") is None and \
                (v := config.find(ROTARY_FRACTION)) is not None:
            rp["partial_rotary_factor"] = v
        if rp.get("original_max_position_embeddings") is None and \
                (v := config.get("original_max_position_embeddings")) is not None:
            rp["original_max_position_embeddings"] = v
    return rp


def text_parameters(arch: str, config: Config, file_type: int) -> Keys:
    """``{arch}.*`` keys common to text models, then ``general.file_type``."""
    out: Keys = [(f"{arch}.block_count", block_count(config), U32)]

    def add(key: str, value: Any, vtype: Any) -> None:
        if value is not None:
            out.append((f"{arch}.{key}", value, vtype))

    add("context_length", config.find(CONTEXT), U32)
    add("embedding_length", config.find(EMBED), U32)
    add("feed_forward_length", config.find(FFN), U32)
    add("attention.head_count", config.find(HEADS), U32)
    add("attention.head_count_kv", config.find(KV_HEADS), U32)
    if config.get("is_causal") is False:
        add("attention.causal", False, BOOL)
    rp = rope_parameters(config)
    full = rp["full_attention"] if rp.get("full_attention") is not None else rp
    if full.get("rope_type") in ("linear", "yarn") and full.get("factor") is not None:
        add("rope.scaling.type", full["rope_type"], ValueType.STRING)
        add("rope.scaling.factor", full["factor"], F32)
        if full["rope_type"] == "yarn":
            add("rope.scaling.original_context_length",
                full.get("original_max_position_embeddings"), U32)
    if rp.get("mrope_section") is not None:
        add("rope.dimension_sections", (list(rp["mrope_section"]) + [0] * 4)[:4],
            ArrayType(ValueType.INT32))
    add("rope.freq_base", full.get("rope_theta"), F32)
    add("rope.freq_base_swa", (rp.get("sliding_attention") or {}).get("rope_theta"), F32)
    add("attention.layer_norm_rms_epsilon", config.find(RMS_EPS), F32)
    add("attention.layer_norm_epsilon", config.find(LN_EPS), F32)
    add("expert_count", config.find(EXPERTS), U32)
    add("expert_used_count", config.find(EXPERTS_USED), U32)
    if (head_dim := config.get("head_dim")) is not None:
        add("attention.key_length", head_dim, U32)
        add("attention.value_length", head_dim, U32)
    out.append(("general.file_type", file_type, U32))
    return out
