"""Models from Hugging Face, against a local server speaking the Hub's protocol
(tests/hubserver.py, pointed at by HF_ENDPOINT): ``-hf ORG/REPO:QUANT``, ``hf.co/...``,
``LLM.from_pretrained``; the tag rule; the shared cache (no second download, offline use,
``huggingface_hub`` finds the files); resumed and refused downloads; gated repositories;
split models. Real CLI runs in subprocesses, a real server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gguflm.hf import tags
from hubserver import HubServer

REPO = "org/Tiny-GGUF"
PROMPT = ["-p", "Hello there", "-n", "8", "--temp", "0", "--no-perf"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_q4(reference: Path) -> Path:
    return reference / "tiny-llama-q4_0" / "tiny-llama-q4_0.gguf"


@pytest.fixture(scope="module")
def files(tiny_q4: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model, variants of it that differ in general.name (so that each tag is a
    different blob), and its shards."""
    from gguflm import gguf
    from gguflm.gguf.split import plan_split, split_file
    from gguflm.gguf.writer import GGUFWriter

    out = tmp_path_factory.mktemp("hubfiles")
    made = {"Q4_0": tiny_q4}
    with gguf.open(tiny_q4) as src:
        for tag in ("Q8_0", "Q4_K_M", "mmproj"):
            w = GGUFWriter.from_file(src, out / f"{tag}.gguf")
            w.set("general.name", f"tiny {tag}")
            made[tag] = w.write()
        for i, shard in enumerate(split_file(src, out / "Tiny-Q4_0",
                                             plan_split(src, max_tensors=10))):
            made[f"shard{i}"] = shard
    (out / "README.md").write_text("# Tiny\n")
    made["readme"] = out / "README.md"
    return made


@pytest.fixture
def hub(files: dict[str, Path]):
    with HubServer() as server:
        server.add_repo(REPO, {
            "mmproj-Tiny-Q4_K_M.gguf": files["mmproj"],  # listed first: never a model
            "Tiny-Q4_0.gguf": files["Q4_0"], "Tiny-Q8_0.gguf": files["Q8_0"],
            "Tiny-Q4_K_M.gguf": files["Q4_K_M"], "README.md": files["readme"]})
        server.add_repo("org/Split-GGUF", {
            f"Q4_0/Tiny-Q4_0-{i:05d}-of-00004.gguf": files[f"shard{i - 1}"]
            for i in (1, 2, 3, 4)})
        server.add_repo("org/Gated-GGUF", {"Tiny-Q4_0.gguf": files["Q4_0"]}, gated=True)
        server.add_repo("org/Broken-Split-GGUF", {  # shard 3 never uploaded
            f"Tiny-Q4_0-{i:05d}-of-00004.gguf": files[f"shard{i - 1}"] for i in (1, 2, 4)})
        yield server


