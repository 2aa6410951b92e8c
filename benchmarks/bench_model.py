"""Model speed and memory: prompt (batched prefill) and generation tokens/s, peak RSS.

    .venv/bin/python benchmarks/bench_model.py [MODEL] [-p N_PROMPT] [-n N_GEN] [-c N_CTX]

Greedy generation straight from ``Model.forward`` (no sampler, no tokenizer), so the
figures are the model's own. Peak RSS is compared with the issue's memory bar:
1.5 x (model file + KV cache).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("-p", "--prompt", type=int, default=32, help="prompt tokens (default 32)")
    ap.add_argument("-n", "--n-gen", type=int, default=64, help="generated tokens (default 64)")
    ap.add_argument("-c", "--ctx", type=int, default=0, help="cache size (default p + n)")
    args = ap.parse_args()

    from gguflm import hub, load_model
    from gguflm.quant.matrix import entry_point_defaults

    entry_point_defaults()  # this script owns the process, as the CLI does

    path = hub.resolve_model(args.model)
    t0 = time.perf_counter()
    model = load_model(path)
    t_load = time.perf_counter() - t0
    n_ctx = args.ctx or args.prompt + args.n_gen
    cache = model.new_cache(n_ctx)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.config.n_vocab, size=args.prompt)

    model.forward(prompt[:1], model.new_cache(1))  # kernels compiled/loaded before timing
    t0, c0 = time.perf_counter(), time.process_time()
    logits = model.forward(prompt, cache)
    t_prompt, c_prompt = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(args.n_gen):
        logits = model.forward([int(np.argmax(logits))], cache)
    t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    file_size = os.path.getsize(path)
    bar = 1.5 * (file_size + cache.nbytes)
    mib = 2 ** 20
    print(f"model      {path.name} ({file_size / mib:.1f} MiB), load {t_load:.2f} s")
    print(f"prompt     {args.prompt} tokens in {t_prompt:.2f} s: "
          f"{args.prompt / t_prompt:.1f} tokens/s (CPU {c_prompt:.2f} s, all threads)")
    print(f"generation {args.n_gen} tokens in {t_gen:.2f} s: {args.n_gen / t_gen:.1f} tokens/s "
          f"(CPU {c_gen:.2f} s)")
    print(f"load avg   {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"peak RSS   {rss / mib:.1f} MiB; bar 1.5 x (file + KV cache {cache.nbytes / mib:.1f} "
          f"MiB) = {bar / mib:.1f} MiB: {'ok' if rss <= bar else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
