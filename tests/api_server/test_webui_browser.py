"""The chat page in headless Chromium (Debian's ``chromium`` + ``chromedriver``, driven by
Selenium) against ``gguflm serve`` on loopback with the smollm2 model: streaming, stop,
regenerate, settings and system prompt (checked against the official client's answer to
the same request), conversations across reloads, busy and dead servers, the API key, phone
width and keyboard, and hostile model output shown as text.

Skips, saying why, where Chromium or Selenium is missing; with GGUFLM_REQUIRE_BROWSER=1
(set by .ci/run, which installs Chromium) it fails instead.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import DESKTOP, PHONE, Server, find_chromium, set_viewport, start_browser

KEY = "browser-test-key"
N_CTX = 2048
LONG_PROMPT = "Write a very long story about a dragon who learns to bake bread."
STATS = re.compile(r"^prompt (\d+) tokens(?: \(\d+ cached\))? · (~?)(\d+) tokens"
                   r"(?: · ([\d.]+) tokens/s)? · finish: (\w+)$")

# Rendered from storage and from a live reply; none of it may run or become markup.
HOSTILE = [
    "<script>window.__xss = 'script'</script>",
    "<img src=x onerror=\"window.__xss = 'img'\">",
    "[click me](javascript:window.__xss='link')",
    "[upper](JAVASCRIPT:window.__xss='upper') [spaced]( javascript:window.__xss='sp')",
    "[data](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==) [vb](vbscript:x)",
    "<svg onload=\"window.__xss='svg'\"></svg> <iframe src=\"javascript:1\"></iframe>",
    "<a href=\"javascript:window.__xss='a'\">a</a> <style>body{display:none}</style>",
    "**<img src=x onerror=\"window.__xss='bold'\">** and *<b onmouseover=x>em</b>*",
    "| a | b |\n|---|---|\n| <img src=x onerror=\"window.__xss='td'\"> | "
    "[x](javascript:window.__xss='cell') |",
    "- <script>window.__xss='li'</script>\n- [y](javascript:window.__xss='li2')",
    "```html\n<script>window.__xss='code'</script>\n```",
    "`<img src=x onerror=\"window.__xss='span'\">`",
    "https://example.com/\"onmouseover=\"window.__xss='auto'",
]
ALLOWED_TAGS = {"DIV", "SPAN", "P", "PRE", "CODE", "STRONG", "EM", "DEL", "A", "UL", "OL", "LI",
                "TABLE", "THEAD", "TBODY", "TR", "TH", "TD", "BLOCKQUOTE", "HR", "BUTTON",
                "H1", "H2", "H3", "H4", "H5", "H6", "ARTICLE"}

# What is in the document under `root`: tags, attribute names, link targets, text, and
# whether anything hostile ran (window.__xss), after giving an image time to fail to load.
INSPECT = """
const [selector, done] = [arguments[0], arguments[arguments.length - 1]];
setTimeout(() => {
  const root = document.querySelector(selector);
  const all = [...root.querySelectorAll('*')];
  done({xss: window.__xss === undefined ? null : String(window.__xss),
        tags: [...new Set(all.map((e) => e.tagName))],
        attrs: [...new Set(all.flatMap((e) => [...e.attributes].map((a) => a.name)))],
        hrefs: [...root.querySelectorAll('a')].map((a) => a.getAttribute('href')),
        text: root.textContent});
}, 300);
"""

LAST_REPLY = """
const all = document.querySelectorAll('#messages .msg.assistant');
const m = all[all.length - 1];
if (!m) return null;
const part = (s) => { const e = m.querySelector(s); return e && !e.hidden ? e.textContent : null; };
return {text: part('.content'), stats: part('.stats'), error: part('.error'),
        busy: !document.getElementById('stop').hidden,
        again: part('.regenerate')};
