"""Qwen3.5 at a real size against llama-bench: pp128, pp512 and tg32, engines alternating.

    .venv/bin/python benchmarks/bench_qwen35.py --llama-bin DIR [--shape 2b] [--type Q4_K_M]
        [-r 3] [-t 2] [--work DIR] [--seed N]

Writes a random-weight ``qwen35`` file of the shape (F16, streamed one tensor at a time:
the tokenizer of the tiny reference model padded with control tokens to the real
vocabulary), requantizes it with llama.cpp's ``llama-quantize``, then runs ``gguflm bench
--json`` and ``llama-bench -o json`` on it in turn (``bench_size.bench``), printing the
medians, their ratios and gguflm's peak RSS. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_size import bench, requantized  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TINY = REPO.parent / "shared" / "reference" / "arch" / "qwen35" / "tiny-qwen35-f16.gguf"
# Qwen3.5's published shapes: n_embd, layers, heads, KV heads, head dim, delta-net heads
# (K and V) and head size, FFN, vocabulary, rotary dims, M-RoPE sections
SHAPES = {
    "2b": dict(n_embd=2048, n_layer=24, n_head=8, n_kv=2, head_dim=256, n_k=16, n_v=16,
               d_state=128, n_ff=6144, vocab=248320, n_rot=64, sections=(11, 11, 10, 0)),
    "0.8b": dict(n_embd=1024, n_layer=24, n_head=8, n_kv=2, head_dim=256, n_k=16, n_v=16,
                 d_state=128, n_ff=3584, vocab=248320, n_rot=64, sections=(11, 11, 10, 0)),
    "small": dict(n_embd=512, n_layer=4, n_head=4, n_kv=2, head_dim=64, n_k=4, n_v=8,
                  d_state=64, n_ff=1024, vocab=8192, n_rot=16, sections=(3, 3, 2, 0)),
}


def padded_tokenizer(w, vocab: int, src) -> None:  # noqa: ANN001
    """Writer ``w`` gets the tokenizer keys of GGUF file ``src``, its vocabulary padded
    with control tokens to ``vocab`` entries."""
    n_pad = vocab - len(src.metadata["tokenizer.ggml.tokens"])
    for key, value in src.metadata.items():
        if key.startswith("tokenizer."):
            if key == "tokenizer.ggml.tokens":
                value = [*value, *(f"<|pad_{i}|>" for i in range(n_pad))]
            elif key == "tokenizer.ggml.token_type":
                value = np.concatenate([value, np.full(n_pad, 3, value.dtype)])
            w.add(key, value, src.types[key])


def _metadata(w, s: dict, src) -> None:  # noqa: ANN001
    from gguflm.gguf.types import ValueType

    a = "qwen35"
    padded_tokenizer(w, s["vocab"], src)
    d_inner = s["n_v"] * s["d_state"]
    for key, value in {
            "general.architecture": a, "general.name": "bench-qwen35",
            f"{a}.block_count": s["n_layer"], f"{a}.context_length": 4096,
            f"{a}.embedding_length": s["n_embd"], f"{a}.feed_forward_length": s["n_ff"],
            f"{a}.attention.head_count": s["n_head"], f"{a}.attention.head_count_kv": s["n_kv"],
            f"{a}.attention.key_length": s["head_dim"],
            f"{a}.attention.value_length": s["head_dim"],
            f"{a}.attention.layer_norm_rms_epsilon": 1e-6, f"{a}.rope.freq_base": 1e7,
            f"{a}.rope.dimension_count": s["n_rot"],
            f"{a}.rope.dimension_sections": np.array(s["sections"], np.int32),
            f"{a}.ssm.conv_kernel": 4, f"{a}.ssm.state_size": s["d_state"],
            f"{a}.ssm.group_count": s["n_k"], f"{a}.ssm.time_step_rank": s["n_v"],
            f"{a}.ssm.inner_size": d_inner, f"{a}.full_attention_interval": 4,
            f"{a}.vocab_size": s["vocab"]}.items():
        w.add(key, value, ValueType.UINT32 if isinstance(value, int) else
              ValueType.FLOAT32 if isinstance(value, float) else None)


def _tensors(s: dict) -> dict[str, tuple[int, ...]]:
    """{name: numpy shape} of the trunk (tied output, no MTP block)."""
    e, conv = s["n_embd"], 2 * s["n_k"] * s["d_state"] + s["n_v"] * s["d_state"]
    q, kv, v_dim = s["n_head"] * s["head_dim"], s["n_kv"] * s["head_dim"], s["n_v"] * s["d_state"]
    out = {"token_embd.weight": (s["vocab"], e), "output_norm.weight": (e,)}
    for i in range(s["n_layer"]):
        layer = {"attn_norm.weight": (e,), "post_attention_norm.weight": (e,),
                 "ffn_gate.weight": (s["n_ff"], e), "ffn_up.weight": (s["n_ff"], e),
                 "ffn_down.weight": (e, s["n_ff"])}
        if (i + 1) % 4:
            layer |= {"attn_qkv.weight": (conv, e), "attn_gate.weight": (v_dim, e),
                      "ssm_conv1d.weight": (conv, 4), "ssm_dt.bias": (s["n_v"],),
                      "ssm_a": (s["n_v"],), "ssm_beta.weight": (s["n_v"], e),
                      "ssm_alpha.weight": (s["n_v"], e), "ssm_norm.weight": (s["d_state"],),
                      "ssm_out.weight": (e, v_dim)}
        else:
            layer |= {"attn_q.weight": (2 * q, e), "attn_k.weight": (kv, e),
                      "attn_v.weight": (kv, e), "attn_q_norm.weight": (s["head_dim"],),
                      "attn_k_norm.weight": (s["head_dim"],), "attn_output.weight": (e, q)}
        out |= {f"blk.{i}.{k}": v for k, v in layer.items()}
    return out


def random_tensor(name: str, shape: tuple[int, ...], seed: int, f32: bool):  # noqa: ANN201
    """A callable giving the tensor's bytes: norms near 1, ssm_a negative, biases and conv
    taps near 0 (these and any ``f32`` tensor in F32), matrices of std 1/sqrt(fan-in) in
    F16 (the embedding's std 1)."""
    def make() -> bytes:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        if name.endswith("ssm_a"):
            return (-rng.uniform(0.5, 2.0, shape)).astype(np.float32).tobytes()
        if len(shape) == 1 or "conv1d" in name:
            base = 0.0 if name.endswith(".bias") or "conv1d" in name else 1.0
            return (base + 0.1 * rng.standard_normal(shape)).astype(np.float32).tobytes()
        std = 1.0 if name == "token_embd.weight" else 1 / np.sqrt(shape[-1])
        x = (std * rng.standard_normal(shape, np.float32)).astype(np.float32)
        return x.tobytes() if f32 else x.astype(np.float16).tobytes()
    return make


def write_random(path: Path, metadata: Callable[[object], None],
                 tensors: dict[str, tuple[int, ...]], f32: Callable[[str, tuple], bool],
                 seed: int) -> None:
    """A random-weight GGUF file: ``metadata(writer)``'s keys, then each tensor (numpy
    shape) from ``random_tensor``, F32 where ``f32(name, shape)``, else F16; streamed one
    tensor at a time."""
    from gguflm.gguf.types import GGMLType
    from gguflm.gguf.writer import GGUFWriter

    w = GGUFWriter(path)
    metadata(w)
    for name, shp in tensors.items():
        small = f32(name, shp)
        w.add_tensor(name, random_tensor(name, shp, seed, small),
                     type=GGMLType.F32 if small else GGMLType.F16, shape=tuple(reversed(shp)))
    w.write()


def _f32(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 1 or "conv1d" in name or name.endswith("ssm_a")


def make(shape: str, qtype: str, args: argparse.Namespace) -> Path:
    from gguflm.gguf.reader import GGUFFile

    s = SHAPES[shape]
    stem = Path(args.work) / f"qwen35-{shape}-s{args.seed}"
    return requantized(Path(f"{stem}-f16.gguf"), Path(f"{stem}-{qtype}.gguf"), qtype, args,
                       lambda f16: write_random(f16, lambda w: _metadata(w, s, GGUFFile(TINY)),
                                                _tensors(s), _f32, args.seed))


def run_main(doc: str, shapes: dict, default: str,
             make: Callable[[str, str, argparse.Namespace], Path]) -> int:
    """A random-model bench's command line: make the file of ``--shape``, then
    ``bench_size.bench`` (engines alternating, medians and ratios)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--llama-bin", required=True, help="folder with llama-bench, llama-quantize")
    ap.add_argument("--shape", default=default, choices=sorted(shapes))
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "gguflm" / "big"))
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("-r must be at least 1")
    print("model                        medians: gguflm / llama.cpp tokens/s (ratio)")
    bench(make(args.shape, args.type, args), args)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(__doc__, SHAPES, "2b", make))
