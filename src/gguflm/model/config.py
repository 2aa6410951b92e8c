"""Model hyperparameters, read once from GGUF metadata and checked before any tensor is.

``ModelConfig`` holds what every decoder-only architecture here shares; an architecture that
needs more (a second RoPE base, soft-caps, a window pattern) subclasses it and overrides
``extra(meta)``. Every problem is a ``MetadataError`` naming the key(s) involved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..gguf.errors import MetadataError
from .ops import RopeScaling

_REQUIRED = object()
MIN_SOFTCAP = 1e-3  # soft caps below this are refused (see Meta.softcap)
MAX_F32 = float(np.finfo(np.float32).max)


class Meta:
    """Typed access to ``{arch}.<name>`` metadata keys with errors that name the key.
    Keys named in ``per_layer`` may hold one value per layer (``layers``); read as one
    value, such an array gives its largest."""

    def __init__(self, metadata: Mapping[str, Any], arch: str,
                 per_layer: tuple[str, ...] = ()) -> None:
        self.metadata = metadata
        self.arch = arch
        self.per_layer = per_layer

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def has(self, name: str) -> bool:
        return self.key(name) in self.metadata

    def raw(self, name: str) -> Any:
        """The value of a present key; a uniform per-layer array becomes its one value."""
        key = self.key(name)
        value = self.metadata[key]
        if isinstance(value, np.ndarray) and name in self.per_layer and value.size:
            value = value.max()
        if isinstance(value, np.ndarray):
            # per-layer arrays (e.g. head_count_kv in some files): fine while uniform
            if value.size == 0 or value.ndim != 1 or not np.all(value == value[0]):
                raise MetadataError("per-layer values that differ between layers are not "
                                    "supported", key=key)
            value = value[0].item()
        return value

    def _missing(self, name: str, default: Any) -> Any:
        if default is _REQUIRED:
            raise MetadataError(f"missing, required by the {self.arch!r} architecture",
                                key=self.key(name))
        return default

    def int(self, name: str, default: Any = _REQUIRED, *, minimum: int = 1) -> int:
        if not self.has(name):
            return self._missing(name, default)
        value = self.raw(name)
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise MetadataError(f"expected an integer, got {type(value).__name__} {value!r}",
                                key=self.key(name))
        if value < minimum:
            raise MetadataError(f"must be at least {minimum}, got {value}", key=self.key(name))
        return int(value)

    def layers(self, name: str, n_layer: int, default: Any = _REQUIRED) -> tuple[int, ...]:
        """A per-layer integer key (one of ``per_layer``): its array of n_layer positive
        values, or its one value (``int``) for every layer."""
        value = self.metadata.get(self.key(name))
        if not isinstance(value, np.ndarray):
            return (self.int(name, default),) * n_layer
        if value.shape != (n_layer,) or value.dtype.kind not in "iu" or value.min() < 1:
            raise MetadataError(f"expected {n_layer} positive integers, one per layer, got "
                                f"{value.tolist()}", key=self.key(name))
        return tuple(int(v) for v in value)

    def float(self, name: str, default: Any = _REQUIRED, *, positive: bool = True) -> float:
        if not self.has(name):
            return self._missing(name, default)
        value = self.raw(name)
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise MetadataError(f"expected a number, got {type(value).__name__} {value!r}",
                                key=self.key(name))
        value = float(value)
        if not math.isfinite(value) or (positive and value <= 0):
            raise MetadataError(f"must be a positive finite number, got {value}",
                                key=self.key(name))
        return value

    def softcap(self, name: str, default: Any = _REQUIRED, *, none: bool = True) -> float:
        """A soft-capping key (``cap * tanh(x / cap)``): a cap of at least MIN_SOFTCAP, or 0
        for none where ``none``. A smaller cap would squeeze every logit into +-cap, and
        one under ~1e-38 overflows its float32 reciprocal into NaN logits."""
        value = self.float(name, default, positive=False)
        if value == 0 and none:
            return 0.0
        if not MIN_SOFTCAP <= value <= MAX_F32:
            allowed = "0 (none) or " if none else ""
            raise MetadataError(f"must be {allowed}a cap in {MIN_SOFTCAP:g}..{MAX_F32:.3g}, "
                                f"got {value:g}", key=self.key(name))
        return value

    def str(self, name: str, default: Any = _REQUIRED) -> str:
        if not self.has(name):
            return self._missing(name, default)
        value = self.raw(name)
        if not isinstance(value, str):
            raise MetadataError(f"expected a string, got {type(value).__name__}",
                                key=self.key(name))
        return value

    def bool(self, name: str, default: Any = _REQUIRED) -> bool:
        if not self.has(name):
            return self._missing(name, default)
        value = self.raw(name)
        if not isinstance(value, bool | np.bool_):
            raise MetadataError(f"expected a boolean, got {type(value).__name__} {value!r}",
                                key=self.key(name))
        return bool(value)

    def swa_layers(self, n_layer: int, default_period: int) -> tuple[bool, ...]:
        """Which layers use the sliding window, as llama.cpp's load_swa_pattern (dense
        last): ``attention.sliding_window_pattern`` as per-layer flags, or a period p
        (default ``default_period``): layer il slides unless il % p == p - 1; p = 0: all."""
        key = self.key("attention.sliding_window_pattern")
        value = self.metadata.get(key, default_period)
        if isinstance(value, np.ndarray | list | tuple):
            flags = tuple(bool(v) for v in value)
            if len(flags) != n_layer:
                raise MetadataError(f"has {len(flags)} entries for {n_layer} layers", key=key)
            return flags
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise MetadataError(f"expected a layer period or per-layer flags, got {value!r}",
                                key=key)
        p = int(value)
        return tuple(p == 0 or il % p < p - 1 for il in range(n_layer))


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters shared by the decoder-only architectures (GGUF key in each comment)."""

    arch: str            # general.architecture
    n_vocab: int         # {arch}.vocab_size, else len(tokenizer.ggml.tokens), else embedding rows
    n_ctx_train: int     # {arch}.context_length
    n_embd: int          # {arch}.embedding_length
    n_layer: int         # {arch}.block_count
    n_head: int          # {arch}.attention.head_count
    n_head_kv: int       # {arch}.attention.head_count_kv (default: n_head)
    head_dim: int        # {arch}.attention.key_length (default: n_embd / n_head): Q and K
    head_dim_v: int      # {arch}.attention.value_length (default: head_dim)
    n_ff: int            # {arch}.feed_forward_length
    norm_eps: float      # {arch}.attention.layer_norm_rms_epsilon
    rope_base: float     # {arch}.rope.freq_base (default 10000)
    rope_dim: int        # {arch}.rope.dimension_count (default: head_dim): dims RoPE rotates
    # 1 / {arch}.rope.scaling.factor (linear or YaRN), else 1; a float carrying the rest of
    # the rope.scaling keys, which ops.rope_table applies (``rope_scaling``)
    rope_freq_scale: RopeScaling
    sliding_window: int  # {arch}.attention.sliding_window (0: none)
    n_expert: int        # {arch}.expert_count (0: a dense FFN)
    n_expert_used: int   # {arch}.expert_used_count: experts per token (0 when dense)
    # {arch}.attention.causal (default true): false makes every attention bidirectional
    # within a sequence (an embedding model: it computes no next-token logits)
    causal: bool = field(default=True, kw_only=True)

    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.head_dim

    @property
    def n_embd_k(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def n_embd_v(self) -> int:
        return self.n_head_kv * self.head_dim_v

    def require_one_head_size(self) -> None:
        """A MetadataError unless values have the keys' head size (graphs that assume it)."""
        if self.head_dim_v != self.head_dim:
            raise MetadataError(f"must equal key_length ({self.head_dim}) for {self.arch}, "
                                f"got {self.head_dim_v}",
                                key=f"{self.arch}.attention.value_length")

    def require_full_rope(self) -> None:
        """A MetadataError unless RoPE rotates the whole head (graphs that assume it)."""
        if self.rope_dim != self.head_dim:
            raise MetadataError(f"must equal the head size {self.head_dim} for {self.arch}, "
                                f"got {self.rope_dim}", key=f"{self.arch}.rope.dimension_count")

    # the rope.scaling.type values besides "none" this config's architecture applies
    rope_scalings: ClassVar[tuple[str, ...]] = ("linear", "yarn")
    # whether feed_forward_length is required (an all-experts model sizes them apart)
    needs_n_ff: ClassVar[bool] = True
    # keys that may hold one value per layer (``Meta.layers``; read as one value: the
    # largest), for an architecture whose layers differ
    per_layer_keys: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], n_vocab_fallback: int = 0
                      ) -> ModelConfig:
        """Read and check the hyperparameters. ``n_vocab_fallback`` (the embedding's row
        count) is used when neither ``vocab_size`` nor a token list is present."""
        arch = metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise MetadataError("missing or not a string: not a model file (vocabulary only?)",
                                key="general.architecture")
        m = Meta(metadata, arch, cls.per_layer_keys)
        n_embd = m.int("embedding_length")
        n_head = m.int("attention.head_count")
        n_head_kv = m.int("attention.head_count_kv", n_head)
        if n_head % n_head_kv:
            raise MetadataError(
                f"attention.head_count ({n_head}) must be a multiple of head_count_kv "
                f"({n_head_kv}) for grouped-query attention", key=m.key("attention.head_count_kv"))
        if m.has("attention.key_length"):
            head_dim = m.int("attention.key_length")
        elif n_embd % n_head:
            raise MetadataError(
                f"embedding_length ({n_embd}) is not divisible by attention.head_count "
                f"({n_head}) and attention.key_length is not given", key=m.key("embedding_length"))
        else:
            head_dim = n_embd // n_head
        rope_dim = m.int("rope.dimension_count", head_dim)
        if rope_dim % 2 or rope_dim > head_dim:
            raise MetadataError(f"must be even and at most the head size {head_dim}, got "
                                f"{rope_dim}", key=m.key("rope.dimension_count"))
        values = dict(
            arch=arch,
            n_vocab=_n_vocab(m, n_vocab_fallback),
            n_ctx_train=m.int("context_length"),
            n_embd=n_embd,
            n_layer=m.int("block_count"),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            head_dim_v=m.int("attention.value_length", head_dim),
            n_ff=(m.int("feed_forward_length") if cls.needs_n_ff
                  else m.int("feed_forward_length", 0, minimum=0)),
            norm_eps=m.float("attention.layer_norm_rms_epsilon"),
            rope_base=m.float("rope.freq_base", 10000.0),
            rope_dim=rope_dim,
            rope_freq_scale=rope_scaling(m, cls.rope_scalings, m.int("context_length"),
                                         cls.yarn_magnitude),
            sliding_window=m.int("attention.sliding_window", 0, minimum=0),
            causal=m.bool("attention.causal", True),
            **_experts(m),
        )
        values.update(cls.extra(m, values))
        return cls(**values)

    @classmethod
    def extra(cls, meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        """Architecture-specific fields (subclasses override); ``common`` is read already."""
        return {}

    @staticmethod
    def yarn_magnitude(factor: float, log_mul: float) -> float:
        """YaRN's net factor on cos and sin for a context ``factor`` and the file's
        ``rope.scaling.yarn_log_multiplier`` m (0: none), as llama.cpp's context derives
        it: mscale(f, 1) / mscale(f, m), or mscale(f, 1) without m. An architecture whose
        llama.cpp reads the key its own way overrides this (deepseek2)."""
        return _mscale(factor, 1.0) / _mscale(factor, log_mul) if log_mul else _mscale(
            factor, 1.0)


def per_layer_kv_heads(meta: Meta, n_layer: int, n_head: int, zero: str
                       ) -> tuple[int, ...]:
    """``attention.head_count_kv`` per layer, for hybrids whose recurrent layers have no KV
    heads: an array of n_layer counts (0: ``zero``, the recurrent kind), each else dividing
    the heads; or one count for every layer."""
    key = meta.key("attention.head_count_kv")
    value = meta.metadata.get(key)
    if not isinstance(value, np.ndarray):
        return (meta.int("attention.head_count_kv"),) * n_layer
    if value.shape != (n_layer,) or value.dtype.kind not in "iu" or value.min() < 0:
        raise MetadataError(f"expected {n_layer} counts, one per layer (0: {zero}), got "
                            f"{value.tolist()}", key=key)
    heads = tuple(int(h) for h in value)
    if any(h and n_head % h for h in heads):
        raise MetadataError(f"each must divide attention.head_count ({n_head}), got "
                            f"{list(heads)}", key=key)
    return heads


def _experts(m: Meta) -> dict[str, int]:
    n = m.int("expert_count", 0, minimum=0)
    used = m.int("expert_used_count", 0, minimum=0)
    if n and not 1 <= used <= n:
        raise MetadataError(f"must be 1..expert_count ({n}), got {used}",
                            key=m.key("expert_used_count"))
    return {"n_expert": n, "n_expert_used": used if n else 0}


def _n_vocab(m: Meta, fallback: int) -> int:
    if m.has("vocab_size"):
        return m.int("vocab_size")
    tokens = m.metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) > 0:
        return len(tokens)
    if fallback > 0:
        return fallback
    raise MetadataError("missing, and there is no tokenizer.ggml.tokens to count",
                        key=m.key("vocab_size"))