"""

# Keeps the body of each chat request the page makes.
RECORD_FETCH = """
const original = window.fetch;
window.__requests = [];
window.fetch = (url, options) => {
  if (String(url).endsWith('/chat/completions')) window.__requests.push(options.body);
  return original(url, options);
};
"""

STORED = """
const convs = JSON.parse(localStorage.getItem('gguflm.conversations') || '[]');
return {convs, current: JSON.parse(localStorage.getItem('gguflm.current') || 'null')};
"""


# --- fixtures and helpers ------------------------------------------------------------------

@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    found = find_chromium()
    if isinstance(found, str):
        if os.environ.get("GGUFLM_REQUIRE_BROWSER"):
            pytest.fail(f"GGUFLM_REQUIRE_BROWSER is set but {found}")
        pytest.skip(found)
    driver = start_browser(*found)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(chrome: Any, smollm2_path: Path) -> Iterator[Server]:
    """One request at a time (so a second is 'busy'), behind an API key."""
    s = Server(smollm2_path, "--api-key", KEY, "--max-queue", "1", n_ctx=N_CTX)
    yield s
    s.stop()


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def fresh_page(chrome: Any, server: Server, settings: dict[str, str] | None = None,
               key: str | None = KEY, conversations: list | None = None,
               wait: bool = True) -> None:
    """The page on empty storage, except for what is given (as a person would have it
    after typing it in: the same localStorage entries); then waits for the model's name."""
    chrome.get(server.page_url)
    chrome.execute_script("""
        localStorage.clear();
        const [key, settings, convs] = arguments;
        if (key) localStorage.setItem('gguflm.apiKey', JSON.stringify(key));
        if (settings) localStorage.setItem('gguflm.settings', JSON.stringify(settings));
        if (convs) localStorage.setItem('gguflm.conversations', JSON.stringify(convs));
    """, key, settings, conversations)
    chrome.get(server.page_url)
    if wait:
        wait_model(chrome, server)


def wait_model(chrome: Any, server: Server) -> None:
    wait_for("the model's name", lambda: model_name(chrome) == server.model_id, 30)


def model_name(chrome: Any) -> str:
    return chrome.execute_script("return document.getElementById('model-name').textContent")


def by_id(chrome: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return chrome.find_element(By.ID, element_id)


def type_into(chrome: Any, element_id: str, text: str) -> None:
    """Replace a field's text by typing, as a person would (input events fire)."""
    from selenium.webdriver.common.keys import Keys

    field = by_id(chrome, element_id)
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE)
    field.send_keys(text)


def set_setting(chrome: Any, name: str, value: str) -> None:
    if not by_id(chrome, "settings").is_displayed():
        by_id(chrome, "toggle-settings").click()
    type_into(chrome, name, value)


