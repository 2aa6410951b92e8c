"""Hostile input, round 3: files the CLI reads as text, and grammars too large for the
constraint engine.

1. Every option that names a file the CLI reads as text (prompts, system messages,
   grammars, JSON schemas, chat templates) refuses, with one ``error:`` line and at once,
   what is not a regular file (a FIFO, /dev/zero, /dev/urandom, a directory, a link to a
   device), a file over its cap and text that is not UTF-8; the model is never loaded first.
2. A grammar, Lark grammar, regex, JSON schema or tool list too large for llguidance is
   refused before llguidance sees it (bytes, symbols, nesting), by the CLI and the server,
   in well under a second; llguidance's panics never reach a user; grammars just under the
   bounds still work.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguflm.cli import CLIError, textfiles
from gguflm.engine import grammar as grammar_module
from gguflm.engine.constraints import Constraint
from gguflm.engine.errors import ConstraintError, ConstraintFailure
from gguflm.engine.grammar import (
    MAX_GRAMMAR_NESTING,
    TOO_COMPLEX,
    constraint_from_request,
    gbnf_grammar,
    lark_grammar,
    llguidance_errors,
)
from gguflm.engine.tools import tool_call_grammar, validate_tools
from test_hostile_server import _health_fast, _post, _start, _stop

CLI = [sys.executable, "-m", "gguflm.cli"]
PANIC_MARKS = ("panic", "backtrace", "assertion failed", "<unknown>", "<state>")

# runs gguflm's main() on each argv of a JSON list, in one process (one start-up for many
# cases) under a 4 GiB address-space limit, so that an unbounded read fails fast instead of
# eating the machine's memory; the caller's timeout catches a read that blocks
_DRIVER = r"""
import contextlib, io, json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from gguflm.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except MemoryError:
            rc = "MemoryError"
    results.append({"rc": rc, "err": err.getvalue(), "seconds": time.perf_counter() - t0})