def rope_scaling(m: Meta, supported: tuple[str, ...], n_ctx_train: int,
                 yarn_magnitude: Callable[[float, float], float] = ModelConfig.yarn_magnitude
                 ) -> RopeScaling:
    """The file's RoPE scaling as llama.cpp derives it (llama_model::load_hparams and
    llama_context's yarn parameters), each key's default llama.cpp's: ``rope.scaling.type``
    (default linear: a ``rope.scaling.factor`` without a type scales linearly; none: no
    scaling), ``factor`` (0 or absent: 1), ``original_context_length`` (default the
    training context), ``yarn_ext_factor`` (default 1 for yarn, else 0), ``yarn_beta_fast``
    / ``yarn_beta_slow`` (32 / 1), and the magnitude on cos and sin (``_magnitude``, YaRN's
    net factor by ``yarn_magnitude``: ``ModelConfig.yarn_magnitude``)."""
    kind = m.str("rope.scaling.type", "linear")
    if kind != "none" and kind not in supported:
        # longrope (its per-frequency factors are phi3's own) changes RoPE beyond these
        # tables; refusing beats being subtly wrong
        raise MetadataError(f"RoPE scaling {kind!r} is not supported (supported: none, "
                            f"{', '.join(supported)})", key=m.key("rope.scaling.type"))
    factor = m.float("rope.scaling.factor", 0.0, positive=False)
    if factor < 0:
        raise MetadataError(f"must be 0 (none) or positive, got {factor:g}",
                            key=m.key("rope.scaling.factor"))
    freq_scale = 1.0 if kind == "none" or factor == 0 else 1.0 / factor
    ext = m.float("rope.scaling.yarn_ext_factor", -1.0, positive=False)
    if ext < 0:  # negative: not set (llama.cpp's -1)
        ext = 1.0 if kind == "yarn" else 0.0
    n_orig = m.int("rope.scaling.original_context_length", 0, minimum=0) or n_ctx_train
    return RopeScaling(freq_scale, kind, ext, n_orig,
                       m.float("rope.scaling.yarn_beta_fast", 32.0),
                       m.float("rope.scaling.yarn_beta_slow", 1.0),
                       _magnitude(m, freq_scale, ext, yarn_magnitude))


