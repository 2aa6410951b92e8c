"""``gguflm tensor MODEL NAME -o OUT.npy``: one tensor as a numpy file (numpy order).

Plain types are written as they are (BF16 widened to float32, exactly); block-quantized
types are dequantized to float32 by ``gguflm.quant``. ``--raw`` writes the encoded bytes.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import types
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
    from ..gguf.atomic import check_output_path
    from ..gguf.summary import printable
    from ..gguf.types import PLAIN_DTYPES, GGMLType
    from .pull import resolve

    path = resolve(args.model)
    out = Path(args.output)
    if out.exists() and os.path.samefile(out, path):
        raise CLIError("the output would overwrite the model file")
    check_output_path(out)  # a device, FIFO or directory would be replaced by the rename
    with gguf.open(path) as f:
        t = f.tensors.get(args.name)
        if t is None:
            raise CLIError(_unknown_tensor(args.name, list(f.tensors)))
        as_stored = args.raw or t.type in PLAIN_DTYPES and t.type != GGMLType.BF16
        swap = as_stored and t.data.dtype.byteorder not in ("=", "|")
        # as stored: written straight from the mapped file, unless bytes must be swapped
        size = t.nbytes if as_stored else 4 * t.n_elements
        _check_fits(t, out, size, allocates=swap or not as_stored)
        try:
            if as_stored:
                arr = t.data
                if arr.dtype.byteorder not in ("=", "|"):
                    arr = arr.astype(arr.dtype.newbyteorder("="))  # .npy readers want native
            else:
                arr = _dequantize(t)  # block types, and BF16 widened to float32 exactly
        except MemoryError:
            raise CLIError(f"not enough memory to decode tensor {printable(t.name)} "
                           f"({_size(size)}); --raw writes its encoded bytes") from None
        _save(out, arr)
    kind = "raw bytes" if args.raw else str(arr.dtype)
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    print(f"{printable(t.name)}: {t.type.ggml_name} {shape} -> {out} ({kind}, numpy shape "
          f"{tuple(arr.shape)})")
    return 0


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _check_fits(t: Any, out: Path, size: int, allocates: bool) -> None:
    """Refuse before starting what cannot finish: decoding into more memory than the machine
    has (numpy would raise MemoryError, or the kernel kill us later), or a file larger than
    the free space on the output's disk."""
    from ..gguf.summary import printable

    name = printable(t.name)
    if allocates:
        avail = _available_memory()
        if avail is not None and size > avail:
            raise CLIError(
                f"tensor {name} has {t.n_elements:,} elements: decoding it takes "
                f"{_size(size)}, more than the {_size(avail)} of memory available; --raw "
                "writes its encoded bytes without decoding them")
    folder = out.parent if str(out.parent) else Path(".")
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # the write itself will say what is wrong with the folder
    if size > free:
        raise CLIError(f"cannot write {out}: tensor {name} needs {_size(size)} and the disk "
                       f"has {_size(free)} free")


def _available_memory() -> int | None:
    """Bytes this process could still allocate: MemAvailable (Linux), else physical memory;
    lowered by an address-space limit (ulimit -v)."""
    import resource

    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        avail = soft if avail is None else min(avail, soft)
    return avail


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
    """np.save to exactly ``out`` (np.save would append .npy to other names), through a
    temporary file renamed when complete: a full disk leaves no partial .npy behind."""
    import numpy as np

    from ..gguf.atomic import atomic_write

    try:
        with atomic_write(out) as fh:
            # through .write() only: given the file itself, np.save calls tofile(), whose
            # short writes (a full disk) lose the errno ("65536 requested and 16352 written")
            np.save(types.SimpleNamespace(write=fh.write), arr, allow_pickle=False)
    except OSError as e:
        raise CLIError(f"cannot write {out}: {e.strerror or e}") from None


def _unknown_tensor(name: str, names: list[str]) -> str:
    from ..gguf.summary import printable

    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
    close += [n for n in names if name in n and n not in close][: 5 - len(close)]
    if close:
        return (f"no tensor named {name!r}; did you mean: "
                f"{', '.join(printable(n) for n in close)}?")
    return (f"no tensor named {name!r} (the file has {len(names)} tensors; see "
            "inspect --tensors)")
