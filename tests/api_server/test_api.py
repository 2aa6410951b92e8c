"""``gguflm.LLM`` (the Python API) and ``gguflm chat`` on SmolLM2: OpenAI-shaped results,
streaming, stop strings, KV-cache reuse across calls, errors, and the terminal chat.

Few tokens per call keep this quick; greedy (temperature 0) makes results comparable.
"""

from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.api import LLM, InvalidRequestError
from gguflm.cli import main
from gguflm.engine.scheduler import common_prefix
from gguflm.engine.stops import StopScanner

PROMPT = "The capital of France is"
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> LLM:
    model = gguflm.LLM(smollm2_path, n_ctx=1024, threads=2)
    yield model
    model.close()


# --- completion ---------------------------------------------------------------------------------

def test_generate_is_openai_shaped_and_matches_gguflm_run(
        llm: LLM, smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = llm.generate(PROMPT, max_tokens=8, temperature=0)
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    assert out["model"] == smollm2_path.name and isinstance(out["created"], int)
    (choice,) = out["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] == "length"
    n_prompt = len(llm.tokenize(PROMPT))
    assert out["usage"]["prompt_tokens"] == n_prompt
    assert out["usage"]["completion_tokens"] == 8
    assert out["usage"]["total_tokens"] == n_prompt + 8
    # the bar: the API and `gguflm run` give the same text at temperature 0
    assert main(["run", str(smollm2_path), "-p", PROMPT, "-n", "8", "--temp", "0",
                 "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert choice["text"] == run["text"] and choice["text"].strip()
    assert llm.tokenize(PROMPT) == run["prompt_tokens"]


def test_stream_pieces_add_up_to_generate(llm: LLM) -> None:
    whole = llm.generate(PROMPT, max_tokens=6, temperature=0)
    chunks = list(llm.stream(PROMPT, max_tokens=6, temperature=0, include_usage=True))
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    texts = [c["choices"][0]["text"] for c in chunks[:-1]]
    assert "".join(texts) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-2]] == [None] * (len(chunks) - 2)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    # a repeated prompt reuses the cache (all but the last token) and gives the same text
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == \
        len(llm.tokenize(PROMPT)) - 1


def test_warm_up_leaves_the_context_alone(llm: LLM) -> None:
    llm.generate(PROMPT, max_tokens=2, temperature=0)
    assert llm.warm_up() > 0
    again = llm.generate(PROMPT, max_tokens=2, temperature=0)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == \
        len(llm.tokenize(PROMPT)) - 1


def test_warm_up_loads_every_path_a_first_request_takes(smollm2_path: Path) -> None:
    """A server's warm-up loads the prompt path too (a first batch of several prompts runs
    the layer-by-layer fused layers) and builds the tables made on first use, in a fresh process
    where nothing else has."""
    code = ("import sys, gguflm; from gguflm.model import fused\n"
            "llm = gguflm.LLM(sys.argv[1], parallel=2, threads=1)\n"
            "assert not fused.attention_step.overloads and llm.intake._max_token_bytes is None\n"
            "llm.warm_up()\n"
            "print(len(fused.attention_step.overloads), len(fused.ffn_step.overloads),"
            " llm.intake._max_token_bytes)\n")
    out = subprocess.run([sys.executable, "-c", code, str(smollm2_path)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    n_attn, n_ffn, longest = out.stdout.split()
    assert int(n_attn) >= 1 and int(n_ffn) >= 1 and int(longest) >= 4


def test_stop_strings(llm: LLM) -> None:
    full = llm.generate(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"]
    assert "\n" in full  # " Paris.\n\n..." on SmolLM2; the cuts below rely on it
    cut = llm.generate(PROMPT, max_tokens=8, temperature=0, stop="\n")
    assert cut["choices"][0]["text"] == full[:full.index("\n")]
    assert cut["choices"][0]["finish_reason"] == "stop"
    # a stop string spanning several tokens, and the earliest of several
    span = full[full.index("\n") - 2:full.index("\n") + 1]
    out = llm.generate(PROMPT, max_tokens=8, temperature=0, stop=["zzz", span])
    assert out["choices"][0]["text"] == full[:full.index(span)]
    streamed = "".join(c["choices"][0]["text"] for c in llm.stream(
        PROMPT, max_tokens=8, temperature=0, stop=[span]))
    assert streamed == full[:full.index(span)]


def test_stop_scanner_holds_back_possible_starts() -> None:
    s = StopScanner(["</end>", "STOP"])
    assert s.feed("abc</") == "abc"  # "</" may begin "</end>"
    assert s.feed("en") == ""
    assert s.feed("x ST") == "</enx "
    assert s.feed("OP and more") == "" and s.hit
    assert s.feed("later") == "" and s.flush() == ""
    s = StopScanner(["ab"])
    assert s.feed("a") == "" and s.flush() == "a"
    assert StopScanner([]).feed("anything") == "anything"
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


def test_seeded_sampling_repeats(llm: LLM) -> None:
    a = llm.generate(PROMPT, max_tokens=6, temperature=1.0, seed=1234)
    b = llm.generate(PROMPT, max_tokens=6, temperature=1.0, seed=1234)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_echo_and_token_prompt(llm: LLM) -> None:
    ids = llm.tokenize(PROMPT)
    a = llm.generate(ids, max_tokens=4, temperature=0, echo=True)
    b = llm.generate(PROMPT, max_tokens=4, temperature=0)
    assert a["choices"][0]["text"] == PROMPT + b["choices"][0]["text"]
    assert llm(PROMPT, max_tokens=4, temperature=0)["choices"][0]["text"] == \
        b["choices"][0]["text"]  # llama-cpp-python's call style


def test_tokenize_detokenize(llm: LLM) -> None:
    ids = llm.tokenize("Hello, world! café")
    assert llm.tokenize(b"Hello, world! caf\xc3\xa9") == ids
    assert llm.detokenize(ids) == "Hello, world! café"
    special = llm.tokenize("<|im_start|>user", parse_special=True)
    assert special[0] == llm.tokenizer.token_id("<|im_start|>")
    assert llm.detokenize(special) == "user"
    assert llm.detokenize(special, special=True) == "<|im_start|>user"


# --- chat ---------------------------------------------------------------------------------------

def test_chat_shapes_and_streaming(llm: LLM) -> None:
    out = llm.chat(CHAT, max_tokens=6, temperature=0)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    msg = out["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"]
    assert out["usage"]["prompt_tokens"] == len(llm.chat_prompt_ids(CHAT))
    chunks = list(llm.chat(CHAT, max_tokens=6, temperature=0, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        msg["content"]
    # text parts are joined into a string for the template
    parts = [CHAT[0], {"role": "user", "content": [{"type": "text", "text": CHAT[1]["content"]}]}]
    assert llm.chat_prompt_ids(parts) == llm.chat_prompt_ids(CHAT)
    with pytest.raises(InvalidRequestError, match="only text parts"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])


def test_chat_turns_reuse_the_cache_and_agree_with_a_fresh_run(llm: LLM) -> None:
    first = llm.chat(CHAT, max_tokens=12, temperature=0)
    history = CHAT + [first["choices"][0]["message"], {"role": "user", "content": "And Italy?"}]
    second = llm.chat(history, max_tokens=8, temperature=0)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # everything up to the end of the first reply is reused, not evaluated again
    assert cached >= first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1
    assert cached < second["usage"]["prompt_tokens"]
    llm.reset()
    fresh = llm.chat(history, max_tokens=8, temperature=0)
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # The first reply sits in the reused cache as tokens evaluated one at a time, while the
    # fresh run evaluates it as one batch: with 8-bit activations (as llama.cpp) the logits
    # differ by tenths, so the replies agree wherever the model is decisive, as llama.cpp's
    # own runs do: up to the first difference, where the top-1/top-2 margin must be small.
    a = llm.tokenize(second["choices"][0]["message"]["content"], add_special=False)
    b = llm.tokenize(fresh["choices"][0]["message"]["content"], add_special=False)
    if a != b:
        split = common_prefix(a, b)
        prompt = llm.chat_prompt_ids(history)
        logits = llm.model.logits(prompt + b[:split])[-1]
        top2 = np.sort(logits)[-2:]
        assert top2[1] - top2[0] < 1.0, f"replies differ at a decisive step {split}"


def test_chat_template_override(smollm2_path: Path, tmp_path: Path) -> None:
    tmpl = tmp_path / "plain.jinja"
    tmpl.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                    "{% if add_generation_prompt %}assistant:{% endif %}")
    with LLM(smollm2_path, n_ctx=64, chat_template=tmpl) as other:
        assert other.apply_chat_template(CHAT[1:]) == \
            "user: What is the capital of France?\nassistant:"
        assert other.chat_template.name == str(tmpl)


# --- errors and concurrency -----------------------------------------------------------------------

def test_errors(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="longer than the context") as info:
        llm.generate("hello " * 1100, max_tokens=1)
    assert info.value.code == "context_length_exceeded" and info.value.param == "prompt"
    with pytest.raises(InvalidRequestError, match="temperature") as info:
        llm.generate(PROMPT, temperature=float("nan"))
    assert info.value.param == "temperature"
    with pytest.raises(InvalidRequestError, match="top_p must be between 0 and 1"):
        llm.generate(PROMPT, top_p=2.0)
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        llm.generate(PROMPT, max_tokens="8")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="stop"):
        llm.generate(PROMPT, stop=[1])  # type: ignore[list-item]
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        llm.generate([1, 10**9])
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate("")  # SmolLM2 adds no BOS
    with pytest.raises(InvalidRequestError, match="seed"):
        llm.generate(PROMPT, seed=2**40)
    with pytest.raises(TypeError, match="unexpected"):
        llm.generate(PROMPT, temprature=0)
    with pytest.raises(InvalidRequestError, match="messages"):
        llm.chat([])
    # the LLM still works after all that
    assert llm.generate(PROMPT, max_tokens=1, temperature=0)["usage"]["completion_tokens"] == 1


def test_an_open_stream_does_not_block_another_call(llm: LLM) -> None:
    """Calls run side by side in the engine: a second call from the same thread while its
    first stream is open completes, and both give their own greedy text."""
    alone = llm.generate(PROMPT, max_tokens=4, temperature=0)["choices"][0]["text"]
    it = llm.stream(PROMPT, max_tokens=4, temperature=0)
    first = next(it)["choices"][0]["text"]
    other = llm.generate("Once upon a time", max_tokens=2, temperature=0)
    assert other["usage"]["completion_tokens"] == 2
    rest = "".join(c["choices"][0]["text"] for c in it)
    assert first + rest == alone


def test_cancel_ends_a_run(llm: LLM) -> None:
    calls = []
    out = llm.generate(PROMPT, max_tokens=50, temperature=0,
                       cancel=lambda: calls.append(1) or len(calls) > 3)
    assert out["choices"][0]["finish_reason"] == "cancelled"
    # the engine sees the cancellation at its next step: a token or two may follow
    assert 3 <= out["usage"]["completion_tokens"] <= 6
    assert llm.last_run["finish_reason"] == "cancelled"


def test_threads_share_one_llm(llm: LLM) -> None:
    expected = llm.generate(PROMPT, max_tokens=4, temperature=0)["choices"][0]["text"]
    results: list[str] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            chunks = llm.stream(PROMPT, max_tokens=4, temperature=0)
            results.append("".join(c["choices"][0]["text"] for c in chunks))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and results == [expected] * 3


# --- gguflm chat ----------------------------------------------------------------------------------

def test_chat_command_streams_and_reuses_earlier_turns(
        llm: LLM, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    system = CHAT[0]["content"]
    monkeypatch.setattr(sys, "stdin", io.StringIO(
        f"{CHAT[1]['content']}\nAnd Italy?\n/bogus\n/reset\n{CHAT[1]['content']}\n/exit\n"))
    rc = main(["chat", str(smollm2_path), "--system", system, "-n", "6", "--temp", "0",
               "-c", "512", "-v"])
    out, err = capsys.readouterr()
    assert rc == 0
    # each reply follows its prompt "> "; commands leave bare prompts before it
    replies = [re.sub(r"^(> )+", "", line) for line in out.splitlines()
               if line.startswith("> ") and line.strip(" >")]
    llm.reset()
    first = llm.chat(CHAT, max_tokens=6, temperature=0)["choices"][0]["message"]
    assert replies[0] == first["content"]
    assert replies[2] == first["content"]  # after /reset: the same first turn again
    stats = [tuple(map(int, m)) for m in re.findall(r"prompt (\d+) tokens: (\d+) new, "
                                                   r"(\d+) cached", err)]
    assert len(stats) == 3
    assert stats[0][2] == 0  # nothing cached before the first turn
    total, new, cached = stats[1]
    assert cached > stats[0][0] and new < total  # turn 2: only the new suffix is evaluated
    assert "unknown command /bogus" in err and "[conversation cleared]" in err


def test_chat_command_ctrl_c_stops_the_reply_not_the_chat(smollm2_path: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gguflm.cli", "chat", str(smollm2_path), "-n", "400",
         "--temp", "0", "-c", "512", "-v"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        # Ctrl-C as at a terminal: a shell's background job (a CI runner started with &)
        # ignores SIGINT, and its children inherit that, so Python would never see it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        proc.stdin.write(b"Write a long story about a dragon.\n")
        proc.stdin.flush()
        seen = b""
        deadline = time.monotonic() + 120
        while len(seen.split(b"> ", 1)[-1]) < 8 and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1)[0]:
                seen += os.read(proc.stdout.fileno(), 4096)
        assert len(seen.split(b"> ", 1)[-1]) >= 8, "no reply began"
        proc.send_signal(signal.SIGINT)
        proc.stdin.write(b"/exit\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert b"stop: interrupted" in err
    assert (seen + out).count(b"> ") >= 2  # back at the prompt after the interrupt


def test_a_list_of_prompts_is_computed_together(llm: LLM) -> None:
    prompts = [PROMPT, "Once upon a time", [1, 2, 3]]
    alone = [llm.generate(p, max_tokens=5, temperature=0)["choices"][0]["text"]
             for p in prompts]
    out = llm.generate(prompts, max_tokens=5, temperature=0)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert [c["text"] for c in out["choices"]] == alone
    assert out["usage"]["completion_tokens"] == 15
