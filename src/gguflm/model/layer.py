"""The typed layer spec: everything one decoder layer has, named, built once at load.

An architecture file builds one ``Block`` per layer from its tensors (``Weights.layer``);
the reference forward (``reference.py``) and the planner of the compiled executor
(``executor.py``) read these fields and nothing else, so a misspelled or missing part is
an error at load, not a silently different path. Fused tensors (``attn_qkv``, Phi-3's
``ffn_up``) are split here into row views of the same mapped bytes (``split``): the
products see separate matrices and compute the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..quant.matrix import ExpertWeights, QMatrix

# the gated activations a GLU FFN may use: llama.cpp's LLM_FFN_SILU and LLM_FFN_GELU, the
# latter computed in float32 ("gelu") or through ggml-cpu's float16 table ("gelu_f16",
# ``ops.gelu_f16``: what llama.cpp's CPU backend computes)
GLU_ACTS = ("silu", "gelu", "gelu_f16")


@dataclass(frozen=True, eq=False)
class Linear:
    """A product ``x (T, d_in) @ w.T (+ b) -> (T, d_out)``; ``b`` (d_out,) f32 or None."""

    w: QMatrix
    b: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return self.w.shape[0]

    @classmethod
    def of(cls, layer: Any, name: str) -> Linear:
        """The product ``name`` of a ``Weights.layer`` (``layer.<name>``, ``layer.<name>_bias``)."""
        return cls(getattr(layer, name), getattr(layer, f"{name}_bias", None))


@dataclass(frozen=True, eq=False)
class Attention:
    """llama.cpp's build_attn with its projections: Q/K/V of the normed input, RMS norms
    of Q and K when given (before RoPE), RoPE table ``rope`` (an index into the tables the
    architecture's forward makes; a layer without RoPE indexes a table of ones, which
    changes no value: ``no_rope_table``) paired NEOX-style or NORM-style, causal
    attention over ``window`` positions (0: all), scores times ``scale`` and soft-capped at
    ``softcap`` (0: none), each head's softmax with its ``sinks`` logit when given, then the
    output product. ``v`` may be ``k`` itself (Gemma 4's full layers without ``attn_v``:
    V is K's product before K's norm). A layer with ``kv_layer`` set (llama.cpp's shared KV
    layers, Gemma 3n/4) stores no keys or values: its queries read those layer
    ``kv_layer`` stored, and ``k``/``v`` are unused (None when the file has none)."""

    q: Linear
    k: Linear | None
    v: Linear | None
    o: Linear
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_v: int
    scale: float
    neox: bool
    rope: int = 0
    window: int = 0
    softcap: float = 0.0
    # Q's and K's RMS norms: (head_dim,) per head, or one norm over all the heads'
    # values ((n_head * head_dim,) and (n_head_kv * head_dim,): OLMo 2)
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    sinks: np.ndarray | None = None  # (n_head,) attention-sink logits (gpt-oss)
    # Q's rows interleave, per head, head_dim query rows and head_dim output-gate rows
    # (Qwen3.5, Qwen3-Next): the attention's result times sigmoid(gate), before ``o``
    q_gate: bool = False
    # (head_dim_v,): the values RMS-normed per head with this weight (ones for ggml's
    # weightless rms_norm: Gemma 4), before they are stored
    v_norm: np.ndarray | None = None
    kv_layer: int | None = None  # the layer whose keys and values this one reads
    # the queries' own RoPE table (an index as ``rope``), where it differs from the keys':
    # Mistral 3's attention temperature, a per-position factor on the rotated queries
    q_rope: int | None = None

    def __post_init__(self) -> None:
        if self.kv_layer is None and (self.k is None or self.v is None):
            raise ValueError("an attention layer with its own keys and values needs K and V")
        for name, w, heads in (("q_norm", self.q_norm, self.n_head),
                               ("k_norm", self.k_norm, self.n_head_kv)):
            if w is not None and len(w) not in (self.head_dim, heads * self.head_dim):
                raise ValueError(f"{name} of {len(w)}: neither a head ({self.head_dim}) "
                                 f"nor all {heads} heads")


@dataclass(frozen=True, eq=False)
class LatentAttention:
    """Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2; llama.cpp's deepseek2
    graph), run absorbed as llama.cpp runs it: multi-query attention over a compressed
    latent. Per token ``kv_a`` of the normed input gives rows [c (kv_lora) | k_pe (n_rot)];
    c is RMS-normed with ``kv_a_norm``, k_pe rotated, and the cache keeps [c | k_pe] (one
    row of kv_lora + n_rot numbers per position: the latent, for every head). Queries:
    ``q_b`` of ``q_a`` of the input, RMS-normed with ``q_a_norm`` (a LoRA; or ``q_b``
    alone, of the input itself, where ``q_a`` is None), n_head heads of [nope | n_rot];
    each head's nope part is taken into the latent space by its ``k_b`` (kv_lora, nope),
    its rope part rotated. Scores of [absorbed | q_pe] against the cached rows times
    ``scale``; each head's weighted sum of the cached c (the values: the keys' first
    kv_lora numbers) goes out through its ``v_b`` (head_dim_v, kv_lora), then ``o``."""

    q_a: Linear | None
    q_a_norm: np.ndarray | None  # (q_lora,) f32
    q_b: Linear
    kv_a: Linear
    kv_a_norm: np.ndarray  # (kv_lora,) f32
    k_b: tuple[QMatrix, ...]  # attn_k_b: a (kv_lora, nope) matrix per head
    v_b: tuple[QMatrix, ...]  # attn_v_b: a (head_dim_v, kv_lora) matrix per head
    o: Linear
    n_head: int
    n_rot: int
    scale: float
    neox: bool = False
    rope: int = 0  # the RoPE table's index, as ``Attention.rope``
    # every head's k_b, and v_b, as one call takes them (``expert_products``: a head is an
    # expert every row chose)
    k_b_all: ExpertWeights = field(init=False, repr=False)
    v_b_all: ExpertWeights = field(init=False, repr=False)

    @property
    def kv_lora(self) -> int:
        return len(self.kv_a_norm)

    @property
    def nope(self) -> int:
        return self.k_b[0].shape[1]

    @property
    def head_dim_v(self) -> int:
        return self.v_b[0].shape[0]

    @property
    def width(self) -> int:
        """Numbers cached per position: the latent and the rotated key part."""
        return self.kv_lora + self.n_rot

    def __post_init__(self) -> None:
        h, lora = self.n_head, self.kv_lora
        checks = (
            (self.kv_a.rows == lora + self.n_rot, f"kv_a of {self.kv_a.rows} rows"),
            (len(self.k_b) == len(self.v_b) == h, f"k_b/v_b of {len(self.k_b)}/"
                                                  f"{len(self.v_b)} heads"),
            (all(m.shape[0] == lora for m in self.k_b)
             and all(m.shape[1] == lora for m in self.v_b), "k_b/v_b not over the latent"),
            (self.q_b.rows == h * (self.nope + self.n_rot), f"q_b of {self.q_b.rows} rows"),
            ((self.q_a is None) == (self.q_a_norm is None), "q_a without its norm"),
            (self.o.w.shape[1] == h * self.head_dim_v, f"o of {self.o.w.shape[1]} columns"))
        for ok, what in checks:
            if not ok:
                raise ValueError(f"latent attention of {h} heads, latent {lora} and "
                                 f"{self.n_rot} rotated dims: {what}")
        object.__setattr__(self, "k_b_all", ExpertWeights(self.k_b))
        object.__setattr__(self, "v_b_all", ExpertWeights(self.v_b))


@dataclass(frozen=True, eq=False)
class DeltaNet:
    """A recurrent mixer, the gated delta net of llama.cpp's qwen35 graph
    (build_layer_attn_linear): ``qkv`` of the normed input (rows [q | k | v]: n_k_head
    heads of head_dim for q and k, n_v_head for v) through a causal depthwise convolution
    of ``conv`` (conv_dim, d_conv) taps over the last d_conv inputs (zeros before the
    sequence), then SiLU; q and k L2-normalised per head; value head j reads key head
    j mod n_k_head; per token and value head the decay exp(softplus(alpha(x) + dt) * a)
    and the rate sigmoid(beta(x)) drive the delta rule on a (head_dim x head_dim) state;
    the read-out is RMS-normed with ``norm`` times silu(z(x)), then ``out``. ``index`` is
    the layer's place among the recurrent layers (its state in the cache arena)."""

    qkv: Linear
    z: Linear
    alpha: Linear
    beta: Linear
    dt: np.ndarray    # (n_v_head,) f32: ssm_dt.bias
    a: np.ndarray     # (n_v_head,) f32: ssm_a (-exp(A_log))
    conv: np.ndarray  # (conv_dim, d_conv) f32: ssm_conv1d
    norm: np.ndarray  # (head_dim,) f32: ssm_norm
    out: Linear
    n_k_head: int
    n_v_head: int
    head_dim: int
    index: int

    def __post_init__(self) -> None:
        if self.n_v_head % self.n_k_head:
            raise ValueError(f"{self.n_v_head} value heads over {self.n_k_head} key heads")

    @property
    def conv_dim(self) -> int:
        return self.conv.shape[0]

    @property
    def d_conv(self) -> int:
        return self.conv.shape[1]


