"""Metadata read speed and memory: gguflm's reader vs gguf-py's GGUFReader, same run.

    python benchmarks/bench_parse.py [--repeat 5] [--oracle .venv-oracle/bin/python]

What is measured, for each real model (SmolLM2 135M, Gemma 3 270M), each side in its own
fresh subprocess:

- parse: open the file and read the whole header, so that every metadata value and
  every tensor description is available. gguflm: ``gguflm.gguf.open`` (scalars decoded,
  numeric arrays as views, string arrays indexed); gguf-py: ``GGUFReader(path)``, which
  likewise walks every field and tensor info and builds views of them. Best of N runs
  (gguf-py: one run, it takes seconds).
- parse + decode: the above, then every element of every string array decoded to a
  Python ``str`` (gguflm: ``StringArray.tolist()``; gguf-py: ``bytes(field.parts[i])
  .decode()`` over ``field.data``, the documented way to get them).
- added RSS: the process's resident memory after opening minus before (after imports),
  for Gemma's 262k-token vocabulary; anonymous memory and file-backed pages separately.

Bars (issue 2): parse at least 50x faster than gguf-py, and under 30 MB of added RSS.
gguf-py comes from the oracle venv (``/work/main/.venv-oracle``), never from ours.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))
MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}


def _rss() -> dict[str, int]:
    """Resident memory in bytes: total, anonymous, file-backed (Linux /proc)."""
    out = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, val = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(val.split()[0]) * 1024
    except OSError:
        import resource

        out["VmRSS"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def _delta(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in a if k in b}


def worker_ours(path: str, repeat: int) -> dict:
    import gc

    import gguflm.gguf as gguf

    gc.collect()
    rss0 = _rss()
    t = time.perf_counter()
    f = gguf.open(path)
    first = time.perf_counter() - t
    rss1 = _rss()
    t = time.perf_counter()
    n_strings = 0
    decoded = []
    for v in f.metadata.values():
        if isinstance(v, gguf.StringArray):
            decoded.append(v.tolist())
            n_strings += len(v)
    decode = time.perf_counter() - t
    rss2 = _rss()
    f.close()
    del decoded
    best = first
    for _ in range(repeat - 1):
        t = time.perf_counter()
        gguf.open(path).close()
        best = min(best, time.perf_counter() - t)
    return {"parse_first": first, "parse_best": best, "decode": decode,
            "n_strings": n_strings, "rss_open": _delta(rss0, rss1),
            "rss_decoded": _delta(rss0, rss2)}


def worker_ggufpy(path: str, repeat: int) -> dict:
    import gc

    from gguf import GGUFReader, GGUFValueType

    gc.collect()
    rss0 = _rss()
    t = time.perf_counter()
    r = GGUFReader(path)
    first = time.perf_counter() - t
    rss1 = _rss()
    t = time.perf_counter()
    n_strings = 0
    decoded = []
    for field in r.fields.values():
        if field.types and field.types[0] == GGUFValueType.ARRAY and \
                field.types[-1] == GGUFValueType.STRING:
            decoded.append([bytes(field.parts[i]).decode("utf-8", "surrogateescape")
                            for i in field.data])
            n_strings += len(field.data)
    decode = time.perf_counter() - t
    rss2 = _rss()
    return {"parse_first": first, "parse_best": first, "decode": decode,
            "n_strings": n_strings, "rss_open": _delta(rss0, rss1),
            "rss_decoded": _delta(rss0, rss2), "n_tensors": len(r.tensors)}


def run_worker(python: str, side: str, path: Path, repeat: int) -> dict:
    cmd = [python, __file__, "--worker", side, str(path), "--repeat", str(repeat)]
    env = dict(os.environ)
    if side == "gguf-py":
        env.pop("PYTHONPATH", None)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{side} worker failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def mb(n: int) -> str:
    return f"{n / 1e6:6.1f} MB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="gguflm runs per model (best of)")
    ap.add_argument("--oracle", default=os.environ.get(
        "GGUFLM_ORACLE_PYTHON", str(REPO / ".venv-oracle" / "bin" / "python")),
        help="a Python with gguf-py installed")
    ap.add_argument("--worker", nargs=2, metavar=("SIDE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        side, path = args.worker
        fn = worker_ours if side == "gguflm" else worker_ggufpy
        print(json.dumps(fn(path, args.repeat)))
        return 0

    have_oracle = Path(args.oracle).exists()
    if not have_oracle:
        print(f"gguf-py oracle not found at {args.oracle}: gguflm figures only")
    ok = True
    for name, fname in MODELS.items():
        path = CACHE / fname
        if not path.is_file():
            print(f"{name}: not in the cache ({path}); run `gguflm pull {name}`")
            ok = False
            continue
        ours = run_worker(sys.executable, "gguflm", path, args.repeat)
        print(f"\n{name} ({path.stat().st_size / 1e6:.0f} MB file, "
              f"{ours['n_strings']} strings in string arrays)")
        print(f"  gguflm   parse {ours['parse_best'] * 1e3:8.1f} ms (first "
              f"{ours['parse_first'] * 1e3:.1f} ms)  + decode all strings "
              f"{ours['decode'] * 1e3:7.1f} ms")
        ro, rd = ours["rss_open"], ours["rss_decoded"]
        print(f"           added RSS after open {mb(ro['VmRSS'])} (anon "
              f"{mb(ro.get('RssAnon', 0))}, file {mb(ro.get('RssFile', 0))}); "
              f"after decoding every string {mb(rd['VmRSS'])}")
        if have_oracle:
            py = run_worker(args.oracle, "gguf-py", path, 1)
            ratio = py["parse_best"] / ours["parse_best"]
            ratio_all = (py["parse_best"] + py["decode"]) / (ours["parse_best"] + ours["decode"])
            print(f"  gguf-py  parse {py['parse_best'] * 1e3:8.1f} ms"
                  f"{'':>19}+ decode all strings {py['decode'] * 1e3:7.1f} ms")
            print(f"           added RSS after open {mb(py['rss_open']['VmRSS'])}")
            print(f"  speed-up: parse {ratio:.0f}x, parse + decode {ratio_all:.0f}x "
                  f"(bar: 50x) {'OK' if ratio >= 50 else 'BELOW BAR'}")
            ok &= ratio >= 50
        if name == "gemma3-270m":
            added = ro["VmRSS"]
            print(f"  Gemma added RSS after open: {mb(added)} (bar: 30 MB) "
                  f"{'OK' if added < 30e6 else 'ABOVE BAR'}")
            ok &= added < 30e6
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
