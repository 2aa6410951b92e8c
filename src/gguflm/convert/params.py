"""The hyperparameter keys every text model gets (llama.cpp's ``TextModel.set_gguf_parameters``),
read from ``config.json`` in the converter's order and with its GGUF types."""

from __future__ import annotations

from typing import Any

from ..gguf.types import ArrayType, ValueType
from .errors import ConvertError

U32, F32, BOOL = ValueType.UINT32, ValueType.FLOAT32, ValueType.BOOL
Keys = list[tuple[str, Any, Any]]


def find(hp: dict, names: list[str], optional: bool = True) -> Any:
    """The first of ``names`` present in the config (gguf-py's ``find_hparam``)."""
    for n in names:
        if n in hp:
            return hp[n]
    if optional:
        return None
    raise ConvertError(f"config.json has none of {', '.join(names)}")


def block_count(hp: dict) -> int:
    n = find(hp, ["n_layers", "num_hidden_layers", "n_layer", "num_layers"], optional=False)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= 4096:
        raise ConvertError(f"num_hidden_layers is {n!r}, not a layer count")
    return n


def rope_parameters(hp: dict) -> dict:
    rp = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    theta = find(hp, ["global_rope_theta", "rope_global_theta", "rope_theta_global",
                      "rope_theta", "rotary_emb_base"])
    local = find(hp, ["local_rope_theta", "rope_local_theta", "rope_theta_local",
                      "swa_rope_theta", "rope_local_base_freq"])
    if "full_attention" not in rp and "sliding_attention" not in rp:
        if local is not None:
            rp["sliding_attention"] = {"rope_theta": local}
        if "rope_theta" not in rp and theta is not None:
            rp["rope_theta"] = theta
        if "rope_type" not in rp and rp.get("type") is not None:
            rp["rope_type"] = rp["type"]
        for name in ("partial_rotary_factor", "original_max_position_embeddings"):
            alias = {"partial_rotary_factor": ["partial_rotary_factor", "rope_pct",
                                               "rope_percent"]}.get(name, [name])
            if name not in rp and (v := find(hp, alias)) is not None:
                rp[name] = v
    return rp


def text_parameters(arch: str, hp: dict, file_type: int) -> Keys:
    """``{arch}.*`` keys common to text models, then ``general.file_type``."""
    out: Keys = [(f"{arch}.block_count", block_count(hp), U32)]

    def add(key: str, value: Any, vtype: Any) -> None:
        if value is not None:
            out.append((f"{arch}.{key}", value, vtype))

    add("context_length", find(hp, ["max_position_embeddings", "n_ctx", "n_positions",
                                    "max_length", "max_sequence_length",
                                    "model_max_length"]), U32)
    add("embedding_length", find(hp, ["hidden_size", "n_embd", "dim"]), U32)
    add("feed_forward_length", find(hp, ["prefix_dense_intermediate_size",
                                         "dense_intermediate_size", "intermediate_size",
                                         "n_inner", "hidden_dim"]), U32)
    add("attention.head_count", find(hp, ["num_attention_heads", "n_head", "n_heads"]), U32)
    add("attention.head_count_kv", find(hp, ["num_key_value_heads", "n_kv_heads"]), U32)
    if hp.get("is_causal") is False:
        add("attention.causal", False, BOOL)
    rp = rope_parameters(hp)
    full = rp.get("full_attention", rp)
    if full.get("rope_type") in ("linear", "yarn") and full.get("factor") is not None:
        add("rope.scaling.type", full["rope_type"], ValueType.STRING)
        add("rope.scaling.factor", full["factor"], F32)
        if full["rope_type"] == "yarn":
            add("rope.scaling.original_context_length",
                full.get("original_max_position_embeddings"), U32)
    if "mrope_section" in rp:
        add("rope.dimension_sections", (list(rp["mrope_section"]) + [0] * 4)[:4],
            ArrayType(ValueType.INT32))
    add("rope.freq_base", full.get("rope_theta"), F32)
    add("rope.freq_base_swa", rp.get("sliding_attention", {}).get("rope_theta"), F32)
    add("attention.layer_norm_rms_epsilon", find(hp, ["rms_norm_eps", "norm_eps"]), F32)
    add("attention.layer_norm_epsilon", find(hp, ["layer_norm_eps", "layer_norm_epsilon",
                                                  "norm_epsilon"]), F32)
    add("expert_count", find(hp, ["num_local_experts", "num_experts", "n_routed_experts"]), U32)
    add("expert_used_count", find(hp, ["num_experts_per_tok", "num_experts_per_token",
                                       "top_k_experts"]), U32)
    if (head_dim := hp.get("head_dim")) is not None:
        add("attention.key_length", head_dim, U32)
        add("attention.value_length", head_dim, U32)
    out.append(("general.file_type", file_type, U32))
    return out