def send(chrome: Any, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    box = by_id(chrome, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def last_reply(chrome: Any) -> dict | None:
    return chrome.execute_script(LAST_REPLY)


def wait_reply(chrome: Any, timeout: float = 120) -> dict:
    """The last reply once it has ended (stats or an error shown, Stop gone)."""
    def ended() -> dict | None:
        r = last_reply(chrome)
        return r if r and not r["busy"] and (r["stats"] or r["error"]) else None
    return wait_for("the reply to end", ended, timeout)


def stored_reply(chrome: Any) -> dict:
    s = chrome.execute_script(STORED)
    conv = next(c for c in s["convs"] if c["id"] == s["current"])
    return conv["messages"][-1]


def client_reply(server: Server, **body: Any) -> str:
    """What the server answers the official client for the same request."""
    openai = pytest.importorskip("openai", reason="the openai client is a test dependency")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0,
                           timeout=300)
    return client.chat.completions.create(model="smollm2-135m", **body) \
        .choices[0].message.content


# --- the tests -----------------------------------------------------------------------------

def test_api_key_is_asked_for_then_used(chrome: Any, server: Server) -> None:
    fresh_page(chrome, server, key=None, wait=False)
    dialog_open = "return document.getElementById('key-dialog').open"
    wait_for("the key dialog", lambda: chrome.execute_script(dialog_open), 30)
    assert model_name(chrome) == "API key needed"
    by_id(chrome, "key-input").send_keys("wrong-key\n")
    wait_for("the key to be refused", lambda: chrome.execute_script(dialog_open) and "refused"
             in by_id(chrome, "key-message").text, 30)
    by_id(chrome, "key-input").send_keys(KEY + "\n")
    wait_model(chrome, server)
    assert by_id(chrome, "model-ctx").text == f"context {N_CTX} tokens"
    assert not chrome.execute_script(dialog_open)
    send(chrome, "Hi!")
    reply = wait_reply(chrome)
    assert reply["error"] is None and reply["text"]


def test_reply_streams_in_parts_with_its_figures(chrome: Any, server: Server) -> None:
    fresh_page(chrome, server, {"max_tokens": "120"})
    send(chrome, "Tell me a story about a cat who sails around the world.")
    sizes = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        r = last_reply(chrome)
        if r and not r["busy"] and r["stats"]:
            break
        if r and r["busy"]:
            sizes.append(len(r["text"]))
        time.sleep(0.02)
    final = wait_reply(chrome)
    growing = sorted({s for s in sizes if 0 < s < len(final["text"])})
    assert len(growing) >= 3, f"the reply did not appear in parts: sizes seen {sizes}"

    m = STATS.match(final["stats"])
    assert m, final["stats"]
    prompt, approx, completion, per_second, finish = m.groups()
    stored = stored_reply(chrome)
    assert approx == "" and int(prompt) > 10 and per_second and float(per_second) > 0
    assert finish in ("stop", "length") and 1 < int(completion) <= 120
    assert (finish == "length") == (int(completion) == 120)
    assert stored["stats"]["completion"] == int(completion) and stored["content"]


def test_stop_keeps_the_partial_reply(chrome: Any, server: Server) -> None:
    fresh_page(chrome, server, {"max_tokens": "1500", "temperature": "0"})
    send(chrome, LONG_PROMPT)
    wait_for("some text", lambda: len((last_reply(chrome) or {}).get("text") or "") > 40)
    by_id(chrome, "stop").click()
    reply = wait_reply(chrome, 10)
    assert reply["stats"].endswith("finish: stopped") and reply["error"] is None
    time.sleep(1.0)
    assert last_reply(chrome)["text"] == reply["text"], "the reply went on after Stop"
    stored = stored_reply(chrome)
    assert 40 < len(stored["content"]) and stored["stats"]["finish"] == "stopped"
    # the server dropped the generation: it takes one request at a time, and answers again
    # long before the 1500 tokens would have been done
    assert reply["again"] == "Regenerate"
    t0 = time.monotonic()
    status = 503
    while status == 503 and time.monotonic() - t0 < 10:
        status = post_chat(server, max_tokens=1)[0]
        time.sleep(0.2)
    assert status == 200, "the server was still busy with the stopped reply"


def test_conversations_survive_a_reload_and_switch(chrome: Any, server: Server) -> None:
    fresh_page(chrome, server, {"max_tokens": "12"})
    send(chrome, "Hello there, this is the first chat")
    first = wait_reply(chrome)
    by_id(chrome, "new-chat").click()
    assert chrome.execute_script("return document.querySelectorAll('.msg').length") == 0
    send(chrome, "Second chat: what is two plus two?")
    second = wait_reply(chrome)
    assert not first["error"] and not second["error"]

    chrome.refresh()
    wait_model(chrome, server)
    shown = "return [...document.querySelectorAll('.msg')].map((m) => m.textContent)"
    titles = "return [...document.querySelectorAll('#conversations .open')].map(b => b.title)"
    assert chrome.execute_script(titles) == ["Second chat: what is two plus two?",
                                             "Hello there, this is the first chat"]
    assert chrome.execute_script(shown)[0].endswith("Second chat: what is two plus two?")
    assert last_reply(chrome)["stats"] == second["stats"]

    items = chrome.execute_script("return document.querySelectorAll('#conversations .open')")
    items[1].click()
    wait_for("the first chat", lambda: "first chat" in chrome.execute_script(shown)[0], 10)
    assert last_reply(chrome)["text"] == first["text"]
    assert last_reply(chrome)["stats"] == first["stats"]
    chrome.execute_script("return document.querySelectorAll('#conversations .open')")[0].click()
    wait_for("the second chat", lambda: "Second" in chrome.execute_script(shown)[0], 10)
    assert last_reply(chrome)["text"] == second["text"]


def test_settings_and_system_prompt_reach_the_server(chrome: Any, server: Server) -> None:
    """The page sends what its settings say, and its reply is the one the official client
    gets for that request: greedy with temperature 0, then sampled with temperature, top-p
    and seed (Regenerate)."""
    fresh_page(chrome, server)
    system = "You are a pirate. Answer every question like a pirate would."
    by_id(chrome, "system").click()
    type_into(chrome, "system-prompt", system)
    set_setting(chrome, "temperature", "0")
    set_setting(chrome, "max_tokens", "20")
    chrome.refresh()  # settings and the system prompt are kept
    wait_model(chrome, server)
    assert by_id(chrome, "temperature").get_attribute("value") == "0"
    assert by_id(chrome, "system-prompt").get_attribute("value") == system
    chrome.execute_script(RECORD_FETCH)

    question = "Who are you and where do you live?"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    greedy = {"temperature": 0, "top_p": 0.95, "max_tokens": 20}
    page_reply = compare_reply(chrome, server, lambda: send(chrome, question), messages, greedy)

    set_setting(chrome, "temperature", "1.3")
    set_setting(chrome, "top_p", "0.9")
    set_setting(chrome, "seed", "1234")
    sampled = {"temperature": 1.3, "top_p": 0.9, "seed": 1234, "max_tokens": 20}
    regenerate = "document.querySelector('.regenerate').click()"
    assert compare_reply(chrome, server, lambda: chrome.execute_script(regenerate), messages,
                         sampled) != page_reply  # so the settings made a difference


def compare_reply(chrome: Any, server: Server, start: Callable[[], None], messages: list,
                  settings: dict[str, Any]) -> str:
    """Start a reply in the page and check the request it sent and the text it got."""
    # The server reuses the longest prompt prefix in its KV cache, and greedy text can
    # depend on where that prefix ends (float rounding differs between a prompt evaluated
    # in one batch or in two): give both requests the same cache state first.
    prime = {"messages": [{"role": "user", "content": "Prime."}], "max_tokens": 1}
    assert post_chat(server, **prime)[0] == 200
    start()
    assert not wait_reply(chrome)["error"]
    sent = json.loads(chrome.execute_script("return window.__requests.pop()"))
    assert sent == {"messages": messages, "stream": True, "model": server.model_id,
                    "stream_options": {"include_usage": True}} | settings
    assert post_chat(server, **prime)[0] == 200
    text = stored_reply(chrome)["content"]
    assert text == client_reply(server, messages=messages, **settings)
    return text


def test_busy_server_is_said_plainly(chrome: Any, server: Server) -> None:
    fresh_page(chrome, server, {"max_tokens": "8"})
    held = open_stream(server, max_tokens=400)  # the server's one place, taken
    try:
        send(chrome, "Are you free?")
        reply = wait_reply(chrome, 30)
    finally:
        held.close()
    assert (reply["error"] or "").startswith("The server is busy") and reply["text"] == "", reply
    assert reply["again"] == "Retry"


def test_server_going_away_mid_reply(chrome: Any, smollm2_path: Path) -> None:
    own = Server(smollm2_path, n_ctx=N_CTX)
    try:
        fresh_page(chrome, own, {"max_tokens": "1500"}, key=None)
        send(chrome, LONG_PROMPT)
        wait_for("some text", lambda: len((last_reply(chrome) or {}).get("text") or "") > 40)
        own.kill()
        reply = wait_reply(chrome, 30)
        assert reply["error"].startswith("The connection to the server was lost")
        assert len(reply["text"]) > 40  # the part received stays
        assert stored_reply(chrome)["content"] and stored_reply(chrome)["error"]
        wait_for("the status line", lambda: by_id(chrome, "status-text").text ==
                 "server unreachable", 15)
        send(chrome, "Are you still there?")
        assert wait_reply(chrome, 30)["error"].startswith("Cannot reach the server")
    finally:
        own.stop()


def test_markdown_renderer_keeps_hostile_text_as_text(chrome: Any, server: Server) -> None:
    fresh_page(chrome, server)
    chrome.execute_script("""
        const box = document.createElement('div');
        box.id = 'render-test';
        document.body.append(box);
        for (const text of arguments[0]) box.append(window.gguflm.renderMarkdown(text));
    """, HOSTILE)
    seen = chrome.execute_async_script(INSPECT, "#render-test")
    assert seen["xss"] is None
    assert set(seen["tags"]) <= ALLOWED_TAGS, seen["tags"]
    assert set(seen["attrs"]) <= {"href", "target", "rel", "class", "type", "id"}, seen["attrs"]
    assert seen["hrefs"] == ["https://example.com/"]  # the URL ends at the quote
    for literal in ("<script>window.__xss = 'script'</script>", "onerror=", "javascript:",
                    "<svg onload=", "<iframe", "<style>", "data:text/html", "vbscript:"):
        assert literal in seen["text"], literal

    # and it does render Markdown
    sample = ("# Title\n\nSome **bold**, *em* and `code` in snake_case_name.\n\n"
              "- one\n- two\n  1. nested\n\n```py\nprint(1 < 2)\n```\n\n> quoted\n\n"
              "[a link](https://example.com/x)")
    tree = chrome.execute_script("""
        const box = document.createElement('div');
        box.append(window.gguflm.renderMarkdown(arguments[0]));
        const q = (s) => [...box.querySelectorAll(s)].map((e) => e.textContent);
        return {h1: q('h1'), strong: q('strong'), em: q('em'), code: q('p code'),
                li: q('ul > li'), nested: q('ul ol > li'), pre: q('pre code'),
                quote: q('blockquote'), a: [...box.querySelectorAll('a')].map((a) => a.href)};
    """, sample)
    assert tree == {"h1": ["Title"], "strong": ["bold"], "em": ["em"], "code": ["code"],
                    "li": ["one", "twonested"], "nested": ["nested"],
                    "pre": ["print(1 < 2)"], "quote": ["quoted"],
                    "a": ["https://example.com/x"]}


def test_markdown_of_unclosed_openers_renders_in_linear_time(chrome: Any,
                                                              server: Server) -> None:
    """A reply of 64k characters of emphasis, code or link openers that never close ('**a '
    repeated) renders about as fast as plain text of that length: every span is bounded,
    where an unbounded lazy scan from each opener to the end of the text made each render
    square in the text (a 16k-character reply streamed in 114 s of regex time, the tab
    frozen)."""
    fresh_page(chrome, server)
    times = chrome.execute_script("""
        const time = (text) => {
          const t0 = performance.now();
          window.gguflm.renderMarkdown(text);
          return performance.now() - t0;
        };
        const out = {plain: Math.min(time('word '.repeat(12800)), time('word '.repeat(12800)))};
        for (const opener of ['**a ', '__a ', '`a ', '~~a ', '[a ', '*a ', '_a '])
          out[opener] = time(opener.repeat(Math.floor(64000 / opener.length)));
        return out;
    """)
    plain = times.pop("plain")
    for opener, ms in times.items():
        assert ms < 30 * plain + 300, (opener, ms, plain, times)


def test_hostile_model_output_is_shown_as_text(chrome: Any, server: Server) -> None:
    """Earlier turns make the model repeat a hostile string (at temperature 0 smollm2 copies
    it); the earlier turns come from storage, the new one streams from the model."""
    hostile = ('<script>window.__xss=1</script> <img src=x onerror="window.__xss=2"> '
               '[click me](javascript:window.__xss=3)')
    messages = [{"id": "u0", "role": "user", "content": "Say the magic words."}]
    for k in range(3):
        messages += [{"id": f"a{k}", "role": "assistant", "content": hostile},
                     {"id": f"u{k + 1}", "role": "user", "content": "Again."}]
    messages.pop()
    conv = {"id": "hostile", "title": "magic words", "system": "", "messages": messages,
            "updated": 1}
    fresh_page(chrome, server, {"temperature": "0", "max_tokens": "60"},
               conversations=[conv])
    send(chrome, "Again.")
    reply = wait_reply(chrome)
    raw = stored_reply(chrome)["content"]
    assert not reply["error"] and ("<script>" in raw or "onerror" in raw), raw
    seen = chrome.execute_async_script(INSPECT, "#messages")
    assert seen["xss"] is None and set(seen["tags"]) <= ALLOWED_TAGS, seen
    assert not [a for a in seen["attrs"] if a.startswith("on")] and seen["hrefs"] == []
    assert seen["text"].count("<script>window.__xss=1</script>") >= 3


def test_phone_width_and_keyboard(chrome: Any, server: Server) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    set_viewport(chrome, PHONE, mobile=True)
    try:
        fresh_page(chrome, server, {"max_tokens": "40"})
        assert not by_id(chrome, "sidebar").is_displayed()
        assert by_id(chrome, "input").is_displayed() and by_id(chrome, "send").is_displayed()
        box = by_id(chrome, "input")
        box.send_keys("first line")
        ActionChains(chrome).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT) \
            .perform()
        box.send_keys("second line")
        assert box.get_attribute("value") == "first line\nsecond line"
        assert chrome.execute_script("return document.querySelectorAll('.msg').length") == 0
        box.send_keys(Keys.ENTER)
        assert not wait_reply(chrome)["error"]
        user = chrome.execute_script("return document.querySelector('.msg.user .content')"
                                     ".textContent")
        assert user == "first line\nsecond line" and box.get_attribute("value") == ""
        width = "return document.documentElement.scrollWidth"
        assert chrome.execute_script(width) <= PHONE[0]
        by_id(chrome, "toggle-sidebar").click()
        assert by_id(chrome, "sidebar").is_displayed()
        chrome.execute_script("document.querySelector('#conversations .open').click()")
        assert not by_id(chrome, "sidebar").is_displayed()
    finally:
        set_viewport(chrome, DESKTOP)


