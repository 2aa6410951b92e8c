"""Which ggml type each tensor gets: llama-quantize's file types and mixture rules.

A transcription of the decisions in llama.cpp's ``src/llama-quant.cpp`` (build 0c1e570):
which tensors may be quantized at all (``tensor_allows_quantization``), the per-tensor
choice of each file type (``llama_tensor_get_type_impl``: the output and token embeddings,
more bits for some layers' attn_v/ffn_down, per-architecture exceptions), and the fallback
when a row length does not fit the type's block (``tensor_type_fallback``). Branches that
only IQ1/IQ2/IQ3 file types reach are left out: those need an importance matrix, which
gguflm does not support yet.

The rules are stateful the way llama.cpp's are: attn_v and ffn_down tensors are numbered
in the order the tensors are visited (``tensor_order``), and only when their branch runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..gguf.errors import GGUFError
from ..gguf.types import GGMLType

T = GGMLType


@dataclass(frozen=True)
class FileType:
    """A llama-quantize file type: its name, ``general.file_type`` value (``llama_ftype``)
    and the ggml type most tensors get."""

    name: str
    ftype: int
    default: GGMLType | None  # None: COPY (tensors kept as they are)


# llama-quantize's QUANT_OPTIONS that gguflm can make (names as it spells them)
FILE_TYPES: dict[str, FileType] = {ft.name: ft for ft in [
    FileType("Q4_0", 2, T.Q4_0), FileType("Q4_1", 3, T.Q4_1),
    FileType("Q5_0", 8, T.Q5_0), FileType("Q5_1", 9, T.Q5_1),
    FileType("Q8_0", 7, T.Q8_0), FileType("MXFP4_MOE", 38, T.MXFP4),
    FileType("Q2_K", 10, T.Q2_K), FileType("Q2_K_S", 21, T.Q2_K),
    FileType("Q3_K_S", 11, T.Q3_K), FileType("Q3_K_M", 12, T.Q3_K),
    FileType("Q3_K_L", 13, T.Q3_K), FileType("Q4_K_S", 14, T.Q4_K),
    FileType("Q4_K_M", 15, T.Q4_K), FileType("Q5_K_S", 16, T.Q5_K),
    FileType("Q5_K_M", 17, T.Q5_K), FileType("Q6_K", 18, T.Q6_K),
    FileType("IQ4_NL", 25, T.IQ4_NL), FileType("IQ4_XS", 30, T.IQ4_XS),
    FileType("TQ1_0", 36, T.TQ1_0), FileType("TQ2_0", 37, T.TQ2_0),
    FileType("F16", 1, T.F16), FileType("BF16", 32, T.BF16), FileType("F32", 0, T.F32),
    FileType("COPY", 0, None),
]}
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
# llama-quantize types gguflm cannot make yet (IQ1/IQ2/IQ3 need an importance matrix)
UNSUPPORTED = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS",
               "IQ3_S", "IQ3_M", "Q1_0", "Q2_0")
_UNSUPPORTED_FTYPES = {19: "IQ2_XXS", 20: "IQ2_XS", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
                       26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 31: "IQ1_M",
                       40: "Q1_0", 41: "Q2_0"}


def file_type(name: str | int | FileType) -> FileType:
    """A file type by name (case-insensitive, with llama-quantize's aliases) or number."""
    if isinstance(name, FileType):
        return name
    key = str(name).strip().upper()
    key = ALIASES.get(key, key)
    if key in FILE_TYPES:
        return FILE_TYPES[key]
    if key.isdigit():  # llama-quantize also takes the llama_ftype number
        for ft in FILE_TYPES.values():
            if ft.ftype == int(key) and ft.name != "COPY":
                return ft
        key = _UNSUPPORTED_FTYPES.get(int(key), key)
    known = ", ".join([*FILE_TYPES, *ALIASES])
    if key in UNSUPPORTED:
        raise GGUFError(f"file type {key} is not supported yet (it needs an importance matrix "
                        f"or a quantizer gguflm lacks); supported: {known}")
    raise GGUFError(f"unknown file type {name!r}; supported: {known}")


@dataclass(frozen=True)
class Model:
    """The hyperparameters the rules read (llama.cpp's ``hparams``/``model.type``)."""

    arch: str
    n_layer: int
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        """llama.cpp's ``LLM_TYPE_70B``, which gives attn_v more bits."""
        if self.arch == "llama":
            return self.n_expert != 8 and self.n_layer == 80 and self.n_head != self.n_head_kv
        return (self.arch in ("qwen2", "olmo", "deci") and self.n_layer == 80
                or self.arch == "jais2" and self.n_layer == 68)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Model:
        arch = meta.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise GGUFError("no general.architecture: cannot choose per-tensor types",
                            key="general.architecture")
        n_layer = _first_int(meta.get(f"{arch}.block_count"))
        if n_layer is None or n_layer <= 0:
            raise GGUFError("missing or invalid; llama-quantize needs the layer count",
                            key=f"{arch}.block_count")
        n_head = _first_int(meta.get(f"{arch}.attention.head_count")) or 0
        n_head_kv = _first_int(meta.get(f"{arch}.attention.head_count_kv"))
        return cls(arch, n_layer, n_head, n_head if n_head_kv is None else n_head_kv,
                   _first_int(meta.get(f"{arch}.expert_count")) or 0)


def _first_int(v: Any) -> int | None:
    """A count from metadata: an integer, or the first layer's of a per-layer array."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    try:
        return int(v[0]) if len(v) else None
    except (TypeError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Options:
    """llama-quantize's options that change the types (``llama_model_quantize_params``)."""

    output_tensor_type: GGMLType | None = None     # --output-tensor-type
    token_embedding_type: GGMLType | None = None   # --token-embedding-type
    pure: bool = False                             # --pure: no mixture, one type
    quantize_output_tensor: bool = True            # False: --leave-output-tensor


# -- the order llama.cpp visits tensors in ------------------------------------------------------

_LAYER = re.compile(r"blk\.\s*([+-]?\d+)")


def tensor_order(names: Iterable[str]) -> list[str]:
    """The loader's ``weights_map`` order: by layer number (``blk.N.``; -1 for others),
    then by name bytes. llama-quantize writes the tensors in this order."""
    def key(name: str) -> tuple[int, bytes]:
        m = _LAYER.match(name)
        return (int(m.group(1)) if m else -1), name.encode("utf-8", "surrogateescape")
    return sorted(names, key=key)


def n_dims(shape: Sequence[int]) -> int:
    """``ggml_n_dims``: dimensions up to the last one above 1 (at least 1)."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return max(n, 1)


# -- categories --------------------------------------------------------------------------------

def category(name: str) -> str:
    """``tensor_get_category``: the rule group of a tensor, by its name."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"),
                      ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"),
                      ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                      ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                      ("ffn_down", "ffn_down")):
        if part in name:
            return cat
    return "other"


