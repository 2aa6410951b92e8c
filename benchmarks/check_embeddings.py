"""The embeddings bar: cosine similarity with llama.cpp's vectors, per text, on both models.

    .venv/bin/python benchmarks/check_embeddings.py [REFERENCE_DIR]

Reads ``embeddings/<model>.json`` from the reference folder (llama.cpp's ``llama-embedding
--pooling mean --embd-normalize -1``), embeds the same texts with ``gguflm.LLM.embed`` and
prints each text's cosine, then min and mean per model. llama-embedding splits its input at
newlines, so a text with a newline was recorded as its first line; that is what is compared.
As a yardstick of the arithmetic's own noise it also prints the cosine between our vectors
with the KV cache rounded to float16 (the default, as llama.cpp's) and kept in float32.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import gguflm
from gguflm.hub import resolve_model

MODELS = {"smollm2-135m": "smollm2-135m-q4_1", "gemma3-270m": "gemma3-270m-q4_k_m"}


def cos(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def main() -> None:
    ref_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else (
        Path(__file__).resolve().parent.parent.parent / "shared" / "reference")
    for name, ref in MODELS.items():
        data = json.loads((ref_dir / "embeddings" / f"{ref}.json").read_text())
        texts = [t.split("\n")[0] for t in data["texts"]]
        llm = gguflm.LLM(resolve_model(name), n_ctx=256, parallel=4)
        try:
            ours = llm.embed(texts, normalize=False)
            llm.model.kv_type = "f32"  # new caches only: the engine's arena is already made
            f32 = []
            for t in texts:
                from gguflm.model.batch import ALL, NONE, Part

                ids = llm.tokenize(t, parse_special=True)
                part = Part(llm.model.new_cache(len(ids)), np.array(ids), NONE, ALL)
                llm.model.forward_batch([part])
                f32.append(part.hidden_states.mean(axis=0))
        finally:
            llm.close()
        cs = [cos(a, b) for a, b in zip(ours, data["embeddings"], strict=True)]
        noise = [cos(a, b) for a, b in zip(ours, f32, strict=True)]
        for t, c, n in zip(texts, cs, noise, strict=True):
            print(f"{name:13s} cos {c:.6f}  (f16 vs f32 KV {n:.6f})  {t[:40]!r}")
        print(f"{name:13s} {len(cs)} texts: min {min(cs):.6f}, mean {np.mean(cs):.6f}; our own "
              f"f16-vs-f32 spread: min {min(noise):.6f}, mean {np.mean(noise):.6f}\n")


if __name__ == "__main__":
    main()