# --- raw HTTP, for the server's side of things ---------------------------------------------

def post_chat(server: Server, **extra: Any) -> tuple[int, bytes]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0} | extra
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def open_stream(server: Server, **extra: Any) -> http.client.HTTPResponse:
    """A streaming request, read up to its first piece and held open (the response owns the
    socket: the server ends the generation once it is closed)."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = {"messages": [{"role": "user", "content": LONG_PROMPT}], "stream": True} | extra
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data: ")
    return resp


REASONING = """
const all = document.querySelectorAll('#messages .msg.assistant');
const m = all[all.length - 1];
const fold = m && m.querySelector('details.reasoning');
return fold && {open: fold.open, hidden: fold.hidden, above: Boolean(
  fold.compareDocumentPosition(m.querySelector('.content')) & Node.DOCUMENT_POSITION_FOLLOWING),
  text: fold.querySelector('.reasoning-text').textContent,
  content: m.querySelector('.content').textContent};
"""


def test_reasoning_is_folded_above_the_answer(chrome: Any, qwen35_path: Path) -> None:
    """A reasoning model (the tiny Qwen3.5 with QwQ's template, which opens <think>, and a
    3-token budget that closes it): the thinking is in a closed fold above the answer, and
    neither holds the other's text or the tags."""
    template = Path(__file__).resolve().parents[3] / "shared" / "reference" / "chat" / \
        "Qwen-QwQ-32B.jinja"
    if not template.is_file():
        pytest.skip(f"{template} not found")
    own = Server(qwen35_path, "--chat-template-file", str(template), "--reasoning-budget",
                 "3", "-t", "1", n_ctx=N_CTX)
    try:
        fresh_page(chrome, own, {"max_tokens": "24", "temperature": "0"}, key=None)
        send(chrome, "Why is the sky blue?")
        wait_reply(chrome)
        fold = chrome.execute_script(REASONING)
        assert fold and not fold["hidden"] and not fold["open"] and fold["above"], fold
        assert fold["text"].strip() and "<think>" not in fold["text"]
        assert "</think>" not in fold["content"] and fold["text"] not in fold["content"]
        stored = stored_reply(chrome)
        assert stored["reasoning"] == fold["text"]
    finally:
        own.stop()
