"""Numbers: every ggml tensor type decoded to float32 exactly as ggml does, and the simple
reference quantizers.

- ``dequantize(tensor)``: a whole ``TensorInfo`` as float32, numpy order.
- ``dequantize_rows(tensor, start, stop)``: only rows ``start:stop`` (embedding lookups).
- ``dequantize_raw(type, raw, shape)``: the same on plain arrays.
- ``quantize(x, type)``: ggml's ``quantize_row_*_ref`` for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.
"""

from .dequant import dequantize, dequantize_raw, dequantize_rows, supported_types
from .formats import FORMATS, BlockFormat
from .quantize import QUANTIZERS, quantize

__all__ = [
    "FORMATS",
    "QUANTIZERS",
    "BlockFormat",
    "dequantize",
    "dequantize_raw",
    "dequantize_rows",
    "quantize",
    "supported_types",
]