@dataclass(frozen=True, eq=False)
class ShortConv:
    """A recurrent mixer, LFM2's gated short convolution (llama.cpp's lfm2 graph,
    build_shortconv_block): ``in_proj`` of the normed input gives rows [b | c | x] (n_embd
    each); b * x runs through a causal depthwise convolution of ``conv`` (n_embd, l_cache)
    taps over the last l_cache inputs (zeros before the sequence), no activation; c times
    that, then ``out``. The state is the last l_cache - 1 values of b * x; ``index`` is the
    layer's place among the recurrent layers (its state in the cache arena)."""

    in_proj: Linear
    conv: np.ndarray  # (n_embd, l_cache) f32: shortconv.conv
    out: Linear
    index: int

    def __post_init__(self) -> None:
        if self.in_proj.rows != 3 * self.conv.shape[0]:
            raise ValueError(f"in_proj of {self.in_proj.rows} rows: not [b | c | x] of "
                             f"{self.conv.shape[0]} channels each")

    @property
    def channels(self) -> int:
        return self.conv.shape[0]

    @property
    def d_conv(self) -> int:
        return self.conv.shape[1]


@dataclass(frozen=True, eq=False)
class Mamba2:
    """A recurrent mixer, the Mamba2 state-space layer of llama.cpp's build_mamba2_layer
    (Granite 4.0-H): ``in_proj`` of the normed input gives rows [z (d_inner) | xBC
    (d_inner + 2 n_group d_state) | dt (n_head)] (``z``, ``xbc``, ``dt``: row views); xBC
    through a causal depthwise convolution of ``conv`` (conv_dim, d_conv) taps over the last
    d_conv inputs (zeros before the sequence), plus ``conv_b``, then SiLU, splits into x
    (n_head heads of head_dim), B and C (n_group groups of d_state; head h reads group
    h // (n_head / n_group)); per token and head the scan decays its (head_dim x d_state)
    state by exp(softplus(dt + ``dt_bias``) * ``a``) and adds B x dt; y = state . C, plus
    ``d`` x, times silu(z), RMS-normed per group with ``norm`` (d_inner,), then ``out``. The
    state is the convolution's last d_conv - 1 inputs and the scan's matrices; ``index``
    is the layer's place among the recurrent layers (its state in the cache arena)."""

    z: Linear
    xbc: Linear
    dt: Linear
    conv: np.ndarray            # (conv_dim, d_conv) f32: ssm_conv1d
    conv_b: np.ndarray | None   # (conv_dim,) f32: ssm_conv1d.bias
    dt_bias: np.ndarray         # (n_head,) f32: ssm_dt.bias
    a: np.ndarray               # (n_head,) f32: ssm_a (-exp(A_log))
    d: np.ndarray               # (n_head,) f32: ssm_d
    norm: np.ndarray            # (d_inner,) f32: ssm_norm, n_group rows of d_inner / n_group
    out: Linear
    n_head: int
    head_dim: int
    d_state: int
    n_group: int
    index: int

    def __post_init__(self) -> None:
        d_inner = self.n_head * self.head_dim
        checks = ((self.n_head % self.n_group == 0 and d_inner % self.n_group == 0,
                   f"{self.n_head} heads over {self.n_group} groups"),
                  (self.xbc.rows == self.conv_dim == d_inner + 2 * self.n_group * self.d_state,
                   f"xBC of {self.xbc.rows} rows, a convolution of {self.conv_dim}"),
                  (self.z.rows == len(self.norm) == d_inner, f"z of {self.z.rows} rows"),
                  (self.dt.rows == self.n_head, f"dt of {self.dt.rows} rows"))
        for ok, what in checks:
            if not ok:
                raise ValueError(f"Mamba2 of {self.n_head} heads of {self.head_dim}, "
                                 f"d_state {self.d_state}: {what}")

    @property
    def conv_dim(self) -> int:
        return self.conv.shape[0]

    @property
    def d_conv(self) -> int:
        return self.conv.shape[1]