@pytest.fixture
def env(hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a user of this Hub with an empty cache (also set in this
    process, for the API)."""
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                 "HF_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    return dict(os.environ)


def _gguflm(env: dict[str, str], *argv: str | Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gguflm.cli", *map(str, argv)],
                          env={**env, **extra}, capture_output=True, text=True, timeout=900)


def _pulled(r: subprocess.CompletedProcess) -> Path:
    """The path ``gguflm pull`` reported."""
    assert r.returncode == 0, r.stderr
    return Path(r.stderr.strip().splitlines()[-1].split(": ", 1)[1].rsplit(" (", 1)[0])


def _one_error(r: subprocess.CompletedProcess, *words: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and lines[-1].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for word in words:
        assert word in lines[-1], lines[-1]
    return lines[-1]


def _cache_files(env: dict[str, str]) -> list[str]:
    root = Path(env["HF_HOME"])
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# -- the tag rule (llama.cpp's common/download.cpp) ------------------------------------------

def test_tag_rule_is_llama_cpps() -> None:
    files = ["mmproj-M-Q4_K_M.gguf", "M-Q8_0.gguf", "M-Q4_K_M-00002-of-00002.gguf",
             "M-Q4_K_M-00001-of-00002.gguf", "M-F16.gguf", "README.md"]
    assert tags.pick_model_file(files) == "M-Q4_K_M-00001-of-00002.gguf"
    assert tags.pick_model_file(files, "q8_0") == "M-Q8_0.gguf"  # any case
    assert tags.pick_model_file(files, "Q5_K_M") is None  # a tag given: no fallback
    assert tags.pick_model_file(["a-F16.gguf", "a-Q8_0.gguf"]) == "a-Q8_0.gguf"
    assert tags.pick_model_file(["b-IQ2_XS.gguf", "a-F16.gguf"]) == "b-IQ2_XS.gguf"
    assert tags.pick_model_file(["x-Q4_0.gguf"], "Q4") is None  # "Q4" then . or -
    assert tags.split_files(files, "M-Q4_K_M-00001-of-00002.gguf") == [
        "M-Q4_K_M-00001-of-00002.gguf", "M-Q4_K_M-00002-of-00002.gguf"]
    assert tags.available_tags(files) == ["Q8_0", "Q4_K_M", "F16"]


def test_pull_picks_the_file_by_tag(env: dict[str, str]) -> None:
    assert _pulled(_gguflm(env, "pull", f"hf.co/{REPO}")).name == "Tiny-Q4_K_M.gguf"
    assert _pulled(_gguflm(env, "pull", f"hf.co/{REPO}:q8_0")).name == "Tiny-Q8_0.gguf"
    line = _one_error(_gguflm(env, "pull", f"hf.co/{REPO}:Q5_K_M"), "Q5_K_M")
    assert "Q4_0" in line and "Q8_0" in line and "Q4_K_M" in line


# -- running a model from the Hub ------------------------------------------------------------

def test_hf_runs_like_the_local_file_then_from_the_cache_and_offline(
        env: dict[str, str], hub: HubServer, tiny_q4: Path) -> None:
    local = _gguflm(env, "run", tiny_q4, *PROMPT)
    assert local.returncode == 0 and local.stdout.strip(), local.stderr
    first = _gguflm(env, "run", "-hf", f"{REPO}:Q4_0", *PROMPT)
    assert first.returncode == 0, first.stderr
    assert first.stdout == local.stdout
    assert "download org/Tiny-GGUF/Tiny-Q4_0.gguf" in first.stderr  # progress, not a tty
    assert hub.count("GET", r"^/cdn/") == 1
    # ollama's spelling, a second time: nothing downloaded
    again = _gguflm(env, "run", f"hf.co/{REPO}:q4_0", *PROMPT)
    assert again.stdout == local.stdout and hub.count("GET", r"^/cdn/") == 1
    # offline: no request at all
    before = len(hub.requests)
    offline = _gguflm(env, "run", "-hf", f"{REPO}:Q4_0", *PROMPT, HF_HUB_OFFLINE="1")
    assert offline.stdout == local.stdout, offline.stderr
    assert len(hub.requests) == before


def test_split_model_downloads_whole_and_generates_what_the_whole_file_does(
        env: dict[str, str], hub: HubServer, tiny_q4: Path) -> None:
    local = _gguflm(env, "run", tiny_q4, *PROMPT)
    split = _gguflm(env, "run", "-hf", "org/Split-GGUF:Q4_0", *PROMPT)
    assert split.returncode == 0, split.stderr
    assert split.stdout == local.stdout
    assert hub.count("GET", r"^/cdn/") == 4
    snapshot = next(Path(env["HF_HOME"]).glob("hub/models--org--Split-GGUF/snapshots/*/Q4_0"))
    assert sorted(p.name for p in snapshot.iterdir()) == [
        f"Tiny-Q4_0-{i:05d}-of-00004.gguf" for i in (1, 2, 3, 4)]


def test_from_pretrained_takes_a_glob_and_the_files_are_huggingface_hubs(
        env: dict[str, str], hub: HubServer, tiny_q4: Path) -> None:
    import huggingface_hub

    from gguflm import LLM
    from gguflm.gguf import GGUFError

    with pytest.raises(GGUFError, match="2 files match"):
        LLM.from_pretrained(REPO, filename="Tiny-Q4_*.gguf")
    with LLM.from_pretrained(REPO, filename="*Q4_0.gguf", revision="main", n_ctx=64,
                             parallel=1) as llm, LLM(tiny_q4, n_ctx=64, parallel=1) as ref:
        assert llm.model_path.name == "Tiny-Q4_0.gguf"
        got = llm.generate("Hello there", max_tokens=8, temperature=0)
        want = ref.generate("Hello there", max_tokens=8, temperature=0)
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
    cache = Path(env["HF_HOME"]) / "hub"
    found = huggingface_hub.try_to_load_from_cache(REPO, "Tiny-Q4_0.gguf", cache_dir=cache)
    assert isinstance(found, str) and Path(found) == llm.model_path
    assert _sha256(Path(found)) == _sha256(tiny_q4)
    # huggingface_hub's own download finds the blob: it asks for the metadata only
    gets = hub.count("GET", r"^/cdn/")
    path = huggingface_hub.hf_hub_download(REPO, "Tiny-Q4_0.gguf", cache_dir=cache,
                                           endpoint=hub.url)
    assert Path(path) == llm.model_path and hub.count("GET", r"^/cdn/") == gets


def test_a_file_huggingface_hub_downloaded_is_not_downloaded_again(
        env: dict[str, str], hub: HubServer) -> None:
    import huggingface_hub

    cache = Path(env["HF_HOME"]) / "hub"
    path = huggingface_hub.hf_hub_download(REPO, "Tiny-Q8_0.gguf", cache_dir=cache,
                                           endpoint=hub.url)
    gets = hub.count("GET", r"^/cdn/")
    assert _pulled(_gguflm(env, "pull", f"hf.co/{REPO}:Q8_0")) == Path(path)
    assert hub.count("GET", r"^/cdn/") == gets


# -- downloads that go wrong -----------------------------------------------------------------

def test_a_dropped_connection_is_resumed_with_range(env: dict[str, str], hub: HubServer,
                                                    files: dict[str, Path]) -> None:
    sha = _sha256(files["Q4_K_M"])
    hub.drop_after[sha] = 3_000_000
    path = _pulled(_gguflm(env, "pull", f"hf.co/{REPO}:Q4_K_M"))
    ranges = [h.get("range") for m, p, h in hub.requests if m == "GET" and p == f"/cdn/{sha}"]
    assert ranges[0] is None and len(ranges) == 2
    assert ranges[1].startswith("bytes=") and 0 < int(ranges[1][6:-1]) <= 3_000_000
    assert _sha256(path) == sha and path.resolve().name == sha


def test_an_interrupted_download_continues_where_it_stopped(
        env: dict[str, str], hub: HubServer, files: dict[str, Path]) -> None:
    data = files["Q8_0"].read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    blobs = Path(env["HF_HOME"]) / "hub" / "models--org--Tiny-GGUF" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha}.incomplete").write_bytes(data[:5_000_000])  # a killed earlier run
    path = _pulled(_gguflm(env, "pull", f"hf.co/{REPO}:Q8_0"))
    ranges = [h.get("range") for m, p, h in hub.requests if m == "GET" and p == f"/cdn/{sha}"]
    assert ranges == ["bytes=5000000-"]
    assert _sha256(path) == sha and not (blobs / f"{sha}.incomplete").exists()


def test_wrong_bytes_are_refused_and_leave_nothing_usable(
        env: dict[str, str], hub: HubServer, files: dict[str, Path]) -> None:
    import huggingface_hub

    hub.corrupt.add(_sha256(files["Q4_0"]))
    r = _gguflm(env, "run", "-hf", f"{REPO}:Q4_0", *PROMPT)
    _one_error(r, "sha256", "discarded")
    assert r.stdout == ""
    assert not [f for f in _cache_files(env) if "/blobs/" in f or "/snapshots/" in f]
    found = huggingface_hub.try_to_load_from_cache(
        REPO, "Tiny-Q4_0.gguf", cache_dir=Path(env["HF_HOME"]) / "hub")
    assert not isinstance(found, str)


def test_a_file_outside_lfs_is_checked_against_its_git_sha1(
        env: dict[str, str], hub: HubServer, files: dict[str, Path]) -> None:
    from hubserver import git_blob_sha1

    path = _pulled(_gguflm(env, "pull", f"hf.co/{REPO}/README.md"))
    assert path.read_bytes() == files["readme"].read_bytes()
    assert path.resolve().name == git_blob_sha1(files["readme"].read_bytes())


def test_gated_repository_needs_a_token(env: dict[str, str], hub: HubServer) -> None:
    ref = "hf.co/org/Gated-GGUF:Q4_0"
    _one_error(_gguflm(env, "pull", ref), "gated", "HF_TOKEN")
    _one_error(_gguflm(env, "pull", ref, HF_TOKEN="hf_wrong"), "gated", "no access")
    assert _pulled(_gguflm(env, "pull", ref, HF_TOKEN=hub.token)).name == "Tiny-Q4_0.gguf"
    # the token goes to the Hub, never to the CDN's other origin
    cdn = [h for m, p, h in hub.requests if p.startswith("/cdn/")]
    assert cdn and not any("authorization" in h for h in cdn)
    assert any(h.get("authorization") == f"Bearer {hub.token}"
               for m, p, h in hub.requests if "/resolve/" in p)


def test_gated_with_hft_and_hff_pick_the_file(env: dict[str, str], hub: HubServer) -> None:
    r = _gguflm(env, "inspect", "-hf", "org/Gated-GGUF", "-hft", hub.token,
                "-hff", "Tiny-Q4_0.gguf")
    assert r.returncode == 0, r.stderr
    assert "snapshots" in r.stdout and "Tiny-Q4_0.gguf" in r.stdout
    r = _gguflm(env, "inspect", "-hff", "Tiny-Q4_0.gguf")
    assert r.returncode == 2 and "-hf" in r.stderr


def test_offline_without_the_files_and_unknown_names_are_clear_errors(
        env: dict[str, str]) -> None:
    _one_error(_gguflm(env, "pull", f"hf.co/{REPO}", HF_HUB_OFFLINE="1"),
               "not in the cache", "HF_HUB_OFFLINE")
    _one_error(_gguflm(env, "pull", "hf.co/org/Nothing-GGUF"), "not found")
    _one_error(_gguflm(env, "pull", "hf.co/org/Broken-Split-GGUF"), "lacks shard(s) 3")
    _one_error(_gguflm(env, "pull", f"hf.co/{REPO}@v9:Q4_0"), "no revision 'v9'")
    _one_error(_gguflm(env, "pull", "hf.co/org/Tiny-GGUF/Other.gguf"), "no file",
               "Tiny-Q4_0.gguf")
    r = _gguflm(env, "run", "-hf", "not-a-repo", "-p", "x")
    assert r.returncode == 2 and "ORG/REPO" in r.stderr


LLAMA_BENCH = Path(os.environ.get("LLAMA_BENCH", "/work/llama-build/bin/llama-bench"))


@pytest.mark.skipif(not LLAMA_BENCH.is_file(),
                    reason=f"llama.cpp's llama-bench not built ({LLAMA_BENCH}; set LLAMA_BENCH)")
def test_llama_cpp_and_gguflm_share_the_cache(env: dict[str, str], hub: HubServer) -> None:
    """llama.cpp's -hf (its own client, same server) and gguflm each use what the other
    fetched: one download of each file in all."""
    def bench(tag: str, *extra: str) -> None:
        r = subprocess.run([LLAMA_BENCH, "-hf", f"{REPO}:{tag}", "-p", "4", "-n", "2", "-r", "1",
                            *extra], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and "pp4" in r.stdout, r.stderr[-2000:]

    bench("Q4_0")
    assert _pulled(_gguflm(env, "pull", f"hf.co/{REPO}:Q4_0")).name == "Tiny-Q4_0.gguf"
    assert _pulled(_gguflm(env, "pull", f"hf.co/{REPO}:Q8_0")).name == "Tiny-Q8_0.gguf"
    bench("Q8_0", "--offline")
    assert hub.count("GET", r"^/cdn/") == 2
