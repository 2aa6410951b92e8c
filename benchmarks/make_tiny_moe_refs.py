"""Tiny random-weight ``granitemoe`` and ``ernie4_5-moe`` models, and llama.cpp's greedy
continuations and top-20 logits on them (tests/data/moe2_<arch>.json), made as the
shared/reference/arch/ models were (see that README): F16 weights (norms, biases and the
router in F32, as llama.cpp's converter and quantizer leave them), the metadata llama.cpp's
converter writes, a vocabulary borrowed from a tiny reference model (granite's Llama-3 BPE
cut to 3005 tokens; ernie4_5's SentencePiece cut to 4000), the nine prompts of the
references, each evaluated as one batch and then one token at a time, greedy.

    .venv/bin/python benchmarks/make_tiny_moe_refs.py record [ARCH ...] [--seed N] [--out DIR]
    .venv/bin/python benchmarks/make_tiny_moe_refs.py features [ARCH ...] # what each matters

``record`` and ``features`` run llama.cpp through llama-cpp-python in another virtualenv
(``ORACLE_PYTHON``, default /work/oracle-venv/bin/python, with ``LLAMA_CPP_LIB_PATH`` at
llama.cpp's libllama.so, default /work/llama-build/bin); that child is this file's
``oracle`` command, which imports llama_cpp and nothing of gguflm. ``build`` (the model
file of a seed) needs only gguflm and the reference folder: the tests rebuild the model
bit for bit from the seed and check its sha256 against the one recorded.

``features`` re-runs llama.cpp teacher-forced on the recorded sequences with one feature of
the graph switched off (a metadata key or tensors dropped) and prints how far its top-20
logits move (de-shifted max over the steps): each should move them well past the bars.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE", REPO.parent / "shared" / "reference"))
DATA = REPO / "tests" / "data"
ORACLE_PYTHON = os.environ.get("ORACLE_PYTHON", "/work/oracle-venv/bin/python")
LLAMA_LIB = os.environ.get("LLAMA_CPP_LIB_PATH", "/work/llama-build/bin")
N_PREDICT = 40  # tokens per case: 360 teacher-forced steps, a JSON file of ~100 kB
TOP_K = 20

# where each architecture's vocabulary comes from
VOCAB = {"granitemoe": "granite", "ernie4_5-moe": "ernie4_5"}


def _u32(v: int) -> np.uint32:
    return np.uint32(v)


def _f32(v: float) -> np.float32:
    return np.float32(v)


def granitemoe_spec() -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """GraniteMoeShared's layout (granite-3.x-a800m in small): 3 layers, n_embd 256, 4
    heads of 64, 2 KV heads, NORM RoPE 1e4; 8 experts of 128 (``feed_forward_length``),
    top-2 of a softmax, renormalised; a shared expert of 256; Granite's four scales; tied."""
    a, e, n_layer, n_exp, ff, ff_sh = "granitemoe", 256, 3, 8, 128, 256
    md = {f"{a}.block_count": _u32(n_layer), f"{a}.context_length": _u32(4096),
          f"{a}.embedding_length": _u32(e), f"{a}.feed_forward_length": _u32(ff),
          f"{a}.attention.head_count": _u32(4), f"{a}.attention.head_count_kv": _u32(2),
          f"{a}.rope.freq_base": _f32(10000.0),
          f"{a}.attention.layer_norm_rms_epsilon": _f32(1e-5),
          f"{a}.expert_count": _u32(n_exp), f"{a}.expert_used_count": _u32(2),
          f"{a}.rope.dimension_count": _u32(64), f"{a}.attention.scale": _f32(1 / 64),
          f"{a}.embedding_scale": _f32(12.0), f"{a}.residual_scale": _f32(0.22),
          f"{a}.logit_scale": _f32(8.0), f"{a}.expert_shared_feed_forward_length": _u32(ff_sh)}
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(n_layer):
        p = f"blk.{i}."
        shapes |= {p + "attn_norm.weight": (e,), p + "attn_q.weight": (256, e),
                   p + "attn_k.weight": (128, e), p + "attn_v.weight": (128, e),
                   p + "attn_output.weight": (e, 256), p + "ffn_norm.weight": (e,),
                   p + "ffn_gate_inp.weight": (n_exp, e),
                   p + "ffn_gate_exps.weight": (n_exp, ff, e),
                   p + "ffn_up_exps.weight": (n_exp, ff, e),
                   p + "ffn_down_exps.weight": (n_exp, e, ff),
                   p + "ffn_gate_shexp.weight": (ff_sh, e), p + "ffn_up_shexp.weight": (ff_sh, e),
                   p + "ffn_down_shexp.weight": (e, ff_sh)}
    return md, shapes


