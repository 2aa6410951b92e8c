"""A mixture of experts at a real size against llama-bench: pp128 and tg32, engines
alternating.

    .venv/bin/python benchmarks/bench_moe.py --llama-bin DIR [--shape 5b] [--type Q4_K_M]
        [-r 3] [-t 2] [--work DIR] [--seed N]

Writes a random-weight ``qwen3moe`` file of the shape (F16 streamed one tensor at a time,
the router F32; the tokenizer of the tiny reference model padded with control tokens to
Qwen3's vocabulary), requantizes it with ``llama-quantize``, then runs ``gguflm bench
--json`` and ``llama-bench -o json`` on it in turn (``bench_size``'s ``ours``/``theirs``),
printing the medians and their ratios. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_qwen35 import padded_tokenizer, random_tensor  # noqa: E402
from bench_size import ours, theirs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TINY = REPO.parent / "shared" / "reference" / "arch" / "qwen3moe" / "tiny-qwen3moe-f16.gguf"
# n_embd, layers, heads, KV heads, head dim, experts, experts used, expert FFN, vocabulary.
# "5b": the MoE issue's example (n_embd 2048, 64 experts of 768, 8 used) with 16 layers:
# 4.8B in experts, 5.6B in all, 0.9B read per token (0.6B without the output)
SHAPES = {
    "5b": dict(n_embd=2048, n_layer=16, n_head=16, n_kv=4, head_dim=128, n_expert=64,
               n_used=8, n_ff_exp=768, vocab=151936),
    "small": dict(n_embd=512, n_layer=4, n_head=8, n_kv=2, head_dim=64, n_expert=16,
                  n_used=4, n_ff_exp=256, vocab=8192),
}
TESTS = ("pp128", "pp512", "tg32")  # the bar: pp128 and tg32


def _metadata(w, s: dict, src) -> None:  # noqa: ANN001
    from gguflm.gguf.types import ValueType

    a = "qwen3moe"
    padded_tokenizer(w, s["vocab"], src)
    for key, value in {
            "general.architecture": a, "general.name": "bench-qwen3moe",
            f"{a}.block_count": s["n_layer"], f"{a}.context_length": 4096,
            f"{a}.embedding_length": s["n_embd"], f"{a}.feed_forward_length": 6144,
            f"{a}.attention.head_count": s["n_head"], f"{a}.attention.head_count_kv": s["n_kv"],
            f"{a}.attention.key_length": s["head_dim"],
            f"{a}.attention.value_length": s["head_dim"],
            f"{a}.attention.layer_norm_rms_epsilon": 1e-6, f"{a}.rope.freq_base": 1e6,
            f"{a}.expert_count": s["n_expert"], f"{a}.expert_used_count": s["n_used"],
            f"{a}.expert_feed_forward_length": s["n_ff_exp"],
            f"{a}.vocab_size": s["vocab"]}.items():
        w.add(key, value, ValueType.UINT32 if isinstance(value, int) else
              ValueType.FLOAT32 if isinstance(value, float) else None)


def _tensors(s: dict) -> dict[str, tuple[int, ...]]:
    """{name: numpy shape} of the model (a separate output matrix, as Qwen3-30B-A3B)."""
    e, q, kv = s["n_embd"], s["n_head"] * s["head_dim"], s["n_kv"] * s["head_dim"]
    n_x, f = s["n_expert"], s["n_ff_exp"]
    out = {"token_embd.weight": (s["vocab"], e), "output_norm.weight": (e,),
           "output.weight": (s["vocab"], e)}
    for i in range(s["n_layer"]):
        layer = {"attn_norm.weight": (e,), "attn_q.weight": (q, e), "attn_k.weight": (kv, e),
                 "attn_v.weight": (kv, e), "attn_q_norm.weight": (s["head_dim"],),
                 "attn_k_norm.weight": (s["head_dim"],), "attn_output.weight": (e, q),
                 "ffn_norm.weight": (e,), "ffn_gate_inp.weight": (n_x, e),
                 "ffn_gate_exps.weight": (n_x, f, e), "ffn_up_exps.weight": (n_x, f, e),
                 "ffn_down_exps.weight": (n_x, e, f)}
        out |= {f"blk.{i}.{k}": v for k, v in layer.items()}
    return out


def make(shape: str, qtype: str, args: argparse.Namespace) -> Path:
    from gguflm.gguf.reader import GGUFFile
    from gguflm.gguf.types import GGMLType
    from gguflm.gguf.writer import GGUFWriter

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    f16 = work / f"qwen3moe-{shape}-s{args.seed}-f16.gguf"
    out = work / f"qwen3moe-{shape}-s{args.seed}-{qtype}.gguf"
    if not out.exists():
        if not f16.exists():
            s = SHAPES[shape]
            w = GGUFWriter(f16)
            _metadata(w, s, GGUFFile(TINY))
            for name, shp in _tensors(s).items():
                f32 = len(shp) == 1 or "ffn_gate_inp" in name  # the router, as converted
                w.add_tensor(name, random_tensor(name, shp, args.seed, f32),
                             type=GGMLType.F32 if f32 else GGMLType.F16,
                             shape=tuple(reversed(shp)))
            w.write()
        subprocess.run([str(Path(args.llama_bin) / "llama-quantize"), str(f16), str(out),
                        qtype, str(args.threads)], check=True, capture_output=True)
        f16.unlink()  # 11 GB at "5b"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", required=True, help="folder with llama-bench, llama-quantize")
    ap.add_argument("--shape", default="5b", choices=sorted(SHAPES))
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "gguflm" / "big"))
    args = ap.parse_args()
    path = make(args.shape, args.type, args)
    got: dict[str, list[float]] = {}
    ref: dict[str, list[float]] = {}
    for _ in range(max(1, args.rounds)):
        for k, v in ours(path, args.threads)[0].items():
            got.setdefault(k, []).append(v)
        for k, v in theirs(path, args.threads, args.llama_bin).items():
            ref.setdefault(k, []).append(v)
    for k in TESTS:
        a, b = statistics.median(got[k]), statistics.median(ref[k])
        print(f"{path.name}  {k}: gguflm {a:.2f} / llama.cpp {b:.2f} tokens/s = {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