print(json.dumps(results))
"""


def _drive(argvs: list[list[str]], timeout: float = 60) -> list[dict]:
    out = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(argvs)],
                         capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _one_error_line(result: dict) -> str:
    lines = result["err"].strip().splitlines()
    assert result["rc"] == 1 and len(lines) == 1 and lines[0].startswith("error: "), result
    assert not any(mark in lines[0] for mark in PANIC_MARKS), lines[0]
    return lines[0]


# --- 1. files the CLI reads as text -----------------------------------------------------------

# (command, option as typed, the name the error gives it, the cap's kind)
FILE_OPTIONS = [
    ("run", "-f", "-f", "prompt"),
    ("run", "-sysf", "--system-prompt-file", "prompt"),
    ("run", "--grammar-file", "--grammar-file", "grammar"),
    ("run", "--grammar", "--grammar", "grammar"),
    ("run", "-jf", "--json-schema-file", "grammar"),
    ("run", "-j", "--json-schema", "grammar"),
    ("run", "--chat-template", "--chat-template", "template"),
    ("chat", "--grammar-file", "--grammar-file", "grammar"),
    ("chat", "-jf", "--json-schema-file", "grammar"),
    ("chat", "--chat-template-file", "--chat-template", "template"),
    ("serve", "--chat-template", "--chat-template", "template"),
    ("tokenize", "-f", "-f", "prompt"),
    ("embed", "-f", "-f", "prompt"),
    ("perplexity", "-f", "-f", "prompt"),
]
CAPS = {"prompt": textfiles.PROMPT_FILES, "grammar": textfiles.GRAMMAR_FILES,
        "template": textfiles.TEMPLATE_FILES}


def _bad_files(tmp: Path, cap: int) -> dict[str, tuple[str, str]]:
    """Paths that must be refused, each with what the error says about it."""
    os.mkfifo(tmp / "fifo")
    (tmp / "dir").mkdir()
    (tmp / "zero-link").symlink_to("/dev/zero")
    with open(tmp / "big", "wb") as f:  # sparse: refused from its size, never read
        f.truncate(cap + 1)
    (tmp / "latin1").write_bytes(b"caf\xe9 \xff\xfe")
    return {"fifo": (str(tmp / "fifo"), "not a regular file (a FIFO)"),
            "zero": ("/dev/zero", "not a regular file (a character device)"),
            "urandom": ("/dev/urandom", "not a regular file (a character device)"),
            "dir": (str(tmp / "dir"), "not a regular file (a directory)"),
            "link": (str(tmp / "zero-link"), "not a regular file (a character device)"),
            "big": (str(tmp / "big"), "is over the"),
            "utf8": (str(tmp / "latin1"), "is not UTF-8 text")}


def _argv(command: str, option: str, path: str, model: str) -> list[str]:
    if command == "run":
        prompt = [] if option == "-f" else ["-p", "hi"]
        return ["run", model, "-n", "1", *prompt, option, path]
    if command == "serve":
        return ["serve", model, "--port", "0", option, path]
    return [command, model, option, path]


@pytest.mark.parametrize("command, option, name, kind", FILE_OPTIONS,
                         ids=[f"{c}{o}" for c, o, _, _ in FILE_OPTIONS])
def test_a_file_option_refuses_what_it_cannot_read(command: str, option: str, name: str,
                                                   kind: str, tmp_path: Path,
                                                   smollm2_path: Path) -> None:
    cap = CAPS[kind]
    assert textfiles.TEXT_FILE_OPTIONS[name] == cap
    files = _bad_files(tmp_path, cap.limit)
    results = _drive([_argv(command, option, path, str(smollm2_path))
                      for path, _ in files.values()])
    for (case, (path, says)), result in zip(files.items(), results):
        if command == "tokenize" and case == "utf8":  # it shows invalid bytes as \xNN
            assert result["rc"] == 0, result
            continue
        line = _one_error_line(result)
        assert name in line and path in line, (case, line)
        assert says in line, (case, line)
        if case == "big":
            assert f"over the {cap.limit // 2**20} MiB limit for {cap.kind}" in line, line
        assert result["seconds"] < 2, (case, result)  # refused before the model loads


def test_the_reported_commands_answer_at_once(smollm2_path: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(20 * 2**20)
    for option, path, says in (
            ("--grammar-file", "/dev/zero", "--grammar-file /dev/zero: not a regular file (a "
                                            "character device)"),
            ("--json-schema-file", "/dev/urandom", "not a regular file"),
            ("--json-schema-file", str(big), "20.0 MiB is over the 4 MiB limit for grammar "
                                             "and schema files")):
        t0 = time.perf_counter()
        out = subprocess.run([*CLI, "run", str(smollm2_path), "-p", "hi", "-n", "3", option,
                              path], capture_output=True, text=True, timeout=30)
        assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith("error: ") and says in out.stderr, out.stderr
        assert time.perf_counter() - t0 < 10


def test_standard_input_is_read_up_to_the_cap(smollm2_path: Path) -> None:
    with open("/dev/zero", "rb") as zero:
        out = subprocess.run([*CLI, "run", str(smollm2_path), "-n", "1", "-f", "-"],
                             stdin=zero, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1, out.stderr[-500:]
    assert out.stderr.strip() == ("error: -f -: more than 16.0 MiB of standard input is over "
                                  "the 16 MiB limit for prompt and text files")


def test_read_text_file_takes_a_file_at_its_cap(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(textfiles.TEXT_FILE_OPTIONS, "-f", textfiles.Cap(8, "tests"))
    f = tmp_path / "p.txt"
    f.write_text("12345678")
    assert textfiles.read_text_file(f, "-f") == "12345678"
    f.write_text("123456789")
    with pytest.raises(CLIError, match="9 bytes is over the 8 bytes limit for tests"):
        textfiles.read_text_file(f, "-f")
    with pytest.raises(CLIError, match="cannot read -f .*none.txt: No such file"):
        textfiles.read_text_file(tmp_path / "none.txt", "-f")
    (tmp_path / "link").symlink_to(f)  # a link to a regular file is that file
    f.write_text("héllo")
    assert textfiles.read_text_file(tmp_path / "link", "-f") == "héllo"


# --- 2. grammars too large for the constraint engine -----------------------------------------

N = 200_000
_CHAIN = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(2500)} | {
    "d2500": {"type": "integer"}}

# (field, value): each refused before llguidance sees it, naming the field
TOO_LARGE = {
    "alternatives": ("grammar", "root ::= " + " | ".join(f'"a{i}"' for i in range(N))),
    "rules": ("grammar", "\n".join(f'r{i} ::= "a"' for i in range(N))
              + "\nroot ::= " + " | ".join(f"r{i}" for i in range(N))),
    "alternatives-small": ("grammar", "root ::= " + " | ".join(['"a"'] * 30_000)),
    "rules-small": ("grammar", "\n".join(f'r{i} ::= "a"' for i in range(10_000))
                    + "\nroot ::= " + " | ".join(f"r{i}" for i in range(10_000))),
    "literal": ("grammar", 'root ::= "' + "a" * 5_000_000 + '"'),
    "nesting": ("grammar", "root ::= " + "(" * 100_000 + '"a"' + ")" * 100_000),
    "lark": ("lark", "start: " + " | ".join(f'"a{i}"' for i in range(N))),
    "lark-small": ("lark", "start: " + " | ".join(['"a"'] * 30_000)),
    "lark-nesting": ("lark", "start: " + "[" * 100_000 + '"a"' + "]" * 100_000),
    "lark-json-refs": ("lark", "start: %json " + json.dumps({"$ref": "#/$defs/d0",
                                                             "$defs": _CHAIN})),
    "regex": ("regex", "|".join(f"w{i}" for i in range(N))),
    "regex-nesting": ("regex", "(" * 100_000 + "a" + ")" * 100_000),
    "enum": ("json_schema", {"enum": [f"v{i}" for i in range(N)]}),
    "enum-objects": ("json_schema", {"enum": [{"k": i} for i in range(15_000)]}),
    "const": ("json_schema", {"const": "a" * 5_000_000}),
}


@pytest.mark.parametrize("case", list(TOO_LARGE))
def test_a_grammar_too_large_is_refused_before_llguidance(case: str) -> None:
    field, value = TOO_LARGE[case]
    if case == "lark-json-refs":  # this one crashed the process: checked in a child
        code = ("import json, sys\nfrom gguflm.engine.grammar import lark_grammar\n"
                "from gguflm.engine.errors import ConstraintError\n"
                "try:\n    lark_grammar(sys.stdin.read())\n"
                "except ConstraintError as e:\n    print(e.param, e)\n")
        out = subprocess.run([sys.executable, "-c", code], input=value, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("lark "), out
        assert "$ref" in out.stdout
        return
    t0 = time.perf_counter()
    with pytest.raises(ConstraintError) as e:
        constraint_from_request(**{field: value})
    assert time.perf_counter() - t0 < 1
    assert e.value.param == field
    assert re.search(r"too large for the constraint engine|nests groups more than 100",
                     str(e.value))


def test_grammars_under_the_bounds_still_work(smollm2_path: Path) -> None:
    from gguflm.tokenizer import Tokenizer

    tok = Tokenizer.from_file(smollm2_path)
    words = "root ::= " + " | ".join(f'"w{i}"' for i in range(1999))  # llguidance's row: 2000
    grouped = "root ::= " + " | ".join(f"g{j}" for j in range(50)) + "\n" + "\n".join(
        f"g{j} ::= " + " | ".join(f'"w{j * 100 + i}"' for i in range(100)) for j in range(50))
    nested = "root ::= " + "(" * MAX_GRAMMAR_NESTING + '"a"' + ")" * MAX_GRAMMAR_NESTING
    for spec in ({"grammar": words}, {"grammar": grouped}, {"grammar": nested},
                 {"json_schema": {"enum": [f"v{i}" for i in range(10_000)]}},
                 {"regex": "|".join(f"w{i}" for i in range(10_000))}):
        Constraint(constraint_from_request(**spec, tokenizer=tok), tok)
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}} for i in range(300)]
    assert tool_call_grammar(validate_tools(tools), "required", "json") is not None


def test_too_many_tools_are_refused_by_size() -> None:
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}} for i in range(3000)]
    t0 = time.perf_counter()
    with pytest.raises(ConstraintError, match="too large for the constraint engine") as e:
        tool_call_grammar(validate_tools(tools), "required", "json")
    assert e.value.param == "tools" and time.perf_counter() - t0 < 1


def test_a_real_panic_is_never_shown(smollm2_path: Path, monkeypatch) -> None:
    """With the bounds lifted, a grammar that overflows llguidance's symbol table (a Rust
    panic with a backtrace) is refused in plain words."""
    from gguflm.tokenizer import Tokenizer

    tok = Tokenizer.from_file(smollm2_path)
    monkeypatch.setattr(grammar_module, "MAX_GRAMMAR_BYTES", 2**30)
    monkeypatch.setattr(grammar_module, "MAX_GRAMMAR_SYMBOLS", 2**30)
    g = lark_grammar("start: " + " ".join(['"a"?'] * 66_000))
    with pytest.raises(ConstraintError) as e:
        Constraint(g, tok)
    assert TOO_COMPLEX in str(e.value) and e.value.param == "lark", str(e.value)[:300]
    assert not any(mark in str(e.value) for mark in PANIC_MARKS)


class PanicException(BaseException):
    """Stands for pyo3's (a BaseException of that name)."""