def ernie_spec() -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """ERNIE-4.5-21B-A3B's layout in small: 3 layers, the first dense (SwiGLU 512); n_embd
    256, 4 heads of 128 (Q 512 wide), 1 KV head, NORM RoPE 5e5; 8 experts of 64, top-2 of
    a softmax chosen with ``exp_probs_b``, renormalised; a shared expert of 128; tied."""
    a, e, n_layer, n_exp, ff_exp, ff_sh = "ernie4_5-moe", 256, 3, 8, 64, 128
    md = {f"{a}.block_count": _u32(n_layer), f"{a}.context_length": _u32(131072),
          f"{a}.embedding_length": _u32(e), f"{a}.feed_forward_length": _u32(512),
          f"{a}.attention.head_count": _u32(4), f"{a}.attention.head_count_kv": _u32(1),
          f"{a}.rope.freq_base": _f32(500000.0),
          f"{a}.attention.layer_norm_rms_epsilon": _f32(1e-5),
          f"{a}.attention.key_length": _u32(128), f"{a}.attention.value_length": _u32(128),
          f"{a}.expert_count": _u32(n_exp), f"{a}.expert_used_count": _u32(2),
          f"{a}.interleave_moe_layer_step": _u32(1),
          f"{a}.leading_dense_block_count": _u32(1),
          f"{a}.expert_feed_forward_length": _u32(ff_exp),
          f"{a}.expert_shared_count": _u32(2),
          f"{a}.expert_shared_feed_forward_length": _u32(ff_sh)}
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(n_layer):
        p = f"blk.{i}."
        shapes |= {p + "attn_norm.weight": (e,), p + "attn_q.weight": (512, e),
                   p + "attn_k.weight": (128, e), p + "attn_v.weight": (128, e),
                   p + "attn_output.weight": (e, 512), p + "ffn_norm.weight": (e,)}
        if i == 0:
            shapes |= {p + "ffn_gate.weight": (512, e), p + "ffn_up.weight": (512, e),
                       p + "ffn_down.weight": (e, 512)}
            continue
        shapes |= {p + "ffn_gate_inp.weight": (n_exp, e), p + "exp_probs_b.bias": (n_exp,),
                   p + "ffn_gate_exps.weight": (n_exp, ff_exp, e),
                   p + "ffn_up_exps.weight": (n_exp, ff_exp, e),
                   p + "ffn_down_exps.weight": (n_exp, e, ff_exp),
                   p + "ffn_gate_shexp.weight": (ff_sh, e), p + "ffn_up_shexp.weight": (ff_sh, e),
                   p + "ffn_down_shexp.weight": (e, ff_sh)}
    return md, shapes


SPECS: dict[str, Callable[[], tuple[dict[str, Any], dict[str, tuple[int, ...]]]]] = {
    "granitemoe": granitemoe_spec, "ernie4_5-moe": ernie_spec}
ROUTER_GAIN = 4.0  # router rows this many times 1/sqrt(n_embd): wide gaps, rare near-ties
# the branches' output products (attn_output, ffn_down*) this many times wider: Granite's
# embeddings x12 and branches x0.22 leave them too faint for their features to show
BRANCH_GAIN = {"granitemoe": 8.0, "ernie4_5-moe": 1.0}