def _mscale(factor: float, mscale: float) -> float:
    """YaRN's attention magnitude for a context ``factor`` (HF's get_mscale)."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def _magnitude(m: Meta, freq_scale: float, ext: float,
               yarn_magnitude: Callable[[float, float], float]) -> float:
    """What ggml's rope multiplies cos and sin by. With YaRN (ext != 0) the net is
    ``rope.scaling.attn_factor`` x mscale(f) (f the factor): 1 + 0.1 ln f, or with a
    ``yarn_log_multiplier`` m, mscale(f, 1) / mscale(f, m) (1 for m = 1: Mistral 3).
    Without YaRN: ``yarn_attn_factor`` (default 1); ``rope.scaling.attn_factor`` is then
    left to the architecture that carries it (phi3's LongRoPE applies it itself)."""
    if ext == 0:
        return m.float("rope.scaling.yarn_attn_factor", 1.0)
    factor = 1.0 / freq_scale
    log_mul = m.float("rope.scaling.yarn_log_multiplier", 0.0, positive=False)
    net = yarn_magnitude(factor, log_mul)
    attn_factor = m.float("rope.scaling.attn_factor", 1.0)
    if factor <= 1.0:
        return net * attn_factor
    # llama.cpp hands ggml net / (1 + 0.1 ln f) and ggml multiplies by 1 + 0.1 ln f again;
    # dividing by mscale(f, 1), the same number, first leaves exactly 1 without a log
    # multiplier, so those tables are the ones YaRN always had here (gpt-oss)
    return net / _mscale(factor, 1.0) * attn_factor * (1.0 + 0.1 * np.log(1.0 / freq_scale))