@dataclass(frozen=True, eq=False)
class GLU:
    """llama.cpp's build_ffn with a parallel gate: ``down(act(gate(x)) * up(x))``."""

    gate: Linear
    up: Linear
    down: Linear
    act: str  # one of GLU_ACTS

    def __post_init__(self) -> None:
        if self.act not in GLU_ACTS:
            raise ValueError(f"unknown GLU activation {self.act!r} (known: {GLU_ACTS})")


# how an expert FFN turns router logits into the selection and its weights: llama.cpp's
# LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, _SIGMOID and _SOFTMAX_WEIGHT (the best logits,
# then a softmax over those alone: gpt-oss)
GATINGS = ("softmax", "sigmoid", "softmax_weight")
# experts' gated activations: the GLUs' and gpt-oss's clamped SwiGLU (ggml_swiglu_oai)
EXPERT_ACTS = (*GLU_ACTS, "swiglu_oai")


@dataclass(frozen=True, eq=False)
class Experts:
    """llama.cpp's build_moe_ffn: router logits ``router(x)`` (n_expert,), scored by
    ``gating``; the ``n_used`` best experts (ties: the lower index first; ranked by the
    scores plus ``select_bias`` when given), their scores as
    weights, renormalised to sum 1 when ``norm_weights`` (the sum clamped below at 2^-14),
    times ``scale`` unless it is 0 or 1; each expert a GLU (``gate[e]``, ``up[e]``,
    ``down[e]``: row views of the 3-D tensors, each product plus its expert's row of
    ``*_b`` when given); the weighted outputs summed in selection order; then, when given,
    the ``shared`` expert's output added (gated where ``shared_gate`` is given)."""

    router: Linear
    gate: tuple[QMatrix, ...]
    up: tuple[QMatrix, ...]
    down: tuple[QMatrix, ...]
    n_used: int
    act: str  # one of EXPERT_ACTS
    gating: str = "softmax"
    norm_weights: bool = True
    scale: float = 0.0
    gate_b: np.ndarray | None = None  # (n_expert, n_ff) f32
    up_b: np.ndarray | None = None    # (n_expert, n_ff) f32
    down_b: np.ndarray | None = None  # (n_expert, n_embd) f32
    # a shared expert every token runs, its output added after the routed experts': times
    # sigmoid(shared_gate . x) where given (Qwen3.5-MoE, Qwen3-Next), else as it is (GLM-4.5)
    shared: GLU | None = None
    shared_gate: np.ndarray | None = None  # (n_embd,) f32
    # Gemma 4: the router reads rms_norm(x) * router_in_scale * router_in_norm of the FFN's
    # input x (before any pre-norm), not the experts' normed input
    router_in_norm: np.ndarray | None = None  # (n_embd,) f32
    router_in_scale: float = 1.0
    down_scale: np.ndarray | None = None  # (n_expert,) f32: each expert's output times it
    # (n_expert,) f32 added to the scores to choose the experts, not to their weights
    # (llama.cpp's exp_probs_b: DeepSeek-V3, LFM2-MoE)
    select_bias: np.ndarray | None = None
    # grouped selection (DeepSeek-V3): the experts in ``groups`` consecutive groups, each
    # ranked by the sum of its two best (biased) scores; only the ``groups_used`` best
    # groups' experts may be chosen (0 or 1 group: no grouping)
    groups: int = 0
    groups_used: int = 0
    # every expert's gate and up, and down, as one call each takes them (``expert_products``)
    gate_up_all: ExpertWeights = field(init=False, repr=False)
    down_all: ExpertWeights = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.act not in EXPERT_ACTS or self.gating not in GATINGS:
            raise ValueError(f"unknown expert activation {self.act!r} or gating "
                             f"{self.gating!r}")
        if not 1 <= self.n_used <= len(self.gate) == len(self.up) == len(self.down):
            raise ValueError(f"{self.n_used} of {len(self.gate)} experts")
        if self.groups > 1 and not (len(self.gate) % self.groups == 0
                                    and 0 < self.groups_used < self.groups
                                    and self.groups_used * (len(self.gate) // self.groups)
                                    >= self.n_used):
            raise ValueError(f"{self.n_used} of {len(self.gate)} experts from "
                             f"{self.groups_used} of {self.groups} groups")
        object.__setattr__(self, "gate_up_all", ExpertWeights(self.gate, self.up))
        object.__setattr__(self, "down_all", ExpertWeights(self.down))


@dataclass(frozen=True, eq=False)
class DenseAndExperts:
    """Two FFN branches over one residual, summed (Gemma 4's MoE layers, llama.cpp's
    gemma4.cpp): the ``dense`` GLU of the block's ``ffn_norm``-ed input, RMS-normed with
    ``dense_post_norm``; plus the ``experts`` of the input normed with ``experts_norm``,
    RMS-normed with ``experts_post_norm``."""

    dense: GLU
    dense_post_norm: np.ndarray
    experts: Experts
    experts_norm: np.ndarray
    experts_post_norm: np.ndarray


@dataclass(frozen=True, eq=False)
class PerLayerInput:
    """A per-layer embedding input (Gemma 3n/4), after the FFN's residual add:
    ``x += norm(proj(gelu(gate(x)) * inp))`` (ggml's GELU: ``ops.gelu_f16``), ``inp`` (T, d)
    this layer's slice ``index``
    of the model's per-layer inputs (``reference.stack``'s ``inputs``: (T, n_layer, d))."""

    gate: Linear
    proj: Linear
    norm: np.ndarray
    index: int


@dataclass(frozen=True, eq=False)
class Block:
    """One pre-norm decoder layer: ``x += post(attn(norm(x)))``, ``x += post(ffn(norm(x)))``,
    the post norms (Gemma's) optional; all norms RMS norms with ``eps``. The mixer
    ``attn`` is attention (or ``LatentAttention``) or a recurrent one (``DeltaNet``,
    ``ShortConv``, ``Mamba2``). Then, when
    given, the per-layer input is added (``per_layer``) and x is multiplied by
    ``out_scale`` (Gemma 4's ``layer_output_scale``; 1: none). A pre-norm of None is none:
    the attention or FFN reads x itself (OLMo 2, EXAONE 4: their outputs are post-normed
    instead)."""

    attn_norm: np.ndarray | None
    attn: Attention | LatentAttention | DeltaNet | ShortConv | Mamba2
    ffn_norm: np.ndarray | None
    ffn: GLU | Experts | DenseAndExperts
    eps: float
    attn_post_norm: np.ndarray | None = None
    ffn_post_norm: np.ndarray | None = None
    per_layer: PerLayerInput | None = None
    out_scale: float = 1.0
    residual_scale: float = 1.0


def no_rope_table(n_rows: int, n_rot: int) -> np.ndarray:
    """The RoPE table (n_rows, n_rot/2) c64 of layers without RoPE (llama.cpp's NoPE
    layers: SmolLM3's every 4th, EXAONE 4's full-attention ones): rotations by angle 0,
    x * 1 - y * 0, which give every value back unchanged. Such a layer indexes this table
    (``Attention.rope``) and runs on every path the rotating layers run on."""
    return np.ones((n_rows, n_rot // 2), np.complex64)


# -- building specs from a layer's tensors ---------------------------------------------------


def split(lin: Linear, rows: tuple[int, ...]) -> tuple[Linear, ...]:
    """A fused product cut into consecutive row ranges of ``rows`` each: views of the same
    bytes (no copy), the bias cut alike."""
    if sum(rows) != lin.rows:
        raise ValueError(f"{lin.w!r}: cannot split {lin.rows} rows into {rows}")
    out, at = [], 0
    for n in rows:
        w = lin.w
        part = QMatrix(w.type, w.raw[at:at + n], (n, w.shape[1]), name=f"{w.name}[{at}:{at + n}]")
        out.append(Linear(part, None if lin.b is None else lin.b[at:at + n]))
        at += n
    return tuple(out)


def qkv(layer: Any, n_q: int, n_k: int, n_v: int) -> tuple[Linear, Linear, Linear]:
    """Q, K, V of a layer loaded with ``Weights.layer(..., qkv=config)``: the fused
    ``attn_qkv`` (rows [q | k | v]) split, or the separate ``attn_q``/``attn_k``/``attn_v``."""
    if getattr(layer, "attn_qkv", None) is not None:
        return split(Linear.of(layer, "attn_qkv"), (n_q, n_k, n_v))  # type: ignore[return-value]
    return Linear.of(layer, "attn_q"), Linear.of(layer, "attn_k"), Linear.of(layer, "attn_v")


def experts(layer: Any, n_used: int, act: str, **rule: Any) -> Experts:
    """The expert FFN of a layer loaded with ``Weights.experts``: router ``ffn_gate_inp``
    (optional bias), ``ffn_gate_exps``/``ffn_up_exps``/``ffn_down_exps`` split per expert
    (a fused ``ffn_gate_up_exps`` cut into each expert's gate and up rows: views of the
    same bytes); ``rule`` sets ``Experts``' gating fields."""
    gate, up = getattr(layer, "ffn_gate_exps", None), getattr(layer, "ffn_up_exps", None)
    fused = getattr(layer, "ffn_gate_up_exps", None)
    if fused is not None:
        halves = [split(Linear(m), (m.shape[0] // 2, m.shape[0] // 2)) for m in fused]
        gate, up = (tuple(h[i].w for h in halves) for i in (0, 1))
    return Experts(Linear.of(layer, "ffn_gate_inp"), gate, up,
                   layer.ffn_down_exps, n_used, act, **rule,
                   gate_b=getattr(layer, "ffn_gate_exps_bias", None),
                   up_b=getattr(layer, "ffn_up_exps_bias", None),
                   down_b=getattr(layer, "ffn_down_exps_bias", None))


def glu(layer: Any, act: str) -> GLU:
    """The FFN of a layer: ``ffn_gate``/``ffn_up``/``ffn_down``, or without ``ffn_gate`` a
    fused ``ffn_up`` of rows [gate | up] (Phi-3) split in two."""
    down = Linear.of(layer, "ffn_down")
    if getattr(layer, "ffn_gate", None) is None:
        up = Linear.of(layer, "ffn_up")
        gate, up = split(up, (up.rows // 2, up.rows // 2))
    else:
        gate, up = Linear.of(layer, "ffn_gate"), Linear.of(layer, "ffn_up")
    return GLU(gate, up, down, act)