class _PanickingMatcher:
    def __getattr__(self, name: str):  # noqa: ANN204 - any llguidance call panics
        def call(*args, **kwargs):  # noqa: ANN202
            raise PanicException("assertion failed: x\n<backtrace>\n  0: <unknown>")
        return call


def test_panics_while_generating_fail_the_sequence_in_plain_words(smollm2_path: Path) -> None:
    from gguflm.tokenizer import Tokenizer

    tok = Tokenizer.from_file(smollm2_path)
    c = Constraint(gbnf_grammar('root ::= "a"'), tok)
    c._matcher = _PanickingMatcher()
    import numpy as np

    for call in (c.fill_bitmask, lambda: c.accept(1), c.forced_tokens, lambda: c.rollback(1),
                 c.reset, c.is_done, c.is_accepting,
                 lambda: c.mask(np.zeros(tok.n_vocab, np.float32))):
        with pytest.raises(ConstraintFailure) as e:
            call()
        assert TOO_COMPLEX in str(e.value)
        assert not any(mark in str(e.value) for mark in PANIC_MARKS)
    with pytest.raises(ConstraintError, match=TOO_COMPLEX) as e:
        with llguidance_errors("grammar", "grammar"):
            raise PanicException("panic: assertion failed\n<backtrace>")
    assert e.value.param == "grammar"


