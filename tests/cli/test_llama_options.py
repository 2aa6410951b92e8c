"""llama.cpp's command lines parse as llama.cpp parses them: every option of the tools each
gguflm command stands in for is accepted (working, or noted as ignored with its reason),
single-dash long options are exact (no prefix matching, no ``-cVALUE``), and
docs/llama-cpp-flags.md is the table the parsers give. Parsing only: no model is run."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gguflm.cli import build_parser, main
from gguflm.cli.common import normalize_argv
from gguflm.cli.llama_options import TOOLS_OF, Ignored, flag_table, notes, rows_for

DOCS = Path(__file__).resolve().parents[2] / "docs" / "llama-cpp-flags.md"
# what the required positionals of each command need, so that an option alone parses
BASE = {"quantize": ["in.gguf", "Q8_0"], "perplexity": ["-f", "x.txt"], "tokenize": ["m.gguf"]}
SAMPLES = {"--override-kv": "general.name=str:x", "-fa": "on", "--flash-attn": "off"}


_PARSER = build_parser()


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return _PARSER.parse_args(["run"]).subparsers


def _parse(*argv: str) -> argparse.Namespace:
    args, extra = _PARSER.parse_known_args(normalize_argv(list(argv)))
    assert not extra, extra
    return args


def _value(action: argparse.Action, flag: str) -> list[str]:
    if flag in SAMPLES:
        return [SAMPLES[flag]]
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(iter(action.choices)))]
    return ["1"] * (action.nargs if isinstance(action.nargs, int) else 1)


def test_every_llama_cpp_option_is_accepted(parsers: dict) -> None:
    for command in TOOLS_OF:
        p = parsers[command]
        for flags, nargs, _reason in rows_for(command):
            for flag in flags.split():
                action = p._option_string_actions.get(flag)
                assert action is not None, (command, flag)
                if flag in ("-h", "--help", "--usage", "--version"):
                    continue
                if isinstance(action, Ignored):
                    assert action.nargs == nargs, (command, flag)
                if isinstance(action, Ignored) and action.reason.startswith("refused:"):
                    continue  # a usage error (test_options_that_choose_the_model_...)
                args = _parse(command, *BASE.get(command, []), flag, *_value(action, flag))
                if isinstance(action, Ignored):
                    assert [reason for _, reason in args.ignored_options] == [action.reason]


def test_the_issues_command_lines_parse_as_llama_cpps() -> None:
    a = _parse("run", "-m", "m.gguf", "-no-cnv", "-p", "hi", "-ctk", "f16", "-ctv", "f16",
               "-c", "0", "-b", "512", "-ub", "256", "--keep", "10", "--log-disable",
               "--jinja", "--no-warmup", "--samplers", "top_k;temperature", "--mirostat", "2",
               "--mirostat-lr", "0.2", "--mirostat-ent", "4")
    assert a.conversation is False and a.cache_type_k == a.cache_type_v == "f16"
    assert (a.ctx_size, a.batch_size, a.ubatch_size, a.keep) == (0, 512, 256, 10)
    assert a.log_disable and a.jinja and not a.warmup and not a.ignored_options
    assert a.sampling_samplers == "top_k;temperature" and a.sampling_mirostat == 2
    assert (a.sampling_mirostat_eta, a.sampling_mirostat_tau) == (0.2, 4.0)
    a = _parse("run", "-sys", "be brief", "-st", "-p", "hi", "-sp", "--temperature", "0.5",
               "-co", "--typical", "0.9", "-n", "-1")
    assert (a.system, a.single_turn, a.special, a.sampling_temperature) == \
        ("be brief", True, True, 0.5)
    assert (a.color, a.sampling_typical_p, a.n_predict) == ("on", 0.9, -1)
    a = _parse("run", "-sysf", "s.txt", "-p", "x", "--color", "auto", "--predict", "5")
    assert (a.system_file, a.color, a.n_predict) == ("s.txt", "auto", 5)
    a = _parse("serve", "-m", "m.gguf", "-c", "2048", "-np", "2", "--temp", "0.3", "-a", "x",
               "--no-ui", "--cors-origins", "*", "--metrics", "-ngl", "99", "--jinja")
    assert (a.ctx_size, a.parallel, a.sampling_temperature, a.alias, a.webui) == \
        (2048, 2, 0.3, "x", False)
    assert a.cors == ["*"] and [o for o, _ in a.ignored_options] == ["--metrics", "-ngl 99"]
    a = _parse("tokenize", "-m", "m.gguf", "-p", "Hello", "--ids", "--show-count")
    assert (a.prompt, a.ids, a.show_count) == ("Hello", True, True)
    a = _parse("quantize", "-m", "in.gguf", "out.gguf", "Q4_K_M", "4", "--imatrix", "x.dat")
    assert a.words == ["out.gguf", "Q4_K_M", "4"] and a.input_flag == "in.gguf"


def test_llama_benchs_lists_and_switch_words() -> None:
    a = _parse("bench", "-m", "m.gguf", "-n", "0", "-n", "16", "-p", "64,128", "-t", "1,2,4",
               "-b", "128,256", "-fa", "1", "-o", "json", "-ngl", "10,20")
    assert (a.n_gen, a.n_prompt, a.threads, a.batch_size, a.output) == \
        ([0, 16], [64, 128], [1, 2, 4], [128, 256], "json")
    assert _parse("bench", "-m", "m.gguf").n_prompt == [128]  # the default, once
    assert _parse("run", "-p", "x", "-co", "1").color == "on"
    assert [o for o, _ in _parse("run", "-p", "x", "-fa", "true").ignored_options] == \
        ["-fa true"]


@pytest.mark.parametrize("argv", [
    ["run", "-ctkx", "f16"], ["run", "-nocnv"], ["run", "--temperat", "1"],
    ["run", "-c5"], ["run", "-sy", "x"], ["serve", "--por", "8"],
])
def test_no_prefix_matching(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([*argv, "-p", "hi"] if argv[0] == "run" else argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"unrecognized arguments: {argv[1]}" in err
    assert "invalid int value" not in err and "expected an integer" not in err


def test_long_options_with_underscores_as_llama_cpp_reads_them() -> None:
    known = frozenset(f for sub in _PARSER.get_default("subparsers").values()
                      for f in sub._option_string_actions)
    argv = normalize_argv(["run", "--repeat_penalty", "1.1", "--ctx_size", "64", "--n_predict",
                           "3", "-p", "snake_case", "--no_such_thing"], known)
    assert argv[-3:] == ["-p", "snake_case", "--no_such_thing"]  # only known options change
    a, extra = _PARSER.parse_known_args(argv)
    assert (a.sampling_repeat_penalty, a.ctx_size, a.n_predict) == (1.1, 64, 3)
    assert a.prompt == "snake_case" and extra == ["--no_such_thing"]


def test_ignored_options_get_one_note_per_reason() -> None:
    a = _parse("run", "-p", "x", "-ngl", "99", "-fa", "--numa", "distribute", "-mg", "0",
               "--lora", "a.gguf")
    lines = notes(a.ignored_options)
    assert lines == [
        "note: -ngl 99, -fa on, -mg 0: ignored: gguflm runs on the CPU",
        "note: --numa distribute: ignored: gguflm does not place memory by NUMA node",
        "note: --lora a.gguf: ignored: gguflm loads no LoRA adapters or control vectors"]
    # -fa before MODEL does not swallow it
    assert _parse("run", "-fa", "m.gguf", "-p", "x").model == "m.gguf"


def test_the_docs_page_is_the_parsers_table(parsers: dict) -> None:
    table = flag_table(parsers)
    assert "**missing**" not in table
    assert DOCS.read_text(encoding="utf-8") == table, \
        "docs/llama-cpp-flags.md is stale: python -m gguflm.cli.llama_options > " \
        "docs/llama-cpp-flags.md"
    for command in TOOLS_OF:
        assert f"## gguflm {command} " in table
    # what the issue asked to work is documented as working in run
    run = table.split("## gguflm run ")[1].split("## gguflm chat")[0]
    for flag in ("-c --ctx-size", "-b --batch-size", "-ub --ubatch-size", "--keep",
                 "-sys --system-prompt", "-st --single-turn", "-no-cnv --no-conversation",
                 "--samplers", "--mirostat", "--mirostat-lr", "--mirostat-ent",
                 "-ctk --cache-type-k", "-ctv --cache-type-v", "--jinja", "--no-warmup",
                 "--log-disable"):
        row = next(line for line in run.splitlines() if line.startswith(f"| `{flag}` |"))
        assert "| works: " in row, row


@pytest.mark.parametrize("argv", [
    ["serve", "-mu", "https://example.com/m.gguf"],
    ["run", "--docker-repo", "ai/smollm2", "-p", "hi"],
])
def test_options_that_choose_the_model_elsewhere_are_refused(argv, capsys) -> None:
    """Ignoring a model URL would run another model than the one asked for: it is a usage
    error naming the option, before anything is loaded (-hf works: test_hf_download.py)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "refused" in err and "Hugging Face" in err and argv[1] in err
