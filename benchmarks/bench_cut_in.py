"""Time to first token of a short request arriving during a long prompt (issue 46's bar).

    .venv/bin/python benchmarks/bench_cut_in.py [--model smollm2-135m] [-n 5] [-t 2]
        [--beside 0,1] [--trees SRC_A,SRC_B] [-r 3]

One engine (4 slots) on the model from the cache; each sample submits a 2,000-token prompt,
then 0.3 s later a 20-token one, and takes the short one's time to first token (from its
``submit``). ``--beside 1``: one stream is decoding meanwhile, so the long prompt runs in
bounded chunks beside it and the short request may cut into a step in flight
(``Engine._cut_in``); ``--beside 0``: the long prompt alone. The prompts are random token
ids, different in every sample (no cache reuse). Also the time per token of one stream
decoding alone (its steps may stop: slots are free). Prints the median and range per case.

``--trees``: source folders (each a checkout's ``src``) measured in turn, ``-r`` times
each, alternating, one process per run (the same machine state for both), then the
medians over all their samples: the before/after comparison of a change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

LONG, SHORT, DELAY = 2000, 20, 0.3
MODEL_FILES = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
               "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}


def model_path(name: str) -> Path:
    home = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))
    path = home / MODEL_FILES.get(name, name)
    if not path.is_file():
        sys.exit(f"error: model {name} not in the cache ({path}); run `gguflm pull {name}`")
    return path


def measure(model: str, samples: int, threads: int, beside: list[int]) -> dict[str, list]:
    """{case: [ttft seconds, ...]} in this process (whatever gguflm it imports)."""
    import numpy as np

    from gguflm import load_model
    from gguflm.engine.sampling import SamplerParams
    from gguflm.engine.scheduler import Engine
    from gguflm.engine.sequence import Request
    from gguflm.tokenizer import Tokenizer

    m = load_model(model_path(model))
    m.warm_up(prompts=True)
    engine = Engine(m, Tokenizer.from_gguf(m.gguf), n_ctx=2560, n_slots=4, threads=threads)
    rng = np.random.default_rng(46)
    greedy = SamplerParams(temp=0.0)

    def ids(n: int) -> list[int]:
        return [int(i) for i in rng.integers(200, m.config.n_vocab - 200, n)]

    out: dict[str, list] = {}
    engine.run(Request(ids(LONG), greedy, max_tokens=1))  # one untimed round
    for b in beside:
        got = out.setdefault(f"beside={b}", [])
        for _ in range(samples):
            stream = None
            if b:
                stream = engine.submit(Request(ids(16), greedy, max_tokens=-1,
                                               ignore_eos=True))
                while not stream.tokens and not stream.done:  # decoding from here on
                    time.sleep(0.005)  # (polled: leaving an iteration cancels a sequence)
            long = engine.submit(Request(ids(LONG), greedy, max_tokens=1))
            time.sleep(DELAY)
            short = engine.submit(Request(ids(SHORT), greedy, max_tokens=1))
            assert short.wait(300) and long.wait(300)
            got.append(short.timings.first_token - short.timings.submitted)
            if stream is not None:
                stream.cancel()
                stream.wait(60)
            engine.forget()
    got = out.setdefault("decode_ms_per_token", [])  # steps that may stop: a free slot
    for _ in range(samples):
        seq = engine.run(Request(ids(16), greedy, max_tokens=64, ignore_eos=True))
        t = seq.timings
        got.append((t.ended - t.prompt_done) / (len(seq.tokens) - 1))
    engine.close()
    return out


def _child(args: argparse.Namespace) -> None:
    beside = [int(b) for b in args.beside.split(",")]
    print(json.dumps(measure(args.model, args.n, args.threads, beside)))


def _compare(args: argparse.Namespace) -> None:
    trees = args.trees.split(",")
    samples: dict[str, dict[str, list]] = {t: {} for t in trees}
    for r in range(args.rounds):
        for t in trees:
            env = dict(os.environ, PYTHONPATH=t)
            cmd = [sys.executable, __file__, "--child", "-n", str(args.n), "-t",
                   str(args.threads), "--model", args.model, "--beside", args.beside]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            if res.returncode:
                sys.exit(f"error: {t} failed:\n{res.stderr[-2000:]}")
            got = json.loads(res.stdout.strip().splitlines()[-1])
            for case, v in got.items():
                samples[t].setdefault(case, []).extend(v)
            print(f"round {r + 1} {t}: " + ", ".join(
                f"{c} {statistics.median(v) * 1000:.1f} ms" for c, v in got.items()),
                flush=True)
    for t in trees:
        for case, v in samples[t].items():
            _show(f"{t} {case}", v)


def _show(case: str, v: list[float]) -> None:
    what = "" if case.endswith("per_token") else "TTFT "
    print(f"{case}: {what}median {statistics.median(v) * 1000:.1f} ms, range "
          f"{min(v) * 1000:.1f}-{max(v) * 1000:.1f} ms ({len(v)} samples)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("-n", type=int, default=5, help="samples per case and run")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--beside", default="0,1", help="cases: streams decoding beside (0, 1)")
    ap.add_argument("--trees", help="source folders to compare, alternating")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
    elif args.trees:
        _compare(args)
    else:
        for case, v in measure(args.model, args.n, args.threads,
                               [int(b) for b in args.beside.split(",")]).items():
            _show(case, v)


if __name__ == "__main__":
    main()
