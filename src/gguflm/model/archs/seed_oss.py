"""Seed-OSS (``general.architecture`` = ``seed_oss``: Seed-OSS-36B), as llama.cpp's
src/models/seed-oss.cpp runs it.

Pre-norm blocks: x += attn(rmsnorm(x)); x += ffn(rmsnorm(x)), grouped-query attention
with Q/K/V biases (where the file has them, added before RoPE), RoPE in NEOX style, a
SwiGLU FFN, the output tied to the token embedding when ``output.weight`` is absent. The
head size comes from ``attention.key_length`` (128: n_head x head size need not be
n_embd). The FFN's pre-norm is stored as ``post_attention_norm`` (Hugging Face's name for
it): the same norm in Llama's place, not a post-norm.
"""

from __future__ import annotations

from . import register
from .qwen2 import Qwen2


@register("seed_oss")
class SeedOss(Qwen2):
    """Seed-OSS: Qwen2's graph (Q/K/V biases, NEOX RoPE) with the FFN's pre-norm named
    ``post_attention_norm`` and no output bias."""

    ignored_keys = ("attention.sliding_window",)  # llama.cpp's seed_oss never reads it
    output_bias_allowed = False
    ffn_norm_name = "post_attention_norm"