def random_weights(shapes: dict[str, tuple[int, ...]], n_vocab: int, n_embd: int,
                   seed: int, branch_gain: float = 1.0) -> dict[str, np.ndarray]:
    """float32 values: norms near 1, the selection bias ~0.1 (softmax probabilities are
    ~1/8), matrices std 1/sqrt(fan-in), embeddings std 1, routers ``ROUTER_GAIN`` wider,
    the branches' output products ``branch_gain`` wider."""
    rng = np.random.default_rng(seed)
    out = {"token_embd.weight": rng.standard_normal((n_vocab, n_embd)).astype(np.float32),
           "output_norm.weight": (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32)}
    for name, shape in shapes.items():
        if name.endswith("exp_probs_b.bias"):
            out[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif len(shape) == 1:
            out[name] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            gain = (ROUTER_GAIN if "ffn_gate_inp" in name else branch_gain
                    if "attn_output" in name or "ffn_down" in name else 1.0)
            out[name] = (gain / np.sqrt(shape[-1])
                         * rng.standard_normal(shape)).astype(np.float32)
    return out


def build(arch: str, path: Path, seed: int = 0, *, drop_keys: tuple[str, ...] = (),
          set_keys: dict[str, Any] | None = None,
          drop_tensors: Callable[[str], bool] = lambda name: False) -> Path:
    """Write the tiny ``arch`` model of ``seed`` at ``path`` (F16 matrices; 1-D tensors and
    routers F32) with the vocabulary of shared/reference/arch/<VOCAB[arch]>/; ``drop_keys``,
    ``set_keys`` (tails under ``{arch}.``) and ``drop_tensors`` make the ``features`` variants."""
    from gguflm.gguf.reader import open as open_gguf
    from gguflm.gguf.writer import GGUFWriter

    md, shapes = SPECS[arch]()
    md |= {f"{arch}.{k}": v for k, v in (set_keys or {}).items()}
    src = REFERENCE / "arch" / VOCAB[arch] / f"tiny-{VOCAB[arch]}-f16.gguf"
    vocab = open_gguf(src)
    n_vocab = len(vocab.metadata["tokenizer.ggml.tokens"])
    w = GGUFWriter(path)
    w.add("general.architecture", arch)
    w.add("general.name", f"tiny-random-{arch}")
    for key, value in md.items():
        if key.removeprefix(f"{arch}.") not in drop_keys:
            w.add(key, value)
    w.add(f"{arch}.vocab_size", _u32(n_vocab))
    for key, value in vocab.metadata.items():
        if key.startswith("tokenizer."):
            w.add(key, value, vocab.types[key])
    w.add("general.quantization_version", _u32(2))
    w.add("general.file_type", _u32(1))  # mostly F16
    e = int(md[f"{arch}.embedding_length"])
    for name, x in random_weights(shapes, n_vocab, e, seed, BRANCH_GAIN[arch]).items():
        if drop_tensors(name):
            continue
        keep_f32 = x.ndim == 1 or "ffn_gate_inp" in name
        w.add_tensor(name, x if keep_f32 else x.astype(np.float16))
    vocab.close()
    return w.write()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- llama.cpp, in the oracle virtualenv ------------------------------------------------------


def oracle(model: str, job: dict[str, Any]) -> dict[str, Any]:
    """Run in the oracle virtualenv: ``greedy`` cases (prompt as one batch, then one token
    at a time, top-20 logits per generated step), or ``forced``: each sequence evaluated
    in one batch, and its logits at the given ids of each row from ``start`` on."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model, n_ctx=256, n_batch=256, n_threads=2,
                          logits_all=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)

    def top(row: np.ndarray) -> list[list[float]]:
        ids = np.argsort(-row, kind="stable")[:TOP_K]
        return [[int(i), float(row[i])] for i in ids]

    if job["mode"] == "forced":
        out = []
        for seq, start, ids in job["sequences"]:
            llm.reset()
            llm.eval(seq)
            out.append([[float(llm.scores[start + s][i]) for i in row_ids]
                        for s, row_ids in enumerate(ids)])
        return {"rows": out}
    cases = []
    for c in job["cases"]:
        llm.reset()
        prompt = llm.tokenize(c["prompt"].encode(), add_bos=True, special=c["special"])
        llm.eval(prompt)
        gen, tops, stop = [], [], "length"
        while len(gen) < job["n_predict"]:
            row = np.array(llm.scores[llm.n_tokens - 1])
            tops.append(top(row))
            gen.append(int(np.argmax(row)))
            if llama_cpp.llama_vocab_is_eog(vocab, gen[-1]):
                stop = "eog"
                break
            llm.eval([gen[-1]])
        text = llm.detokenize(gen).decode("utf-8", errors="replace")
        cases.append({"id": c["id"], "prompt": c["prompt"], "special": c["special"],
                      "prompt_tokens": prompt, "generated_tokens": gen,
                      "generated_text": text, "stop": stop, "top_logits": tops})
    return {"cases": cases}


def run_oracle(model: Path, job: dict[str, Any]) -> dict[str, Any]:
    """``oracle`` in the llama-cpp-python virtualenv, on ``model``."""
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": LLAMA_LIB}
    out = subprocess.run([ORACLE_PYTHON, __file__, "oracle", str(model)],
                         input=json.dumps(job), capture_output=True, text=True, env=env,
                         check=False)
    if out.returncode:
        raise RuntimeError(f"llama.cpp on {model} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def prompts() -> list[dict[str, Any]]:
    """The nine prompts of every reference (id, prompt, special)."""
    cases = json.loads((REFERENCE / "arch" / "granite" / "greedy.json").read_text())["cases"]
    return [{k: c[k] for k in ("id", "prompt", "special")} for c in cases]


def record_name(arch: str, seed: int = 0) -> str:
    """The record's file name: ``moe2_<arch>.json`` for seed 0, ``moe2_<arch>_s<seed>.json``
    for the held-out seeds."""
    return f"moe2_{arch.replace('-', '_')}" + (f"_s{seed}" if seed else "") + ".json"


def record(arch: str, seed: int = 0, out_dir: Path = DATA) -> Path:
    """llama.cpp's greedy cases on the tiny model of ``seed``, to ``out_dir/record_name``
    (logits rounded to 5 decimals: far below the bars)."""
    with tempfile.TemporaryDirectory() as tmp:
        model = build(arch, Path(tmp) / f"tiny-{arch}-f16.gguf", seed)
        result = run_oracle(model, {"mode": "greedy", "cases": prompts(),
                                    "n_predict": N_PREDICT})
        digest = sha256(model)
    for c in result["cases"]:
        c["top_logits"] = [[[i, round(v, 5)] for i, v in step] for step in c["top_logits"]]
    meta = {"arch": arch, "seed": seed, "model_sha256": digest, "vocab_from": VOCAB[arch],
            "reference": "llama.cpp (libllama at /work/llama-build) via llama-cpp-python "
                         "0.3.36, n_threads=2, greedy", "n_predict": N_PREDICT,
            "top_k_logits": TOP_K, "made_by": "benchmarks/make_tiny_moe_refs.py record"}
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / record_name(arch, seed)
    out.write_text(json.dumps({"meta": meta, "cases": result["cases"]}, separators=(",", ":"))
                   + "\n")
    return out


# -- what each feature is worth to llama.cpp ---------------------------------------------------


def _shexp(name: str) -> bool:
    return "_shexp" in name


FEATURES: dict[str, dict[str, dict[str, Any]]] = {
    "granitemoe": {
        "unchanged": {},
        "no embedding_scale": {"drop_keys": ("embedding_scale",)},
        "no residual_scale": {"drop_keys": ("residual_scale",)},
        "no attention.scale (1/sqrt(64))": {"drop_keys": ("attention.scale",)},
        "logit_scale 1": {"set_keys": {"logit_scale": _f32(1.0)}},
        "no shared expert": {"drop_keys": ("expert_shared_feed_forward_length",),
                             "drop_tensors": _shexp},
    },
    "ernie4_5-moe": {
        "unchanged": {},
        "no exp_probs_b (selection bias)": {"drop_tensors": lambda n: "exp_probs_b" in n},
        "no shared expert": {"drop_keys": ("expert_shared_feed_forward_length",),
                             "drop_tensors": _shexp},
    },
}


def features(arch: str, seed: int = 0) -> None:
    """Print, per variant, llama.cpp's teacher-forced top-20 movement against the record
    (de-shifted: max over steps of max |d - median d|; median step likewise)."""
    data = json.loads((DATA / record_name(arch, seed)).read_text())
    seqs = [[c["prompt_tokens"] + c["generated_tokens"], len(c["prompt_tokens"]) - 1,
             [[i for i, _ in step] for step in c["top_logits"]]] for c in data["cases"]]
    for label, variant in FEATURES[arch].items():
        with tempfile.TemporaryDirectory() as tmp:
            model = build(arch, Path(tmp) / "v.gguf", seed, **variant)
            rows = run_oracle(model, {"mode": "forced", "sequences": seqs})["rows"]
        devs = []
        for c, got in zip(data["cases"], rows):
            for values, ref in zip(got, c["top_logits"]):
                d = np.array(values) - np.array([v for _, v in ref])
                devs.append(float(np.max(np.abs(d - np.median(d)))))
        print(f"{arch}: {label}: top-20 moves by {max(devs):.3f} at worst, "
              f"{np.median(devs):.3f} in the median step")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("record", "features", "build", "oracle"))
    ap.add_argument("args", nargs="*")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DATA, help="record: the folder written")
    a = ap.parse_args()
    if a.command == "oracle":
        json.dump(oracle(a.args[0], json.loads(sys.stdin.read())), sys.stdout)
        return 0
    sys.path.insert(0, str(REPO / "src"))
    if a.command == "build":
        print(build(a.args[0], Path(a.args[1]), a.seed))
        return 0
    for arch in a.args or list(SPECS):
        if a.command == "record":
            print(record(arch, a.seed, a.out))
        else:
            features(arch, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
