"""The bars of the architectures issue (qwen2, qwen3, phi3, gemma2), measured on each
architecture's tiny F16 model in shared/reference/arch/<arch>/ against llama.cpp's data.

    .venv/bin/python benchmarks/check_archs.py [ARCH ...] [--skip-run]

Per architecture: prompt_tokens agreement (our tokenizer), teacher-forced logits over the
nine cases (de-shifted top-20 worst step <= 0.5, median-over-steps max |d| <= 0.15, top-1
disagreements where llama.cpp's margin >= 0.25, and the largest margin at which we
disagreed), and free-running greedy through ``gguflm run --temp 0 --json`` (cases identical
for all 64 tokens, and llama.cpp's margin where the others first differ).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE", REPO.parent / "shared" / "reference"))
sys.path.insert(0, str(REPO / "tests"))

ARCHS = ["qwen2", "qwen3", "phi3", "gemma2"]


def teacher_forced(arch: str) -> None:
    import gguflm
    from refcheck import load_cases, run_reference

    folder = REFERENCE / "arch" / arch
    path = folder / f"tiny-{arch}-f16.gguf"
    tok = gguflm.Tokenizer.from_file(path)
    cases = load_cases(folder)
    same = sum(tok.encode(c["prompt"], add_special=True, parse_special=c["special"])
               == c["prompt_tokens"] for c in cases)
    steps = run_reference(gguflm.load_model(path), folder)
    s = steps.summary()
    worst = max((m for m, a in zip(steps.margin, steps.agree) if not a), default=0.0)
    print(f"{arch}: prompt_tokens {same}/{len(cases)}; {s['steps']} steps: de-shifted max "
          f"{s['dev_max']:.4f} (bar 0.5), median step max|d| {s['raw_median']:.4f} (bar 0.15), "
          f"top-1 {s['agree']:.1%}, disagreements at margin >= 0.25: "
          f"{len(steps.disagreements(0.25))} (largest margin disagreed: {worst:.3f})")


def free_running(arch: str) -> None:
    folder = REFERENCE / "arch" / arch
    cases = json.loads((folder / "greedy.json").read_text())["cases"]
    full, firsts = 0, []
    for c in cases:
        cmd = [sys.executable, "-m", "gguflm.cli", "run", str(folder / f"tiny-{arch}-f16.gguf"),
               "-p", c["prompt"], "-n", "64", "--temp", "0", "--json"]
        if c["special"]:
            cmd.append("--special")
        out = json.loads(subprocess.run(cmd, capture_output=True, text=True,
                                        check=True).stdout)
        ours, ref = out["generated_tokens"], c["generated_tokens"]
        if ours == ref:
            full += 1
            continue
        i = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b),
                 min(len(ours), len(ref)))
        top = c["top_logits"][i] if i < len(c["top_logits"]) else None
        margin = top[0][1] - top[1][1] if top else float("nan")
        firsts.append(f"{c['id']}@{i} (margin {margin:.3f})")
    print(f"{arch}: free-running greedy {full}/{len(cases)} identical; first differences: "
          f"{', '.join(firsts) or '-'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archs", nargs="*", default=ARCHS)
    ap.add_argument("--skip-run", action="store_true", help="no free-running greedy")
    args = ap.parse_args()
    for arch in args.archs:
        teacher_forced(arch)
        if not args.skip_run:
            free_running(arch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
