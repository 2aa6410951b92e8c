"""Chat templates: the real models' templates against Hugging Face's rendering, the HF
environment (globals, filters, whitespace control, sandbox), errors, and BOS handling.

The expected prompts are written out by hand from each template's text, which is what
``transformers``' ``apply_chat_template`` produces for it: SmolLM2 ships ChatML in the file;
the Gemma 3 file carries no template, so it gets the built-in copy of Gemma 3's own (system
text folded into the first user turn, assistant -> model, content trimmed, BOS written by
the template).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from gguflm import gguf
from gguflm.tokenizer import Tokenizer
from gguflm.tokenizer.chat import (
    BUILTIN_TEMPLATES,
    ChatTemplate,
    ChatTemplateError,
    encode_prompt,
    load_template_file,
)

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is the capital of France?"},
]

SMOLLM2_EXPECTED = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nHello!<|im_end|>\n"
    "<|im_start|>assistant\nHi! How can I help?<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)

GEMMA3_EXPECTED = (
    "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n"
    "<start_of_turn>model\nHi! How can I help?<end_of_turn>\n"
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
    "<start_of_turn>model\n"
)


def _load(path: Path) -> tuple[Tokenizer, ChatTemplate]:
    f = gguf.open(path)
    tok = Tokenizer.from_gguf(f)
    return tok, ChatTemplate.for_tokenizer(tok, f.metadata)


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> tuple[Tokenizer, ChatTemplate]:
    return _load(smollm2_path)


@pytest.fixture(scope="module")
def gemma3(gemma3_path: Path) -> tuple[Tokenizer, ChatTemplate]:
    return _load(gemma3_path)


# --- the real models' templates --------------------------------------------------------------

def test_smollm2_renders_like_hugging_face(smollm2: tuple[Tokenizer, ChatTemplate]) -> None:
    tok, tmpl = smollm2
    assert tmpl.name == "tokenizer.chat_template"  # the file's own template
    assert tmpl.render(CONVERSATION) == SMOLLM2_EXPECTED
    without = tmpl.render(CONVERSATION, add_generation_prompt=False)
    assert without == SMOLLM2_EXPECTED.removesuffix("<|im_start|>assistant\n")


def test_smollm2_adds_its_default_system_prompt(smollm2: tuple[Tokenizer, ChatTemplate]) -> None:
    _, tmpl = smollm2
    assert tmpl.render(CONVERSATION[1:2]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n")


def test_gemma3_renders_like_hugging_face(gemma3: tuple[Tokenizer, ChatTemplate]) -> None:
    tok, tmpl = gemma3
    assert tmpl.name == "built-in gemma"  # the file has no tokenizer.chat_template
    assert tmpl.bos_token == "<bos>"
    assert tmpl.render(CONVERSATION) == GEMMA3_EXPECTED
    # no system message: no prefix; content is trimmed by the template
    msgs = [{"role": "user", "content": "  Hello!\n"}]
    assert tmpl.render(msgs) == "<bos><start_of_turn>user\nHello!<end_of_turn>\n" \
                                "<start_of_turn>model\n"
    # content given as parts (OpenAI style): the template walks them
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello!"}]}]
    assert tmpl.render(parts) == tmpl.render(msgs)


def test_gemma3_role_alternation_raises(gemma3: tuple[Tokenizer, ChatTemplate]) -> None:
    _, tmpl = gemma3
    for bad in ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]):
        with pytest.raises(ChatTemplateError, match="roles must alternate") as info:
            tmpl.render(bad)
        assert info.value.raised


def test_gemma3_invalid_content_type_raises(gemma3: tuple[Tokenizer, ChatTemplate]) -> None:
    _, tmpl = gemma3
    with pytest.raises(ChatTemplateError, match="Invalid content type") as info:
        tmpl.render([{"role": "user", "content": None}])
    assert info.value.raised


def test_gemma3_prompt_has_one_bos(gemma3: tuple[Tokenizer, ChatTemplate]) -> None:
    tok, tmpl = gemma3
    assert tok.add_bos and tok.bos_id == 2
    ids = encode_prompt(tok, tmpl.render(CONVERSATION))
    assert ids[:2] == [tok.bos_id, tok.token_id("<start_of_turn>")]
    assert ids.count(tok.bos_id) == 1
    # plain tokenizing with add_special would have doubled it (llama.cpp's warning case)
    assert tok.encode(tmpl.render(CONVERSATION), parse_special=True)[:2] == [2, 2]
    # a template that writes no BOS still gets exactly one
    chatml = ChatTemplate(BUILTIN_TEMPLATES["chatml"], name="chatml")
    ids = encode_prompt(tok, chatml.render(CONVERSATION))
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1


def test_smollm2_prompt_tokens(smollm2: tuple[Tokenizer, ChatTemplate]) -> None:
    tok, tmpl = smollm2
    ids = encode_prompt(tok, tmpl.render(CONVERSATION))
    im_start, im_end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    assert not tok.add_bos and ids[0] == im_start  # no BOS for SmolLM2
    assert ids.count(im_start) == 5 and ids.count(im_end) == 4
    assert tok.decode(ids, special=True) == SMOLLM2_EXPECTED


# --- the Hugging Face environment ------------------------------------------------------------

def _render(source: str, **kwargs: object) -> str:
    return ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"}).render(
        [{"role": "user", "content": "hi"}], **kwargs)


def test_tojson_like_hugging_face() -> None:
    data = {"name": "café <b>&", "n": [1, 2]}
    assert _render("{{ x | tojson }}", x=data) == json.dumps(data, ensure_ascii=False)
    assert _render("{{ x | tojson(indent=2) }}", x=data) == json.dumps(
        data, ensure_ascii=False, indent=2)
    assert _render("{{ x | tojson(ensure_ascii=True) }}", x=data) == json.dumps(data)
    assert _render("{{ x | tojson(separators=[',', ':'], sort_keys=true) }}", x=data) == \
        json.dumps(data, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def test_trim_and_lstrip_blocks() -> None:
    source = ("{% for m in messages %}\n"
              "    {% if m.role == 'user' %}\n"
              "[{{ m.content }}]\n"
              "    {% endif %}\n"
              "{% endfor %}\n")
    assert _render(source) == "[hi]\n"


def test_globals_and_variables() -> None:
    assert _render("{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}") == "<s></s>True"
    assert _render("{{ add_generation_prompt }}", add_generation_prompt=False) == "False"
    year = datetime.datetime.now().strftime("%Y")
    assert _render("{{ strftime_now('%Y') }}") in (year, str(int(year) + 1))
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert _render("{% if tools %}{{ tools[0].function.name }}{% endif %}", tools=tools) == "f"
    assert _render("{% if tools is defined %}x{% endif %}") == ""  # not given: undefined
    assert _render("{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}"
                   "{% endfor %}") == "01"
    assert _render("{% generation %}{{ messages[0].content }}{% endgeneration %}") == "hi"
    assert _render("{{ missing }}") == ""  # HF's default: undefined renders as nothing


def test_raise_exception_message() -> None:
    with pytest.raises(ChatTemplateError, match="rejected the conversation: no way") as info:
        _render("{{ raise_exception('no way') }}")
    assert info.value.raised


def test_template_errors_are_one_clear_error() -> None:
    with pytest.raises(ChatTemplateError, match=r"does not parse: line 2"):
        ChatTemplate("ok\n{% if %}")
    with pytest.raises(ChatTemplateError, match="is empty"):
        ChatTemplate("  ")
    with pytest.raises(ChatTemplateError, match="failed: UndefinedError") as info:
        _render("{{ missing.attr }}")
    assert not info.value.raised
    with pytest.raises(ChatTemplateError, match="failed: TypeError"):
        _render("{{ 'a' + 1 }}")


def test_sandbox_blocks_mutation_and_internals() -> None:
    with pytest.raises(ChatTemplateError, match="SecurityError"):
        _render("{{ messages.append(1) }}")
    with pytest.raises(ChatTemplateError, match="SecurityError|UndefinedError"):
        _render("{{ ''.__class__.__mro__[1].__subclasses__() }}")


def test_messages_are_checked() -> None:
    tmpl = ChatTemplate(BUILTIN_TEMPLATES["chatml"])
    for bad in ([], "hi", [{"content": "x"}], [{"role": 1, "content": "x"}],
                [{"role": "user", "content": 5}], ["user: hi"]):
        with pytest.raises(ChatTemplateError):
            tmpl.render(bad)  # type: ignore[arg-type]


# --- template files ----------------------------------------------------------------------------

def test_template_file_override(tmp_path: Path, smollm2_path: Path) -> None:
    f = gguf.open(smollm2_path)
    tok = Tokenizer.from_gguf(f)
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    tmpl = ChatTemplate.for_tokenizer(tok, f.metadata, override=jinja)
    assert tmpl.render(CONVERSATION[:2]) == "system: You are a helpful assistant.\nuser: Hello!\n"
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    assert load_template_file(config) == "D"
    config.write_text(json.dumps({"chat_template": "{{ bos_token }}"}))
    assert ChatTemplate.for_tokenizer(tok, f.metadata, override=config).render(
        CONVERSATION) == "<|im_start|>"  # SmolLM2's BOS text
    with pytest.raises(ChatTemplateError, match="cannot read"):
        load_template_file(tmp_path / "absent.jinja")
    config.write_text("{}")
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        load_template_file(config)


def test_llama_cpp_template_idioms_render_as_llama_cpp_renders_them() -> None:
    """Three idioms of llama.cpp's real templates (functionary, firefunction, the
    DeepSeek-R1 tool template) that jinja alone renders differently or refuses: ``safe``
    joined to ``tojson`` text (jinja's Markup would HTML-escape the JSON), an undefined
    variable added to text (the text), and ``tojson`` of a ``map`` (a generator)."""
    from gguflm.tokenizer.chat import ChatTemplate

    source = ('{{ "<x>"|safe + {"a": "b"}|tojson }}|{{ functions + "tail" }}|'
              '{{ tools | map(attribute="name") | tojson }}')
    out = ChatTemplate(source).render(
        [{"role": "user", "content": "hi"}], add_generation_prompt=False,
        tools=[{"name": "f"}, {"name": "g"}])
    assert out == '<x>{"a": "b"}|tail|["f", "g"]'
