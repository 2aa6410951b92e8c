"""Long fuzz run of the GGUF reader: mutate real headers, open, touch everything.

    python benchmarks/fuzz_long.py [--seconds 300] [--seed 1] [--save DIR]

Bases: every vocabulary file in shared/reference/vocab, the tiny reference models, a
writer-made file with every value type and nested arrays, and the headers of the cached
real models (written as sparse files of the real size, so the tensor data is in bounds).
Mutations: byte flips/sets, insertions, deletions, truncations and interesting u32/u64
values over counts and lengths, mostly in the first KBs, some anywhere in the header.

Every outcome must be "ok" or a GGUFError subclass; anything else is a failure (saved to
--save, exit status 1). The memory ``open`` allocates is traced per case (tracemalloc
peak) and must stay under 32 MB plus the size of the file: the reader's only allocation
that grows with a count is the string-array index (8 bytes per string, and every string
takes at least 8 bytes of file), and sparse tensor data full of zeros really is a very
long array of empty strings to a mutated count. The largest peak and the process's max
RSS are printed with the outcome counts.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import resource
import struct
import sys
import tempfile
import time
import traceback
import tracemalloc
import warnings
from pathlib import Path

import numpy as np

import gguflm.gguf as gguf
from gguflm.gguf import GGMLType, GGUFError, GGUFWarning, GGUFWriter, ValueType

REPO = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE", REPO.parent / "shared" / "reference"))
CACHE = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))
MEMORY_LIMIT = 32 << 20
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 31, 32, 33, 63, 64, 255, 256, 0xFFFF,
               1 << 30, (1 << 30) + 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62,
               2**63 - 1, 2**63, 2**64 - 1]


def small_file(folder: Path) -> bytes:
    w = GGUFWriter(folder / "small.gguf")
    for t in ValueType:
        if t not in (ValueType.ARRAY, ValueType.STRING):
            v = True if t == ValueType.BOOL else 1
            w.add(f"s.{t.name.lower()}", v, t)
            w.add(f"a.{t.name.lower()}", [v, v], gguf.ArrayType(t))
    w.add("tokenizer.ggml.tokens", ["<s>", "a", "bc", "\u00e9"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFWarning)
        w.add("nested", [[1, 2], ["x"], []], gguf.ArrayType(gguf.ArrayType(ValueType.INT32)))
    w.add_tensor("a", np.arange(8, dtype=np.float32))
    w.add_tensor("b", np.zeros((2, 34), np.uint8), type=GGMLType.Q8_0)
    w.add_tensor("c", np.ones((3, 4), np.float16))
    return w.write().read_bytes()


def bases(folder: Path) -> list[tuple[str, bytes, int, int]]:
    """(name, header bytes, header length, real file size) for each base."""
    out = []
    small = small_file(folder)
    out.append(("writer-small", small, len(small), len(small)))
    files = sorted((REFERENCE / "vocab").glob("*.gguf")) + sorted(REFERENCE.glob("tiny-*/*.gguf"))
    files += sorted(CACHE.glob("*.gguf"))
    for p in files:
        with gguf.open(p) as f:
            header_end = f.data_offset
            size = f.file_size
        with open(p, "rb") as fh:
            head = fh.read(header_end)
        out.append((p.name, head, header_end, size))
    return out


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        # mostly the first 4 KB (magic, counts, first keys); sometimes anywhere
        pos = rng.randrange(min(len(b), 4096) + 1) if rng.random() < 0.8 else \
            rng.randrange(len(b) + 1)
        kind = rng.choice(["flip", "set", "insert", "delete", "truncate", "u32", "u64"])
        if kind == "flip" and pos < len(b):
            b[pos] ^= 1 << rng.randrange(8)
        elif kind == "set" and pos < len(b):
            b[pos] = rng.randrange(256)
        elif kind == "insert":
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif kind == "delete":
            del b[pos:pos + rng.randint(1, 16)]
        elif kind == "truncate" and rng.random() < 0.3:
            del b[pos:]
        elif kind == "u32":
            b[pos:pos + 4] = struct.pack("<I", rng.choice(INTERESTING) & 0xFFFFFFFF)
        elif kind == "u64":
            b[pos:pos + 8] = struct.pack("<Q", rng.choice(INTERESTING))
    return bytes(b)


def run_case(path: Path) -> tuple[str, int]:
    """Open under tracemalloc (the parse must stay bounded), then touch every value and
    tensor view (decoding 262k strings legitimately allocates tens of MB, so untraced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFWarning)
        tracemalloc.start()
        try:
            f = gguf.open(path)
        except GGUFError as e:
            return type(e).__name__, tracemalloc.get_traced_memory()[1]
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        with f:
            for v in f.metadata.values():
                if isinstance(v, gguf.StringArray):
                    v.tolist()
                elif isinstance(v, list):
                    repr(v)
            for t in f.tensors.values():
                d = t.data
                if d.size:
                    d.reshape(-1)[-1]
    return "ok", peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--iterations", type=int, default=0, help="stop after N cases (0: time)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--save", type=Path, default=None, help="folder for failing inputs")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    counts: collections.Counter[str] = collections.Counter()
    per_base: collections.Counter[str] = collections.Counter()
    failures = 0
    peak_max = 0
    with tempfile.TemporaryDirectory(prefix="gguf-fuzz-") as tmp:
        folder = Path(tmp)
        all_bases = bases(folder)
        print(f"{len(all_bases)} bases: " + ", ".join(b[0] for b in all_bases))
        case = folder / "case.gguf"
        start = time.monotonic()
        n = 0
        while True:
            if args.iterations and n >= args.iterations:
                break
            if not args.iterations and time.monotonic() - start > args.seconds:
                break
            name, head, header_len, size = rng.choice(all_bases)
            data = mutate(head, rng)
            with open(case, "wb") as fh:
                fh.write(data)
                if size > header_len and len(data) >= header_len - 64:
                    fh.truncate(size + len(data) - header_len)  # sparse tensor data
            n += 1
            per_base[name] += 1
            try:
                outcome, peak = run_case(case)
            except Exception:  # noqa: BLE001 - the whole point: report anything else
                failures += 1
                counts["FAILURE"] += 1
                print(f"FAILURE on a mutation of {name}:\n{traceback.format_exc()}")
                if args.save:
                    args.save.mkdir(parents=True, exist_ok=True)
                    (args.save / f"fail-{failures}.gguf").write_bytes(data)
                continue
            counts[outcome] += 1
            peak_max = max(peak_max, peak)
            if peak > MEMORY_LIMIT + os.path.getsize(case):
                failures += 1
                print(f"FAILURE: {peak} bytes traced on a mutation of {name}")
        elapsed = time.monotonic() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{n} cases in {elapsed:.1f} s ({n / elapsed:.0f}/s), seed {args.seed}")
    for k, v in counts.most_common():
        print(f"  {k:<18} {v}")
    print(f"cases per base: {dict(per_base)}")
    print(f"max traced memory in one open: {peak_max / 1e6:.1f} MB (limit "
          f"{MEMORY_LIMIT / 1e6:.0f} MB + the file's size); max RSS {rss:.0f} MB")
    print("failures:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
