"""What constrained decoding costs: generation tokens/s with a JSON schema against the same
number of unconstrained tokens, in one run, alternating, on both real models.

    .venv/bin/python benchmarks/bench_constraints.py [--rounds 5] [--models smollm2 gemma3]

Per model it reports: the llguidance tokenizer's build time (once per vocabulary); per
schema, the compile time (checking the schema: ``json_schema_grammar``; the first matcher for
a vocabulary, and a later one, which is a copy of the cached one); per generated token the
mask time (computing the allowed set in llguidance + applying it to the logits); and the
ratio of constrained to unconstrained generation tokens/s (medians over the rounds). Both
runs use the same prompt and greedy sampling; the unconstrained one ignores end-of-generation
so that it generates exactly as many tokens as the constrained answer has.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from gguflm import load_model
from gguflm.engine.constraints import (
    Constraint,
    ll_tokenizer,
    ll_tokenizer_build_seconds,
)
from gguflm.engine.grammar import json_schema_grammar
from gguflm.engine.sampling import SamplerParams
from gguflm.engine.scheduler import Engine
from gguflm.engine.sequence import Request
from gguflm.tokenizer import Tokenizer
from gguflm.tokenizer.chat import ChatTemplate, encode_prompt

CACHE = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "email": {"type": "string", "format": "email"},
    "languages": {"type": "array", "items": {"type": "string", "maxLength": 12},
                  "maxItems": 3},
    "address": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"enum": ["France", "Germany", "Italy", "Spain", "other"]}},
        "required": ["city", "country"], "additionalProperties": False}},
    "required": ["name", "age", "email", "languages", "address"],
    "additionalProperties": False}
SCHEMAS = {
    "person": ("Describe a French person as JSON.", PERSON),
    "list": ("List four European capitals with their populations as JSON.",
             {"type": "array", "minItems": 4, "maxItems": 4, "items": {
                 "type": "object", "properties": {
                     "city": {"type": "string", "maxLength": 20},
                     "population": {"type": "integer", "minimum": 0}},
                 "required": ["city", "population"], "additionalProperties": False}}),
}


def bench_model(name: str, rounds: int) -> dict:
    path = CACHE / MODELS[name]
    model = load_model(path)
    tok = Tokenizer.from_gguf(model.gguf)
    template = ChatTemplate.for_tokenizer(tok, model.gguf.metadata)
    ll_tokenizer(tok)
    out = {"model": name, "n_vocab": tok.n_vocab,
           "ll_tokenizer_build_s": round(ll_tokenizer_build_seconds(tok), 3), "schemas": {}}
    engine = Engine(model, tok, n_ctx=1024, n_slots=1)
    # warm the kernels (numba compiles on first use)
    engine.run(Request(tok.encode("Hello"), SamplerParams(temp=0), 4))
    for sid, (question, schema) in SCHEMAS.items():
        t0 = time.perf_counter()
        grammar = json_schema_grammar(schema)
        check_s = time.perf_counter() - t0
        first = Constraint(grammar, tok)
        later = Constraint(grammar, tok)
        prompt = encode_prompt(tok, template.render([{"role": "user", "content": question}]))
        rows = []
        for _ in range(rounds):
            c = Constraint(grammar, tok)
            engine.forget()  # both runs evaluate their whole prompt
            gen = engine.run(Request(prompt, SamplerParams(temp=0), 256, constraint=c))
            ids = gen.tokens
            n = len(ids)
            engine.forget()
            free = engine.run(Request(prompt, SamplerParams(temp=0), n))
            stop = "eos" if gen.stopped_by == "eos" else "length"
            rows.append({
                "tokens": n, "stop": stop,
                "constrained_tps": gen.timings_dict()["generation_tokens_per_second"],
                "free_tps": free.timings_dict()["generation_tokens_per_second"],
                "mask_ms": 1e3 * c.mask_seconds / c.masks,
                "compute_ms": 1e3 * c.compute_seconds / c.masks,
            })
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("constrained_tps", "free_tps", "mask_ms", "compute_ms")}
        ratios = [r["constrained_tps"] / r["free_tps"] for r in rows]
        text = tok.decode(ids[:-1] if stop == "eos" else ids)
        out["schemas"][sid] = {
            "tokens": rows[-1]["tokens"], "stop": rows[-1]["stop"],
            "schema_check_ms": round(1e3 * check_s, 2),
            "first_matcher_ms": round(1e3 * first.compile_seconds, 2),
            "later_matcher_ms": round(1e3 * later.compile_seconds, 3),
            "mask_ms_per_token": round(med["mask_ms"], 3),
            "of_which_llguidance_ms": round(med["compute_ms"], 3),
            "constrained_tokens_per_s": round(med["constrained_tps"], 2),
            "unconstrained_tokens_per_s": round(med["free_tps"], 2),
            "ratio_median": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3),
            "answer": text,
        }
    return out


def main() -> None:
    from gguflm.quant.matrix import entry_point_defaults

    entry_point_defaults()  # this script owns the process, as the CLI does
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    args = ap.parse_args()
    for name in args.models:
        if not (CACHE / MODELS[name]).is_file():
            sys.exit(f"error: model {name} is not in {CACHE} (run `gguflm pull {name}`)")
    for name in args.models:
        print(json.dumps(bench_model(name, args.rounds), indent=1, ensure_ascii=False),
              flush=True)


if __name__ == "__main__":
    main()
