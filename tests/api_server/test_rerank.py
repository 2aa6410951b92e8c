"""Reranking (issue 48): tiny random rerankers in llama.cpp's layouts (a BERT cross-encoder,
a Qwen3-Reranker; tests/rerank_models.py remakes them byte for byte) scored as llama.cpp's
llama-server scored the same files (tests/data/rerank_llama_cpp.json, recorded by
benchmarks/make_rerankers.py, since CI has no llama-server); ``/v1/rerank`` and its aliases
on a real ``gguflm serve``; the CLI; ``LLM.rerank``; each score independent of its batch;
bad requests as 400s with OpenAI's error object.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gguflm.api import LLM, InvalidRequestError
from gguflm.cli import main
from gguflm.reranker import MAX_DOCUMENTS, Reranker
from rerank_models import make_bert_reranker, make_qwen3_reranker
from test_hostile_server import _post, _start, _stop

RECORD = json.loads((Path(__file__).resolve().parents[1] / "data"
                     / "rerank_llama_cpp.json").read_text())
ARCHS = ("bert", "qwen3")
QUERY = "what is a panda?"
DOCS = RECORD["cases"][0]["documents"]


@pytest.fixture(scope="module")
def paths(reference: Path, minilm_path: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[str, Path]:
    """Both tiny rerankers, remade; the same bytes as the files llama.cpp scored."""
    folder = tmp_path_factory.mktemp("rerankers")
    out = {"bert": make_bert_reranker(folder / "tiny-bert-reranker.gguf", minilm_path),
           "qwen3": make_qwen3_reranker(folder / "tiny-qwen3-reranker.gguf", reference / "arch"
                                        / "qwen3-yarn" / "tiny-qwen3-yarn-f16.gguf")}
    for arch, path in out.items():
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        assert got == RECORD["models"][arch]["sha256"], (
            f"{arch}: the remade file is not the one llama.cpp scored (generator or "
            f"vocabulary changed): re-record with benchmarks/make_rerankers.py")
    return out


@pytest.fixture(scope="module")
def llms(paths: dict[str, Path]) -> Iterator[dict[str, LLM]]:
    out = {arch: LLM(str(path), parallel=4) for arch, path in paths.items()}
    yield out
    for llm in out.values():
        llm.close()


# with flash attention (its default, -fa auto) llama.cpp's BERT scores depend on the batch
# (a document alone and among 8: 5.2e-3 relative apart; -fa off: identical); gguflm's
# encoder attention is float32, as -fa off: held to it at 1e-3, to -fa auto at 5e-3
BARS = {("bert", "fa_off"): 1e-3, ("bert", "fa_auto"): 5e-3,
        ("qwen3", "fa_off"): 1e-3, ("qwen3", "fa_auto"): 1e-3}


@pytest.mark.parametrize(("arch", "setting"), list(BARS))
def test_scores_equal_llama_cpps(llms: dict[str, LLM], arch: str, setting: str) -> None:
    reranker = Reranker(llms[arch])
    worst = 0.0
    for case, ref in zip(RECORD["cases"], RECORD["models"][arch][setting], strict=True):
        scores, n_tokens = reranker.scores(case["query"], case["documents"])
        want = np.array(ref["scores"])
        worst = max(worst, float((np.abs(np.array(scores) - want) / np.abs(want)).max()))
        assert n_tokens == ref["prompt_tokens"]  # the same inputs, token for token
        result = llms[arch].rerank(case["query"], case["documents"])
        assert [r["index"] for r in result["results"]] == ref["order"]
    print(f"{arch} vs llama.cpp ({setting}): max relative difference {worst:.2e}")
    assert worst <= BARS[arch, setting]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_score_does_not_depend_on_its_batch(llms: dict[str, LLM], arch: str) -> None:
    together, _ = Reranker(llms[arch]).scores(QUERY, DOCS)
    for i, doc in enumerate(DOCS):
        alone, _ = Reranker(llms[arch]).scores(QUERY, [doc])
        assert alone[0] == together[i], f"document {i}"


def test_python_api(llms: dict[str, LLM]) -> None:
    llm = llms["bert"]
    whole = llm.rerank(QUERY, DOCS)
    scores = [r["relevance_score"] for r in whole["results"]]
    assert sorted(r["index"] for r in whole["results"]) == list(range(len(DOCS)))
    assert scores == sorted(scores, reverse=True)
    assert whole["object"] == "list" and whole["usage"]["prompt_tokens"] > len(DOCS)
    top = llm.rerank(QUERY, [{"text": d} for d in DOCS], top_n=3, return_documents=True)
    assert top["results"] == [{**r, "document": {"text": DOCS[r["index"]]}}
                              for r in whole["results"][:3]]
    assert llm.rerank(QUERY, DOCS, top_n=0)["results"] == []
    with pytest.raises(InvalidRequestError, match="pooling_type is rank"):
        llm.embed("a reranker does not embed without a pooling")


@pytest.mark.parametrize(("args", "match"), [
    ((None, DOCS), "query must be a string"), ((QUERY, "one document"), "documents must be"),
    ((QUERY, []), "non-empty"), ((QUERY, [1, 2]), r"documents\[0\]"),
    ((QUERY, ["d"] * (MAX_DOCUMENTS + 1)), "at most"),
    ((QUERY, ["word " * 600]), "more than the model's 512"),
    ((QUERY, DOCS, -1), "top_n")])
def test_bad_arguments(llms: dict[str, LLM], args: tuple, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        llms["bert"].rerank(*args)


def test_cli(paths: dict[str, Path], reference: Path, capsys: pytest.CaptureFixture[str]
             ) -> None:
    docs = DOCS[:4]
    assert main(["rerank", str(paths["bert"]), QUERY, *docs, "-t", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert main(["rerank", str(paths["bert"]), QUERY, *docs, "-t", "1", "--top-n", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line, r in zip(lines, result["results"], strict=False):
        rank, score, index = line.split()[:3]
        assert float(score) == pytest.approx(r["relevance_score"], abs=1e-6)
        assert index == f"[{r['index']}]"
    plain = reference / "arch" / "qwen3" / "tiny-qwen3-f16.gguf"
    assert main(["rerank", str(plain), QUERY, "a document", "-t", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and "not a reranker" in err[-1]


@pytest.fixture(scope="module")
def server(paths: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = _start(paths["bert"], tmp_path_factory.mktemp("rerank") / "log.txt",
                       "-np", "2", "-c", "512")
    yield url
    assert proc.poll() is None, "the server died"
    _stop(proc)


def test_routes(server: str, llms: dict[str, LLM]) -> None:
    want = llms["bert"].rerank(QUERY, DOCS, top_n=5, return_documents=True)
    for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking"):
        status, body = _post(server, path, json.dumps({
            "model": "any", "query": QUERY, "documents": DOCS, "top_n": 5,
            "return_documents": True}))
        assert status == 200, body
        assert body["results"] == want["results"] and body["usage"] == want["usage"]
    status, body = _post(server, "/v1/rerank", json.dumps({"query": QUERY, "texts": DOCS,
                                                           "return_text": True}))
    assert status == 200
    assert body[:5] == [{"index": r["index"], "score": r["relevance_score"],
                         "text": r["document"]["text"]} for r in want["results"]]


@pytest.mark.parametrize(("body", "param"), [
    ({"documents": DOCS}, "query"), ({"query": QUERY}, "documents"),
    ({"query": QUERY, "documents": "a document"}, "documents"),
    ({"query": 5, "documents": DOCS}, "query"),
    ({"query": QUERY, "documents": [{"title": "no text"}]}, "documents"),
    ({"query": QUERY, "documents": ["d"] * (MAX_DOCUMENTS + 1)}, "documents"),
    ({"query": QUERY, "documents": ["word " * 600]}, "documents"),
    ({"query": QUERY, "documents": DOCS, "top_n": -2}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": "3"}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "truncate": True}, "truncate")])
def test_bad_requests_are_400s(server: str, body: dict, param: str) -> None:
    status, answer = _post(server, "/v1/rerank", json.dumps(body))
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["param"] == param and answer["error"]["message"]


def test_an_embedding_model_is_refused_naming_its_pooling(minilm_path: Path, tmp_path: Path
                                                          ) -> None:
    path = make_bert_reranker(tmp_path / "tiny-bert-embedder.gguf", minilm_path, head=False)
    proc, url = _start(path, tmp_path / "log.txt")
    try:
        status, answer = _post(url, "/v1/rerank", json.dumps({"query": QUERY,
                                                              "documents": DOCS}))
    finally:
        _stop(proc)
    assert status == 400
    assert "not a reranker" in answer["error"]["message"]
    assert "pooling is mean" in answer["error"]["message"]


def test_the_gelu_table_kernel_is_its_numpy_twin() -> None:
    """BERT's GELU (``encoder.gelu_f16``, ggml's float16 table) equals ``ops.gelu_f16``
    bit for bit, edges included."""
    from gguflm.model import ops
    from gguflm.model.encoder import gelu_f16

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(4000) * 4, [-10, -9.999, 9.999, 10, 12, -12, 0,
                                                         6e-8, -6e-8, 65000]]).astype(np.float32)
    x = x.reshape(2, -1)
    assert np.array_equal(gelu_f16(x), ops.gelu_f16(x))


def test_a_quantized_reranker_loads(paths: dict[str, Path], tmp_path: Path,
                                    llms: dict[str, LLM]) -> None:
    """llama-quantize (and gguflm quantize, byte for byte the same) writes the [n_embd, 1]
    head as a 1-D tensor, as ggml leaves out trailing dimensions of 1; it loads, and its
    scores stay near the F32 file's (Q8_0 weights)."""
    import subprocess
    import sys

    out = tmp_path / "bert-q8_0.gguf"
    subprocess.run([sys.executable, "-m", "gguflm.cli", "quantize", str(paths["bert"]),
                    str(out), "Q8_0"], check=True, capture_output=True)
    from gguflm.gguf import open as open_gguf

    assert len(open_gguf(out).tensors["cls.output.weight"].shape) == 1
    q = LLM(str(out), parallel=1)
    try:
        docs = ["a cat sat on the mat", "stock markets fell", "the cat is on the mat"]
        def scores(llm: LLM) -> list[float]:
            results = llm.rerank("where is the cat", docs)["results"]
            return [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])]

        got, want = scores(q), scores(llms["bert"])
        assert np.allclose(got, want, atol=0.1), (got, want)  # 8-bit weights, tiny model
    finally:
        q.close()
