"""Long fuzz run of the GGUF reader and of `gguflm inspect`'s summary.

    python benchmarks/fuzz_long.py [--seconds 300] [--seed 1] [--save DIR]
                                   [--mode reader|summary|both]

Reader (``--mode reader``): mutate real headers, open, touch everything. Bases: every
vocabulary file in shared/reference/vocab, the tiny reference models, a writer-made file
with every value type and nested arrays, and the headers of the cached real models (written
as sparse files of the real size, so the tensor data is in bounds). Mutations: byte
flips/sets, insertions, deletions, truncations and interesting u32/u64 values over counts
and lengths, mostly in the first KBs, some anywhere in the header.

Every outcome must be "ok" or a GGUFError subclass; anything else is a failure (saved to
--save, exit status 1). A mutation that still opens is also inspected, as below. The memory
``open`` allocates is traced per case (tracemalloc peak) and must stay under 32 MB plus the
size of the file: the reader's only allocation that grows with a count is the string-array
index (8 bytes per string, and every string takes at least 8 bytes of file), and sparse
tensor data full of zeros really is a very long array of empty strings to a mutated count.
The largest peak and the process's max RSS are printed with the outcome counts.

Summary (``--mode summary``): well-formed files from the writer whose known keys (every key
the summary reads: architecture, name, file type, tokens, special-token ids, the
architecture's sizes, sliding window, soft-capping...) hold values of random types, random
extreme values (NaN, huge ids, empty arrays, control characters, invalid UTF-8), with a few
small tensors or none. ``gguflm inspect`` runs on each in four ways (text, ``--json``,
``--tensors``, ``--query``); a failure is an exception out of the command, a ``--json`` whose
stdout is not exactly one JSON document (or, on an error, not empty), or text output with a
raw control character in it. ``--mode both`` (the default) alternates the two.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import math
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
from gguflm.cli import main as cli_main
from gguflm.gguf import ArrayType, GGMLType, GGUFError, GGUFWarning, GGUFWriter, ValueType
from gguflm.gguf.summary import _CONTROL, SPECIAL_TOKENS

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


# -- the summary: random value types for the keys it reads ----------------------------------

# key -> its right type (None: the architecture's keys take ``{arch}.`` in front)
SUMMARY_KEYS: dict[str, object] = {
    "general.architecture": ValueType.STRING, "general.name": ValueType.STRING,
    "general.file_type": ValueType.UINT32, "tokenizer.ggml.model": ValueType.STRING,
    "tokenizer.ggml.pre": ValueType.STRING, "tokenizer.ggml.tokens": ArrayType(ValueType.STRING),
    "tokenizer.ggml.add_bos_token": ValueType.BOOL, "tokenizer.ggml.add_eos_token": ValueType.BOOL,
    "tokenizer.chat_template": ValueType.STRING,
    **{f"tokenizer.ggml.{n}_token_id": ValueType.UINT32 for n in SPECIAL_TOKENS},
}
ARCH_KEYS: dict[str, object] = {
    "vocab_size": ValueType.UINT32, "context_length": ValueType.UINT32,
    "embedding_length": ValueType.UINT32, "block_count": ValueType.UINT32,
    "feed_forward_length": ValueType.UINT32, "attention.head_count": ValueType.UINT32,
    "attention.head_count_kv": ValueType.UINT32, "attention.key_length": ValueType.UINT32,
    "attention.value_length": ValueType.UINT32, "attention.sliding_window": ValueType.UINT32,
    "attention.sliding_window_pattern": ArrayType(ValueType.BOOL),
    "attn_logit_softcapping": ValueType.FLOAT32, "final_logit_softcapping": ValueType.FLOAT32,
}
ARCHS = ["llama", "gemma3", "qwen2", "phi3", "mamba", "x\x1b[2J", ""]
STRINGS: list[str | bytes] = ["", "a", "llama", "gemma3", "<s>", "\x1b]0;title\x07\x1b[2J",
                              "a\x00b", "\u202eevil", "caf\u00e9 \U0001f600", b"\xff\xfe\x80",
                              "x" * 300, "\n\t\r"]
LAST_REFUSAL = ""
SCALARS = [t for t in ValueType if t not in (ValueType.ARRAY,)]


def random_type(rng: random.Random, depth: int = 0) -> object:
    if depth < 2 and rng.random() < 0.3:
        return ArrayType(random_type(rng, depth + 1))  # type: ignore[arg-type]
    return rng.choice(SCALARS)


def random_value(rng: random.Random, t: object) -> object:
    if isinstance(t, ArrayType):
        n = rng.choice([0, 1, 2, 3, 5, 40])
        items = [random_value(rng, t.elem) for _ in range(n)]
        if t.elem not in (ValueType.STRING, ValueType.BOOL) and not isinstance(t.elem, ArrayType):
            return np.array(items, dtype=t.elem.name.lower())  # exact, even for uint64
        return items
    if t == ValueType.STRING:
        return rng.choice(STRINGS)
    if t == ValueType.BOOL:
        return rng.random() < 0.5
    if t in (ValueType.FLOAT32, ValueType.FLOAT64):
        return rng.choice([0.0, -0.0, 1.5, 30.0, math.nan, math.inf, -math.inf, 1e38,
                           rng.uniform(-1e6, 1e6)])
    info = np.iinfo(np.dtype(t.name.lower()))  # type: ignore[union-attr]
    return rng.choice([0, 1, 2, 3, 7, 64, int(info.max), int(info.min),
                       rng.randint(int(info.min), int(info.max))])


def summary_file(path: Path, rng: random.Random) -> bool:
    """A well-formed file with the summary's keys of random types; False if the writer
    refused the combination (not a finding: the writer validates what it writes)."""
    arch = rng.choice(ARCHS)
    keys = dict(SUMMARY_KEYS)
    keys.update({f"{arch}.{k}": t for k, t in ARCH_KEYS.items()})
    w = GGUFWriter(path)
    for key, right in keys.items():
        if rng.random() < 0.3:
            continue
        t = right if rng.random() < 0.5 else random_type(rng)
        if key == "general.architecture" and t == ValueType.STRING:
            value: object = arch
        elif key == "tokenizer.ggml.tokens" and t == right:
            value = [rng.choice(STRINGS) for _ in range(rng.choice([0, 1, 5, 300]))]
        else:
            value = random_value(rng, t)
        try:
            w.add(key, value, t)  # type: ignore[arg-type]
        except GGUFError as e:
            global LAST_REFUSAL
            LAST_REFUSAL = str(e)
            return False
    for name in rng.sample(["token_embd.weight", "output.weight", "blk.0.attn_q.weight"],
                           rng.randint(0, 3)):
        if rng.random() < 0.5:
            w.add_tensor(name, np.zeros((2, 34), np.uint8), type=GGMLType.Q8_0)  # 2 x 32
        else:
            w.add_tensor(name, np.zeros((2, 32), rng.choice([np.float32, np.float16])))
    w.write()
    return True


ALL_WAYS = ([], ["--json"], ["--tensors"], ["--query", "token"])
QUICK_WAYS = ([], ["--json", "--query", "general."])  # real vocabularies make full JSON slow


def inspect_case(path: Path, ways: tuple[list[str], ...] = ALL_WAYS) -> tuple[str, str | None]:
    """Run inspect in each way; (outcome, failure description or None)."""
    outcome = "ok"
    for extra in ways:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(["inspect", str(path), *extra])
        text = out.getvalue()
        if code not in (0, 1):
            return "FAILURE", f"inspect {extra}: exit status {code}"
        if "--json" in extra:
            if code == 0:
                if text.count("\n") != 1:
                    return "FAILURE", "--json: not one line"
                json.loads(text)
            elif text:
                return "FAILURE", "--json: output on error"
        elif _CONTROL.search(text.replace("\n", "")):
            return "FAILURE", f"inspect {extra}: raw control character in the output"
        if code == 1:
            outcome = "error: " + err.getvalue().split(":", 2)[-1].strip()[:40]
    return outcome, None


def run_summary_case(path: Path, rng: random.Random) -> tuple[str, str | None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFWarning)
        if not summary_file(path, rng):
            return "unwritable", None
        return inspect_case(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--iterations", type=int, default=0, help="stop after N cases (0: time)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--save", type=Path, default=None, help="folder for failing inputs")
    ap.add_argument("--mode", choices=["reader", "summary", "both"], default="both")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    counts: collections.Counter[str] = collections.Counter()
    summary_counts: collections.Counter[str] = collections.Counter()
    per_base: collections.Counter[str] = collections.Counter()
    failures = 0
    peak_max = 0
    with tempfile.TemporaryDirectory(prefix="gguf-fuzz-") as tmp:
        folder = Path(tmp)
        all_bases = bases(folder) if args.mode != "summary" else []
        if all_bases:
            print(f"{len(all_bases)} bases: " + ", ".join(b[0] for b in all_bases))
        case = folder / "case.gguf"
        start = time.monotonic()
        n = n_summary = 0
        while True:
            if args.iterations and n + n_summary >= args.iterations:
                break
            if not args.iterations and time.monotonic() - start > args.seconds:
                break
            if args.mode == "summary" or args.mode == "both" and (n + n_summary) % 2:
                n_summary += 1
                try:
                    outcome, problem = run_summary_case(case, rng)
                except Exception:  # noqa: BLE001 - the whole point: report anything else
                    outcome, problem = "FAILURE", traceback.format_exc()
                summary_counts[outcome if not outcome.startswith("error") else "error"] += 1
                if problem is not None:
                    failures += 1
                    print(f"FAILURE (summary): {problem}")
                    if args.save:
                        args.save.mkdir(parents=True, exist_ok=True)
                        (args.save / f"fail-{failures}.gguf").write_bytes(case.read_bytes())
                continue
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
            if outcome == "ok":  # a mutated file that still opens: the summary must cope
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", GGUFWarning)
                    outcome, problem = inspect_case(case, QUICK_WAYS)
                if problem is not None:
                    failures += 1
                    print(f"FAILURE (inspect of a mutation of {name}): {problem}")
                    outcome = "FAILURE"
            counts[outcome if not outcome.startswith("error") else "ok, inspect error"] += 1
            peak_max = max(peak_max, peak)
            if peak > MEMORY_LIMIT + os.path.getsize(case):
                failures += 1
                print(f"FAILURE: {peak} bytes traced on a mutation of {name}")
        elapsed = time.monotonic() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    total = n + n_summary
    print(f"{total} cases in {elapsed:.1f} s ({total / elapsed:.0f}/s), seed {args.seed}")
    if n:
        print(f"reader: {n} mutated files")
        for k, v in counts.most_common():
            print(f"  {k:<18} {v}")
        print(f"cases per base: {dict(per_base)}")
        print(f"max traced memory in one open: {peak_max / 1e6:.1f} MB (limit "
              f"{MEMORY_LIMIT / 1e6:.0f} MB + the file's size); max RSS {rss:.0f} MB")
    if n_summary:
        print(f"summary: {n_summary} random files, inspect run 4 ways on each")
        for k, v in summary_counts.most_common():
            print(f"  {k:<18} {v}")
    print("failures:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
