"""A mixture of experts at a real size against llama-bench: pp128, pp512 and tg32, engines
alternating.

    .venv/bin/python benchmarks/bench_moe.py --llama-bin DIR [--shape 5b] [--type Q4_K_M]
        [-r 3] [-t 2] [--work DIR] [--seed N]

Writes a random-weight ``qwen3moe`` file of the shape (F16 streamed one tensor at a time,
the router F32; the tokenizer of the tiny reference model padded with control tokens to
Qwen3's vocabulary), requantizes it with ``llama-quantize``, then runs ``gguflm bench
--json`` and ``llama-bench -o json`` on it in turn (``bench_size.bench``), printing the
medians, their ratios and gguflm's peak RSS. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_qwen35 import padded_tokenizer, run_main, write_random  # noqa: E402
from bench_size import requantized  # noqa: E402

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


def _f32(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 1 or "ffn_gate_inp" in name  # norms and the router, as converted


def make(shape: str, qtype: str, args: argparse.Namespace) -> Path:
    from gguflm.gguf.reader import GGUFFile

    s = SHAPES[shape]
    stem = Path(args.work) / f"qwen3moe-{shape}-s{args.seed}"
    return requantized(Path(f"{stem}-f16.gguf"), Path(f"{stem}-{qtype}.gguf"), qtype, args,
                       lambda f16: write_random(f16, lambda w: _metadata(w, s, GGUFFile(TINY)),
                                                _tensors(s), _f32, args.seed),
                       drop_f16=True)  # 11 GB at "5b"


if __name__ == "__main__":
    sys.exit(run_main(__doc__, SHAPES, "5b", make))
