"""``gguflm tensor MODEL NAME -o OUT.npy``: one tensor as a numpy file (numpy order).

Plain types are written as they are (BF16 widened to float32, exactly); block-quantized
types are dequantized to float32 by ``gguflm.quant``. ``--raw`` writes the encoded bytes.
"""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path
from typing import Any

from . import CLIError
from .common import add_model_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tensor", help="write one tensor to a .npy file",
        description="Write tensor NAME of MODEL as a numpy .npy file in numpy order "
                    "(the reverse of ggml's shape). F32/F16/F64 and integer tensors keep "
                    "their type, BF16 becomes float32, quantized types are dequantized "
                    "to float32.")
    add_model_argument(p)
    p.add_argument("name", metavar="NAME", help="tensor name, e.g. token_embd.weight")
    p.add_argument("-o", "--output", metavar="OUT.npy", required=True, help="output file")
    p.add_argument("--raw", action="store_true",
                   help="write the encoded bytes instead (uint8 of shape (..., row_bytes) for "
                        "block types; BF16 as uint16 bits)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import gguf
    from ..gguf.types import PLAIN_DTYPES, GGMLType
    from .pull import resolve

    path = resolve(args.model)
    out = Path(args.output)
    if out.exists() and os.path.samefile(out, path):
        raise CLIError("the output would overwrite the model file")
    with gguf.open(path) as f:
        t = f.tensors.get(args.name)
        if t is None:
            raise CLIError(_unknown_tensor(args.name, list(f.tensors)))
        if args.raw or t.type in PLAIN_DTYPES and t.type != GGMLType.BF16:
            arr = t.data
            if arr.dtype.byteorder not in ("=", "|"):
                arr = arr.astype(arr.dtype.newbyteorder("="))  # .npy readers expect native
        else:
            arr = _dequantize(t)  # block types, and BF16 widened to float32 exactly
        _save(out, arr)
    kind = "raw bytes" if args.raw else str(arr.dtype)
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    print(f"{t.name}: {t.type.ggml_name} {shape} -> {out} ({kind}, numpy shape "
          f"{tuple(arr.shape)})")
    return 0


def _dequantize(t: Any) -> Any:
    try:
        from ..quant import dequantize, supported_types
    except ImportError as e:
        raise CLIError(f"cannot decode {t.type.ggml_name} tensors: dequantization is not "
                       f"available ({e}); use --raw for the encoded bytes") from None
    if t.type not in supported_types():
        raise CLIError(f"decoding {t.type.ggml_name} to float is not supported; use --raw "
                       "for the encoded bytes")
    return dequantize(t)


def _save(out: Path, arr: Any) -> None:
    """np.save to exactly ``out`` (np.save would append .npy to other names)."""
    import numpy as np

    try:
        with open(out, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
    except OSError as e:
        raise CLIError(f"cannot write {out}: {e.strerror or e}") from None


def _unknown_tensor(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
    close += [n for n in names if name in n and n not in close][: 5 - len(close)]
    if close:
        return f"no tensor named {name!r}; did you mean: {', '.join(close)}?"
    return f"no tensor named {name!r} (the file has {len(names)} tensors; see inspect --tensors)"
