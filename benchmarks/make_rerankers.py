"""Record llama.cpp's rerank scores for the tiny rerankers of tests/rerank_models.py.

    .venv/bin/python benchmarks/make_rerankers.py --llama-server PATH/TO/llama-server
        [--out tests/data/rerank_llama_cpp.json] [--keep DIR]

Makes both tiny rerankers (a BERT cross-encoder with all-MiniLM-L6-v2's vocabulary from the
gguflm cache, a Qwen3-Reranker with the reference data's Qwen2 vocabulary) from their fixed
seeds, serves each with ``llama-server --reranking -t 1`` on 127.0.0.1, once with its
default flash attention (``-fa auto``, on for these CPU models) and once with ``-fa off``,
and asks ``/v1/rerank`` for every case. The JSON holds how the files were made (generator
arguments, the vocabulary files' and the models' sha256), the cases, and per model and
setting each document's score in the documents' order and the tokens llama.cpp counted.
tests/api_server/test_rerank.py remakes the files, checks their sha256 and compares gguflm's scores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))

from rerank_models import make_bert_reranker, make_qwen3_reranker  # noqa: E402

REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE", REPO.parent / "shared" / "reference"))
CACHE = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))
# where each model's vocabulary comes from, relative to the gguflm cache or the reference data
VOCABS = {"bert": ("cache", "all-MiniLM-L6-v2-F16.gguf"),
          "qwen3": ("reference", "arch/qwen3-yarn/tiny-qwen3-yarn-f16.gguf")}
MAKERS = {"bert": make_bert_reranker, "qwen3": make_qwen3_reranker}

CASES = [
    {"query": "what is a panda?", "documents": [
        "hi", "The giant panda is a bear species endemic to China.", "it is a bear",
        "pandas are black and white", "Paris is the capital of France.",
        "A panda eats bamboo for most of the day, up to 14 hours.",
        "Red pandas are not closely related to giant pandas.", ""]},
    {"query": "How do I bake bread at home?", "documents": [
        "Mix flour, water, salt and yeast; knead, let it rise, then bake at 230 C.",
        "The stock market fell sharply on Tuesday.",
        "Sourdough needs a starter that you feed daily.",
        "Bread, bread, bread!", "Ovens vary; use a thermometer.",
        "Café au lait — naïve façade, déjà vu.", "12345 67890",
        "Whole wheat flour absorbs more water than white flour, so add a little more."]},
    {"query": "rust borrow checker", "documents": [
        "The borrow checker enforces that references never outlive their data.",
        "fn main() { let s = String::from(\"hi\"); let r = &s; println!(\"{}\", r); }",
        "Python uses reference counting and a cycle collector.",
        "Lifetimes are annotations such as 'a.", "I like turtles.",
        "Mutable and immutable borrows cannot coexist in the same scope.",
        "The quick brown fox jumps over the lazy dog.", "borrow"]},
]


def vocab_path(arch: str) -> Path:
    where, rel = VOCABS[arch]
    return (CACHE if where == "cache" else REFERENCE) / rel


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_models(folder: Path) -> dict[str, Path]:
    """Both tiny rerankers in ``folder`` (the generators' defaults: seed 0, float32)."""
    return {arch: make(folder / f"tiny-{arch}-reranker.gguf", vocab_path(arch))
            for arch, make in MAKERS.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def llama_scores(server: str, model: Path, flash: str) -> list[dict[str, Any]]:
    """llama-server's scores for every case, in the documents' order."""
    port = free_port()
    proc = subprocess.Popen([server, "-m", str(model), "--reranking", "-t", "1", "-fa", flash,
                             "--host", "127.0.0.1", "--port", str(port), "-c", "4096"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        out = []
        for case in CASES:
            reply = post(f"http://127.0.0.1:{port}/v1/rerank", case)
            scores = [0.0] * len(case["documents"])
            for item in reply["results"]:
                scores[item["index"]] = item["relevance_score"]
            out.append({"scores": scores, "prompt_tokens": reply["usage"]["prompt_tokens"],
                        "order": [item["index"] for item in reply["results"]]})
        return out
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True, help="llama.cpp's llama-server binary")
    ap.add_argument("--out", default=str(REPO / "tests" / "data" / "rerank_llama_cpp.json"))
    ap.add_argument("--keep", metavar="DIR", help="write the models here (default: a temp dir)")
    args = ap.parse_args()
    version = subprocess.run([args.llama_server, "--version"], capture_output=True,
                             text=True).stderr.strip().splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        models = make_models(Path(args.keep or tmp))
        record: dict[str, Any] = {
            "made_by": "benchmarks/make_rerankers.py: tests/rerank_models.py's generators "
                       "(default arguments: seed 0, float32 weights), then llama-server "
                       "--reranking -t 1 -c 4096, POST /v1/rerank per case",
            "llama_cpp": " ".join(version), "cases": CASES, "models": {}}
        for arch, path in models.items():
            where, rel = VOCABS[arch]
            record["models"][arch] = {
                "generator": MAKERS[arch].__name__, "vocab_from": f"{where}:{rel}",
                "vocab_sha256": sha256(vocab_path(arch)), "sha256": sha256(path),
                "fa_auto": llama_scores(args.llama_server, path, "auto"),
                "fa_off": llama_scores(args.llama_server, path, "off")}
            print(f"{arch}: {path.name} {record['models'][arch]['sha256'][:12]}")
    Path(args.out).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
