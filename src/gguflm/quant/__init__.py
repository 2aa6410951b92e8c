"""Numbers: every ggml tensor type decoded to float32 exactly as ggml does, and ggml's
quantizers.

- ``dequantize(tensor)``: a whole ``TensorInfo`` as float32, numpy order.
- ``dequantize_rows(tensor, start, stop)``: only rows ``start:stop`` (embedding lookups).
- ``dequantize_raw(type, raw, shape)``: the same on plain arrays.
- ``quantize(x, type)``: the bytes ggml's ``ggml_quantize_chunk`` writes (no importance
  matrix) for Q4_0..Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, F16, BF16, F32.
- ``quantize_file(src, dst, "Q4_K_M")``: llama-quantize's output file, byte for byte.
"""

from .dequant import dequantize, dequantize_raw, dequantize_rows, supported_types
from .formats import FORMATS, BlockFormat
from .quantize import QUANTIZERS, quantize
from .quantize_file import QuantizeReport, quantize_file

__all__ = [
    "FORMATS",
    "QUANTIZERS",
    "BlockFormat",
    "QuantizeReport",
    "dequantize",
    "dequantize_raw",
    "dequantize_rows",
    "quantize",
    "quantize_file",
    "supported_types",
]
