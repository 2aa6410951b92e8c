"""Prompt-lookup decoding (``--lookup K``): generation tokens/s with and without it.

    .venv/bin/python benchmarks/bench_lookup.py [MODEL] [-k 0,8,16] [-r 3] [-n 256]
        [--llama-bench PATH]

Two prompts through the chat template, temperature 0, one sequence: an input-grounded one
("Correct the spelling in this text", a text of about 230 tokens with one typo, which the
reply mostly copies) and free generation (a story). For each K (0: off), in alternating
rounds, the generation tokens/s of the engine's timings (the first token excluded, as
llama.cpp's ``tg``), the draft tokens verified and kept, and whether the text equals the
K = 0 text (it must). With ``--llama-bench``, llama.cpp's plain generation (``tg64``, same
threads) runs in each round too, and the ratios of the medians are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

TEXT = (
    "The lighthouse stood at the edge of the cliff for more than a hundred years. Every "
    "night its keeper climbed the narrow stairs, trimmed the wick and watched the beam "
    "sweep acros the dark water. Ships passing in the night relied on it to find their way "
    "around the rocks. In the winter storms the waves rose so high that spray reached the "
    "lamp room, and the keeper would stay awake until morning, listening to the wind. When "
    "the lighthouse was finally automated, the keeper moved to the village below, but he "
    "still walked up the path every evening to see the light come on.\n\n"
    "The village had changed in the years he had been away. The old bakery was now a cafe, "
    "the harbour was full of small sailing boats instead of fishing trawlers, and the "
    "school had closed. But the people still greeted him by name, and the children still "
    "asked him about the storms. He told them about the night the cargo ship lost its "
    "engine and drifted towards the rocks, and how the light had guided the lifeboat out to "
    "it. He never said that he had been frightened, but the children could tell from the "
    "way he paused before the end of the story.")
PROMPTS = {
    "rewrite": "Correct the spelling in this text:\n\n" + TEXT,
    "free": "Write a long story about a lighthouse keeper.",
}


def llama_tg(binary: str, model: str, threads: int) -> float:
    out = subprocess.run([binary, "-m", model, "-t", str(threads), "-p", "0", "-n", "64",
                          "-r", "2", "-o", "json"], capture_output=True, text=True,
                         check=True, timeout=600)
    return float(json.loads(out.stdout)[-1]["avg_ts"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("-k", default="0,8,16", help="draft lengths, 0 first (default 0,8,16)")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-n", "--n-gen", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--llama-bench", metavar="PATH", help="llama.cpp's llama-bench binary")
    args = ap.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    if ks[0] != 0:
        ks.insert(0, 0)

    from gguflm import LLM, hub
    from gguflm.quant.matrix import entry_point_defaults

    entry_point_defaults(owns_cores=True)  # one user's generation, as `gguflm run`
    path = str(hub.resolve_model(args.model))
    llm = LLM(path, parallel=1, n_ctx=2048, threads=args.threads)
    llm.generate("warm up", max_tokens=4, temperature=0)
    speeds: dict[tuple[str, int], list[float]] = {}
    llama: list[float] = []
    for rnd in range(args.rounds):
        for name, text in PROMPTS.items():
            ids = llm.chat_prompt_ids([{"role": "user", "content": text}])
            base = None
            for k in ks:
                llm.engine.forget()
                seq = llm.submit(ids, max_tokens=args.n_gen, temperature=0, lookup=k)
                out = "".join(p.text for p in seq)
                t = seq.timings_dict()
                base = out if base is None else base
                speeds.setdefault((name, k), []).append(t["generation_tokens_per_second"])
                print(f"round {rnd + 1} {name:8s} K={k:<3d} {len(seq.tokens)} tokens, "
                      f"{t['generation_tokens_per_second']:6.1f} tok/s, drafted "
                      f"{t.get('draft_n', 0)}, kept {t.get('draft_n_accepted', 0)}, "
                      f"same text: {out == base}", flush=True)
        if args.llama_bench:
            llama.append(llama_tg(args.llama_bench, path, args.threads))
            print(f"round {rnd + 1} llama.cpp tg64 {llama[-1]:.1f} tok/s", flush=True)
    print("\nmedian generation tokens/s (range)")
    for (name, k), v in speeds.items():
        base = statistics.median(speeds[(name, 0)])
        line = (f"  {name:8s} K={k:<3d} {statistics.median(v):6.1f} ({min(v):.1f}-{max(v):.1f})"
                f"  {statistics.median(v) / base:.2f}x of K=0")
        if llama:
            line += f", {statistics.median(v) / statistics.median(llama):.2f}x of llama.cpp tg64"
        print(line)
    if llama:
        lo, hi = min(llama), max(llama)
        print(f"  llama.cpp tg64 {statistics.median(llama):.1f} ({lo:.1f}-{hi:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