_ATTN_V_LIKE = ("attn_v", "attn_qkv", "attn_kv_b")  # the most quantization-sensitive

# substrings that keep a tensor as it is (llama.cpp's list, all architectures)
_KEEP_PARTS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight",
    "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
    "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
    "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
    ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
    ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_KEEP_PARTS_GLM5_NEXT = (
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight",
    "ssm_g_b.weight", "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
    "attn_v_b.weight",
)


def allows_quantization(name: str, shape: Sequence[int], arch: str, options: Options,
                        copy_only: bool = False) -> bool:
    """``tensor_allows_quantization``: 2-D/3-D ``*weight`` tensors, minus norms, routers,
    position embeddings and a list of small special tensors."""
    # ggml tests the suffix with rfind("weight") == size() - 6, which a 5-byte name also
    # passes (both sides are npos)
    weight = name.endswith("weight") or len(name.encode("utf-8", "surrogateescape")) == 5
    if copy_only or n_dims(shape) < 2 or not weight:
        return False
    if not options.quantize_output_tensor and name == "output.weight":
        return False
    # positional embeddings and token types (BERT): llama.cpp names them per architecture,
    # and only the architectures that have them use these names
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    keep = _KEEP_PARTS + (_KEEP_PARTS_GLM5_NEXT if arch == "glm5-next" else ())
    return not any(part in name for part in keep)


# -- the choice --------------------------------------------------------------------------------

