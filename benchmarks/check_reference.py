"""Every bar of the engine and Gemma 3 issues, measured against one reference folder.

    .venv/bin/python benchmarks/check_reference.py [REF] [--model PATH] [--skip-ppl] [--skip-run]

REF is a folder name under shared/reference (default gemma3-270m-q4_k_m; also
smollm2-135m-q4_1, tiny-llama-f16, tiny-llama-q4_0); the model is the reference's own file
when the folder holds one, else the pulled model of that name.

Prints: tokenizer agreement (tokenize.json, greedy.json prompts) and load time;
teacher-forced logits on all nine cases (de-shifted top-20 worst and median step, top-1
agreement where llama.cpp's margin >= 1.0, de-meaned last-prompt logits); free-running
greedy through ``gguflm run --temp 0 --json`` (first differing step and llama.cpp's margin
there); perplexity at -c 128 and -c 1024 (signed difference); and, from a separate
``gguflm run -n 64`` process, open-to-first-token time and peak RSS against the memory bar
1.5 x (file + KV cache). Slow on two cores (several minutes); the CI tests check a subset.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE", REPO.parent / "shared" / "reference"))
FOLDER = REFERENCE / "gemma3-270m-q4_k_m"  # set from the command line in main()
PULLED = {"gemma3-270m-q4_k_m": "gemma3-270m", "smollm2-135m-q4_1": "smollm2-135m"}
sys.path.insert(0, str(REPO / "tests"))

from refcheck import load_cases, run_reference  # noqa: E402


def tokenizer_bars(path: Path):
    from gguflm.tokenizer import Tokenizer

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(path)
    t_load = time.perf_counter() - t0
    tj = FOLDER / "tokenize.json"
    cases = json.loads(tj.read_text())["cases"] if tj.is_file() else []
    ok = sum(tok.encode(c["text"], add_special=False, parse_special=c["parse_special"])
             == c["ids"] and tok.decode(c["ids"]) == c["detokenized"] for c in cases)
    greedy = load_cases(FOLDER)
    prompts = sum(tok.encode(c["prompt"], add_special=True, parse_special=c["special"])
                  == c["prompt_tokens"] for c in greedy)
    print(f"tokenizer    load {t_load:.2f} s; tokenize.json {ok}/{len(cases)}; "
          f"greedy.json prompt_tokens {prompts}/{len(greedy)}")
    return tok


def teacher_forced(model) -> None:
    t0 = time.perf_counter()
    steps = run_reference(model, FOLDER)
    s = steps.summary()
    worst = steps.where[int(np.argmax(steps.dev))]
    bad = steps.disagreements(1.0)
    print(f"teacher      {s['steps']} steps in {time.perf_counter() - t0:.1f} s: worst "
          f"de-shifted step {s['dev_max']:.3f} at {worst} (bar 2.5), median step max|d| "
          f"{s['raw_median']:.3f} (bar 0.6; de-shifted {s['dev_median']:.3f})")
    print(f"             last-prompt logits de-meaned: max {s['last_max']:.3f} (bar 2.0), "
          f"p99 {s['last_p99']:.3f} (bar 1.0); top-1 agreement {s['agree']:.1%}, "
          f"disagreements at margin >= 1.0: {bad or 'none'}; at margin >= 0.25 (the F16 "
          f"tiny models' bar): {steps.disagreements(0.25) or 'none'}")


def free_running(path: Path) -> None:
    from gguflm.cli import main

    full = 0
    for case in load_cases(FOLDER):
        args = ["run", str(path), "-p", case["prompt"], "-n", str(len(case["generated_tokens"])),
                "--temp", "0", "--json"] + (["--special"] if case["special"] else [])
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(args) == 0
        got = json.loads(buf.getvalue())["generated_tokens"]
        want = case["generated_tokens"]
        diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if diff is None and len(got) == len(want):
            full += 1
            print(f"greedy       {case['id']:8s} all {len(want)} tokens match")
            continue
        if diff is None:
            print(f"greedy       {case['id']:8s} lengths differ: {len(got)} vs {len(want)}")
            continue
        top = case["top_logits"][diff]
        margin = top[0][1] - top[1][1]
        print(f"greedy       {case['id']:8s} first differs at step {diff}: llama.cpp's margin "
              f"{margin:.3f} ({'ok' if margin < 1.0 else 'FAIL'}: bar < 1.0)")
    print(f"greedy       {full}/{len(load_cases(FOLDER))} cases match all tokens")


def perplexities(model, tok) -> None:
    from gguflm.engine.perplexity import perplexity

    for file in sorted(FOLDER.glob("perplexity*.json")):
        want = json.loads(file.read_text())
        n_ctx = want["n_ctx"]
        text = (REFERENCE / "text" / want["text_file"]).read_text(encoding="utf-8")
        tokens = tok.encode(text, add_special=True)
        t0 = time.perf_counter()
        res = perplexity(model, tokens, n_ctx, bos_id=tok.bos_id if tok.add_bos else None)
        rel = res.ppl / want["final_ppl"] - 1
        print(f"perplexity   -c {n_ctx}: {res.ppl:.4f} vs llama.cpp {want['final_ppl']:.4f} "
              f"({rel:+.2%}, bar 1%) in {time.perf_counter() - t0:.1f} s")


def run_process(path: Path) -> None:
    """Peak RSS and load time of a fresh ``gguflm run -n 64`` process."""
    case = load_cases(FOLDER)[0]
    cmd = [sys.executable, "-m", "gguflm.cli", "run", str(path), "-p", case["prompt"], "-n", "64",
           "--temp", "0", "--json"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    got = json.loads(out)
    t = got["timings"]
    first = t["load_seconds"] + t["prompt_seconds"]
    from gguflm import load_model

    kv = load_model(path).new_cache(got["n_ctx"]).nbytes  # the run's cache (pages untouched)
    size = path.stat().st_size
    bar = 1.5 * (size + kv)
    mib = 2 ** 20
    print(f"run -n 64    open to first token {first:.2f} s (load {t['load_seconds']:.2f} s + "
          f"prompt {t['prompt_seconds']:.2f} s); process wall {wall:.1f} s; "
          f"generation {t['generation_tokens_per_second']:.1f} tokens/s")
    print(f"memory       peak RSS {rss / mib:.1f} MiB; bar 1.5 x (file {size / mib:.1f} + KV "
          f"{kv / mib:.1f} MiB) = {bar / mib:.1f} MiB: {'ok' if rss <= bar else 'OVER'}")


def main() -> int:
    global FOLDER
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", nargs="?", default=FOLDER.name,
                    help="folder under shared/reference (default: %(default)s)")
    ap.add_argument("--model", default=None, help="the GGUF file (default: the cached one)")
    ap.add_argument("--skip-ppl", action="store_true", help="skip the perplexity runs")
    ap.add_argument("--skip-run", action="store_true", help="skip the CLI runs")
    args = ap.parse_args()
    FOLDER = REFERENCE / args.reference
    if not FOLDER.is_dir():
        print(f"reference data not found at {FOLDER}", file=sys.stderr)
        return 1
    from gguflm import hub, load_model

    own = sorted(FOLDER.glob("*.gguf"))
    if args.model:
        path = Path(args.model)
    elif own:
        path = own[0]
    else:
        path = hub.resolve_model(PULLED[FOLDER.name])
    if not args.skip_run:
        run_process(path)  # first, so that nothing else has warmed up the process
    tok = tokenizer_bars(path)
    model = load_model(path)
    teacher_forced(model)
    if not args.skip_run:
        free_running(path)
    if not args.skip_ppl:
        perplexities(model, tok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