def test_llguidance_messages_are_shortened() -> None:
    # within the bounds, nested deeper than llguidance's Lark parser takes: its message
    # quotes the whole line
    text = "start: " + "(" * 40 + '"a"' + ")" * 40 + ' "b"' * 5000
    with pytest.raises(ConstraintError, match="too deeply nested") as e:
        lark_grammar(text)
    assert len(str(e.value)) < 400 and e.value.param == "lark"


# --- the CLI and the server ------------------------------------------------------------------

def _write(tmp: Path, name: str, case: str) -> str:
    """TOO_LARGE[case]'s grammar or schema in a file."""
    value = TOO_LARGE[case][1]
    path = tmp / name
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return str(path)


def test_the_cli_refuses_a_grammar_too_large_at_once(smollm2_path: Path,
                                                     tmp_path: Path) -> None:
    model = str(smollm2_path)
    cases = {
        "alternatives": ["--grammar-file", _write(tmp_path, "a.gbnf", "alternatives")],
        "rules-small": ["--grammar-file", _write(tmp_path, "r.gbnf", "rules-small")],
        "nesting": ["--grammar-file", _write(tmp_path, "n.gbnf", "nesting")],
        "enum": ["-jf", _write(tmp_path, "e.json", "enum")],
        "regex": ["--regex", "(" * 50_000 + "a" + ")" * 50_000],  # argv: < 128 KiB
    }
    results = _drive([["run", model, "-p", "hi", "-n", "3", *extra]
                      for extra in cases.values()])
    for case, result in zip(cases, results):
        line = _one_error_line(result)
        assert re.search(r"too large for the constraint engine|nests groups more than", line), \
            (case, line)
        # refused while reading the options, before the model loads and the grammar
        # compiles (a generous bound: a loaded machine doubles it)
        assert result["seconds"] < 2, (case, result["seconds"])
    t0 = time.perf_counter()
    out = subprocess.run([*CLI, "run", model, "-p", "hi", "-n", "3", *cases["alternatives"]],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr[-500:]
    assert out.stderr.startswith(f"error: --grammar-file {cases['alternatives'][1]}: grammar "
                                 "is too large for the constraint engine: 2,235 KiB"), out.stderr
    assert time.perf_counter() - t0 < 5  # the whole process, start-up included


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = _start(smollm2_path, tmp_path_factory.mktemp("round3") / "log.txt")
    yield url
    assert proc.poll() is None, "the server died"
    _stop(proc)


def _refused_at_once(url: str, body: dict, param: str,
                     path: str = "/v1/completions") -> float:
    t0 = time.perf_counter()
    status, out = _post(url, path, json.dumps(body))
    seconds = time.perf_counter() - t0
    assert status == 400, (status, str(out)[:500])
    err = out["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert not any(mark in err["message"] for mark in PANIC_MARKS), err
    _health_fast(url)
    return seconds


SERVER_CASES = ["alternatives", "rules", "literal", "nesting", "alternatives-small", "lark",
                "lark-json-refs", "regex", "enum"]


@pytest.mark.parametrize("case", SERVER_CASES)
def test_the_server_refuses_a_grammar_too_large_at_once(server: str, case: str) -> None:
    field, value = TOO_LARGE[case]
    field = "grammar" if field == "lark" else field  # the server takes Lark text there
    seconds = _refused_at_once(server, {"prompt": "Say:", "max_tokens": 3, field: value}, field)
    assert seconds < 1, seconds


def test_the_server_refuses_too_large_schemas_and_tools(server: str) -> None:
    enum = TOO_LARGE["enum"][1]
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": enum}}
    assert _refused_at_once(server, {"prompt": "x", "max_tokens": 1, "response_format": rf},
                            "response_format.json_schema.schema") < 1
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}} for i in range(3000)]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tools": tools,
            "tool_choice": "required"}
    assert _refused_at_once(server, body, "tools", "/v1/chat/completions") < 1


def test_the_server_still_takes_a_grammar_under_the_bounds(server: str) -> None:
    words = "root ::= " + " | ".join(f'"w{i}"' for i in range(1999))
    status, out = _post(server, "/v1/completions", json.dumps(
        {"prompt": "Pick one:", "max_tokens": 4, "temperature": 0, "grammar": words}))
    assert status == 200, out
    assert re.fullmatch(r"w\d{0,4}", out["choices"][0]["text"]), out