@dataclass
class Mixture:
    """One file's type choices, in visiting order (llama.cpp's ``quantize_state_impl``)."""

    file_type: FileType
    model: Model
    options: Options = field(default_factory=Options)
    has_tied_embeddings: bool = True
    n_attention_wv: int = 0
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0
    n_fallback: int = 0

    @classmethod
    def for_tensors(cls, file_type: FileType, model: Model, names: Iterable[str],
                    options: Options | None = None) -> Mixture:
        """The state after ``init_quantize_state_counters`` saw all tensor names."""
        m = cls(file_type, model, options or Options())
        for name in names:
            cat = category(name)
            m.n_attention_wv += cat in _ATTN_V_LIKE
            if cat == "output":
                m.has_tied_embeddings = False
        return m

    def choose(self, name: str, shape: Sequence[int], current: GGMLType) -> GGMLType:
        """``llama_tensor_get_type`` for the next tensor (call in visiting order)."""
        opts = self.options
        copy_only = self.file_type.default is None
        if not allows_quantization(name, shape, self.model.arch, opts, copy_only):
            return current
        cat = category(name)
        if opts.token_embedding_type is not None and cat == "token_embd":
            return opts.token_embedding_type
        if opts.output_tensor_type is not None and cat == "output":
            return opts.output_tensor_type
        new = self.file_type.default
        assert new is not None
        if new.quantized:
            if not opts.pure:
                new = self._mixture_type(new, name, shape, cat)
            new = self._fallback(new, shape)
        return new

    def _fallback(self, new: GGMLType, shape: Sequence[int]) -> GGMLType:
        """``tensor_type_fallback``: a smaller-block type when the row length does not fit
        (the 256-blocks to their 32-block kin), F16 when even that does not."""
        ncols = shape[0]
        if ncols % new.block_size == 0:
            return new
        self.n_fallback += 1
        smaller = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0,
                   T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.IQ4_XS: T.IQ4_NL,
                   T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL, T.IQ2_XXS: T.IQ4_NL,
                   T.IQ2_XS: T.IQ4_NL, T.IQ2_S: T.IQ4_NL, T.IQ3_XXS: T.IQ4_NL,
                   T.IQ3_S: T.IQ4_NL, T.Q2_0: T.Q4_0}
        if new in smaller:
            new = smaller[new]
        elif new.block_size > 32:
            raise GGUFError(f"no tensor type fallback is defined for type {new.ggml_name}")
        return new if ncols % new.block_size == 0 else T.F16

    def _mixture_type(self, new: GGMLType, name: str, shape: Sequence[int],
                      cat: str) -> GGMLType:
        """``llama_tensor_get_type_impl`` for the file types gguflm supports."""
        ft, model, arch = self.file_type.name, self.model, self.model.arch

        def use_more_bits(i: int, n: int) -> bool:
            return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

        if arch == "glm5-next" and any(p in name for p in ("attn_q_a", "attn_q_b",
                                                           "nextn.eh_proj")):
            if new not in (T.F32, T.BF16, T.F16):
                return T.Q8_0
        if cat == "output" or (self.has_tied_embeddings and cat == "token_embd"):
            # a tied embedding is also the output: it gets the output's type
            if self.options.output_tensor_type is not None:
                return self.options.output_tensor_type
            if ft == "MXFP4_MOE" or arch == "falcon" or shape[0] % new.block_size:
                return T.Q8_0
            return new if new == T.Q8_0 else T.Q6_K
        if ft == "MXFP4_MOE":
            # experts (3-D) to MXFP4, everything else to Q8_0
            expert = len(shape) > 2 and shape[2] > 1
            if arch == "bailingmoe3":
                expert = expert and cat in ("ffn_up", "ffn_gate", "ffn_down")
            return T.MXFP4 if expert else T.Q8_0
        if cat == "token_embd":
            if self.options.token_embedding_type is not None:
                return self.options.token_embedding_type
            return T.Q4_K if ft in ("TQ1_0", "TQ2_0") else new
        if cat in _ATTN_V_LIKE:
            new = self._attn_v_type(new, ft, use_more_bits)
            self.i_attention_wv += 1
            return new
        if cat == "attn_k":
            return T.Q8_0 if model.n_expert == 8 else new
        if cat == "ffn_down":
            i_layer, n_layer = self._layer(self.i_ffn_down, name)
            new = self._ffn_down_type(new, ft, i_layer, n_layer, use_more_bits)
            self.i_ffn_down += 1
            return new
        if cat == "attn_output":
            if arch == "falcon":
                return T.Q4_K if ft == "Q3_K_L" else new
            if model.n_expert == 8:
                if ft in ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS"):
                    return T.Q5_K
                return new
            return {"Q2_K": T.Q3_K, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K}.get(ft, new)
        # (attn_qkv has its own branch in llama.cpp, but the attn_v one above takes it first)
        if cat == "ffn_gate":
            self._layer(self.i_ffn_gate, name)
            self.i_ffn_gate += 1
        elif cat == "ffn_up":
            self._layer(self.i_ffn_up, name)
            self.i_ffn_up += 1
        return new

    def _attn_v_type(self, new: GGMLType, ft: str, use_more_bits: Any) -> GGMLType:
        model = self.model
        if ft == "Q2_K":
            new = T.Q4_K if model.n_gqa >= 4 else T.Q3_K
        elif ft == "Q2_K_S" and model.n_gqa >= 4:
            new = T.Q4_K
        elif ft == "Q3_K_M":
            new = T.Q5_K if self.i_attention_wv < 2 else T.Q4_K
        elif ft == "Q3_K_L":
            new = T.Q5_K
        elif ft in ("IQ4_NL", "IQ4_XS") and model.n_gqa >= 4:
            new = T.Q5_K
        elif ft in ("Q4_K_M", "Q5_K_M") and use_more_bits(self.i_attention_wv,
                                                           self.n_attention_wv):
            new = T.Q6_K
        elif ft == "Q4_K_S" and self.i_attention_wv < 4:
            new = T.Q5_K
        if model.is_70b and new in (T.Q3_K, T.Q4_K):
            # 8 heads share each attn_v there: more bits cost little
            new = T.Q5_K
        if model.n_expert == 8:
            new = T.Q8_0
        return new

    def _ffn_down_type(self, new: GGMLType, ft: str, i_layer: int, n_layer: int,
                       use_more_bits: Any) -> GGMLType:
        falcon = self.model.arch == "falcon"
        if ft == "Q2_K":
            return T.Q3_K
        if ft == "Q2_K_S":
            return T.Q4_K if i_layer < n_layer // 8 else new
        if ft == "Q3_K_M":
            if i_layer < n_layer // 16:
                return T.Q5_K
            return T.Q4_K if not falcon or use_more_bits(i_layer, n_layer) else T.Q3_K
        if ft == "Q3_K_L":
            return T.Q4_K if falcon else T.Q5_K
        if ft == "Q4_K_M":
            if falcon:
                if i_layer < n_layer // 16:
                    return T.Q6_K
                return T.Q5_K if use_more_bits(i_layer, n_layer) else T.Q4_K
            return T.Q6_K if use_more_bits(i_layer, n_layer) else new
        if i_layer < n_layer // 8 and ft in ("IQ4_NL", "IQ4_XS"):
            return T.Q5_K  # (llama.cpp: only without an importance matrix, as here)
        if ft == "Q5_K_M" and use_more_bits(i_layer, n_layer):
            return T.Q6_K
        if ft == "Q4_K_S" and not falcon and i_layer < n_layer // 8:
            return T.Q5_K
        return new

    def _layer(self, counter: int, name: str) -> tuple[int, int]:
        """``layer_info``: the layer of an ffn tensor. Counted in visiting order, except in
        mixture-of-experts models, whose expert tensors are read from the name."""
        n_layer = self.model.n_layer
        if self.model.n_expert <= 1:
            return counter, n_layer
        m = _LAYER.match(name)
        if not m:
            raise GGUFError("cannot tell the layer of this tensor from its name", tensor=name)
        i = int(m.group(1))
        if not 0 <= i < n_layer:
            raise GGUFError(f"layer {i} is outside [0, {n_layer})", tensor=name)
        return i, n_layer


def requires_imatrix(name: str, gtype: GGMLType, file_type: FileType) -> bool:
    """``tensor_requires_imatrix``: llama-quantize refuses these without an importance
    matrix (the 1-2 bit IQ types, and Q2_K inside a Q2_K_S file)."""
    if category(name) in ("output", "token_embd"):
        return False
    if gtype in (T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_M, T.IQ1_S):
        return True
    return gtype == T.Q2_K and file_type.name == "Q2_K_S"
