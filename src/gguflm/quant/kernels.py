"""The hot loops on plain arrays, in one namespace: 8-bit activation quantization,
quantized and F16 matrix products, the gated activations.

How a product ``W (d_out, d_in) @ x (d_in,)`` runs, as in ggml's CPU backend:

1. ``x`` is quantized to 8 bits per block (``act_quant``), rounding exactly as ggml's x86
   code does, so our logits track llama.cpp's.
2. Each weight block is unpacked to small integers (``int_weights``, built from the type's
   declaration in ``kerneltypes.KERNEL_TYPES``) and multiplied with the activation integers
   with ggml's x86 float steps (the K-quants' integer lanes are our own: see
   ``int_tiles``), in tiles of weight rows times activation rows; every tile shape runs
   the same per-element sequence, so results are batch-invariant. Each weight type's
   tiles are compiled on their own, for the types a model has (``prepare``). From 8
   activation rows, Q4_K, Q6_K, Q3_K, Q2_K, Q8_0, Q4_0, Q5_0, IQ4_NL and IQ4_XS run as a
   GEMM over 8 weight rows at a time, unpacked once for all the rows (``int_gemm``; with
   AVX512-VNNI; Q4_K, Q6_K, Q8_0, Q4_0, Q5_0 and IQ4_NL on AVX2 and AVX-VNNI too), with
   the tiles' numbers.
3. Rows run in parallel work items (``products``).

The SIMD work is LLVM vector IR (``vector_ir``). F16 and BF16 weights have float tiles
(``float_tiles``); GeGLU and SwiGLU are ``glu``. Every kernel has a shape contract in one
comment and a slow numpy twin (``twin_*``, beside it or in ``kerneltypes``) that the tests
compare against.
"""

from __future__ import annotations

from .act_quant import (
    Q8_0_KINDS,
    Q8_K_KINDS,
    ActivationSet,
    activation_blocks,
    activation_sets,
    quantize_activations,
    quantize_q8_0,
    quantize_q8_k,
)
from .float_tiles import f16_matmul_par, f16_matmul_rows, twin_f16_matmul
from .glu import geglu, geglu_par, silu_par, swiglu, swiglu_par, twin_geglu, twin_silu, twin_swiglu
from .int_tiles import BATCH_MIN_ROWS, ROW_CHUNK, prepare, qmatmul_rows
from .int_weights import vnni_offset
from .products import (
    MAX_FUSED,
    is_compiled,
    pad_products,
    qmatmul,
    qmatmul_many,
    qmatmul_par,
    qmatmul_planned,
    qmatmul_serial,
    read_only,
    run_item,
    warm_up,
    work_items,
)
from .vector_ir import F16_TABLE, SIMD, VNNI

# the names the tests read
_Q8_0_KINDS, _Q8_K_KINDS = Q8_0_KINDS, Q8_K_KINDS


def check_build() -> None:
    """Nothing to do: stale machine code is recompiled by numba itself (``jitcache``'s
    stamps cover every source a kernel is built from)."""


__all__ = [
    "BATCH_MIN_ROWS",
    "F16_TABLE",
    "MAX_FUSED",
    "Q8_0_KINDS",
    "Q8_K_KINDS",
    "ROW_CHUNK",
    "SIMD",
    "VNNI",
    "ActivationSet",
    "activation_blocks",
    "activation_sets",
    "check_build",
    "f16_matmul_par",
    "f16_matmul_rows",
    "geglu",
    "geglu_par",
    "is_compiled",
    "pad_products",
    "prepare",
    "qmatmul",
    "qmatmul_many",
    "qmatmul_par",
    "qmatmul_planned",
    "qmatmul_rows",
    "qmatmul_serial",
    "quantize_activations",
    "quantize_q8_0",
    "quantize_q8_k",
    "read_only",
    "run_item",
    "silu_par",
    "swiglu",
    "swiglu_par",
    "twin_f16_matmul",
    "twin_geglu",
    "twin_silu",
    "twin_swiglu",
    "vnni_offset",
    "warm_up",
    "work_items",
]
