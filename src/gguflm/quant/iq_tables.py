"""The IQ quantization grids: ggml's lookup tables of 4- and 8-value lattice points.

The tables are data, not derivable by a short formula: ``grids/*.npy`` hold them as they
appear in ggml's ``ggml/src/ggml-common.h`` (llama.cpp 0c1e570, vendored by
llama-cpp-python 0.3.36, MIT licence), one row per grid point, one byte per value, in
memory order (ggml reads each ``uint64``/``uint32`` entry as bytes on a little-endian
machine). ``iq1s`` values are signed (-1, 0, 1); the others are unsigned magnitudes.

Regenerate with ``python -m gguflm.quant.iq_tables path/to/ggml-common.h``.
"""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

import numpy as np

GRID_DIR = Path(__file__).with_name("grids")

# our name -> (table name in ggml-common.h, entries, bytes per entry, signed values)
GRIDS = {
    "iq2xxs": ("iq2xxs_grid", 256, 8, False),
    "iq2xs": ("iq2xs_grid", 512, 8, False),
    "iq2s": ("iq2s_grid", 1024, 8, False),
    "iq3xxs": ("iq3xxs_grid", 256, 4, False),
    "iq3s": ("iq3s_grid", 512, 4, False),
    "iq1s": ("iq1s_grid", 2048, 8, True),
}


@cache
def grid(name: str) -> np.ndarray:
    """Grid ``name`` as (entries, values) uint8 (int8 for ``iq1s``), read-only."""
    table, n, width, signed = GRIDS[name]
    arr = np.load(GRID_DIR / f"{name}.npy")
    if arr.shape != (n, width) or arr.dtype != (np.int8 if signed else np.uint8):
        raise RuntimeError(f"corrupt grid table {name}.npy: {arr.shape} {arr.dtype}")
    arr.flags.writeable = False
    return arr


def ksigns() -> np.ndarray:
    """ggml's ``ksigns_iq2xs``: 7 stored sign bits plus an 8th making the count even.

    Returns (128, 8) float32 of +1/-1, entry k's column j being -1 where bit j is set.
    """
    k = np.arange(128, dtype=np.uint8)
    parity = np.unpackbits(k[:, None], axis=1).sum(axis=1) & 1
    full = k | (parity.astype(np.uint8) << 7)
    bits = np.unpackbits(full[:, None], axis=1, bitorder="little")
    return np.where(bits == 1, np.float32(-1), np.float32(1))


def parse_header(text: str) -> dict[str, np.ndarray]:
    """Extract the grid tables from the text of ggml-common.h."""
    out = {}
    for name, (table, n, width, signed) in GRIDS.items():
        m = re.search(rf"GGML_TABLE_BEGIN\(uint{width * 8}_t, {table}, \w+\)(.*?)"
                      r"GGML_TABLE_END\(\)", text, re.S)
        if m is None:
            raise ValueError(f"table {table} not found")
        vals = [int(v, 16) for v in re.findall(r"0x[0-9a-fA-F]+", m.group(1))]
        if len(vals) != n:
            raise ValueError(f"table {table}: {len(vals)} entries, expected {n}")
        arr = np.array(vals, dtype=f"<u{width}").view(np.uint8).reshape(n, width)
        out[name] = arr.view(np.int8) if signed else arr
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gguflm.quant.iq_tables path/to/ggml-common.h", file=sys.stderr)
        return 2
    tables = parse_header(Path(argv[0]).read_text())
    GRID_DIR.mkdir(exist_ok=True)
    for name, arr in tables.items():
        np.save(GRID_DIR / f"{name}.npy", arr)
        print(f"{name}: {arr.shape} {arr.dtype}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
