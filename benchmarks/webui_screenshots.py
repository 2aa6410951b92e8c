"""Screenshots of the chat page mid-conversation, for the README: docs/webui-desktop.png
(1280x800, settings open) and docs/webui-phone.png (390x844).

    .venv/bin/python benchmarks/webui_screenshots.py [--model smollm2-135m] [--out docs]

Starts ``gguflm serve`` on a free loopback port, drives headless Chromium (Debian's
``chromium`` and ``chromedriver``, through Selenium) as a person would: two short chats at
temperature 0 with a system prompt, then the screenshots.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from browser import DESKTOP, PHONE, Server, find_chromium, set_viewport, start_browser  # noqa: E402

SYSTEM = "You are a helpful assistant."
CHATS = [
    ["Give me three tips for learning to cook, as a list."],
    ["What is the capital of France?",
     "How do I reverse a list in Python? Show a short example."],
]


def wait_reply(chrome, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = chrome.execute_script(
            "const r = [...document.querySelectorAll('.msg.assistant')].pop();"
            "return document.getElementById('stop').hidden && r && "
            "Boolean(r.querySelector('.stats, .error'))")
        if done:
            return
        time.sleep(0.1)
    raise SystemExit("error: the reply did not end in time")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", type=Path, default=REPO / "docs")
    args = p.parse_args()
    found = find_chromium()
    if isinstance(found, str):
        raise SystemExit(f"error: {found}")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    server = Server(args.model)
    chrome = start_browser(*found, DESKTOP)
    try:
        chrome.get(server.page_url)
        chrome.execute_script(
            "localStorage.clear(); localStorage.setItem('gguflm.settings', JSON.stringify("
            "{temperature: '0', top_p: '0.95', max_tokens: '200', seed: ''}))")
        chrome.get(server.page_url)
        chrome.find_element(By.ID, "system").click()
        chrome.find_element(By.ID, "system-prompt").send_keys(SYSTEM)  # new chats copy it
        chrome.find_element(By.CSS_SELECTOR, "#system summary").click()  # folded again
        for k, chat in enumerate(CHATS):
            if k:
                chrome.find_element(By.ID, "new-chat").click()
            for text in chat:
                box = chrome.find_element(By.ID, "input")
                box.send_keys(text)
                box.send_keys(Keys.ENTER)
                wait_reply(chrome)
        args.out.mkdir(parents=True, exist_ok=True)
        chrome.find_element(By.ID, "toggle-settings").click()
        time.sleep(0.3)
        chrome.save_screenshot(str(args.out / "webui-desktop.png"))
        chrome.find_element(By.ID, "toggle-settings").click()
        set_viewport(chrome, PHONE, mobile=True)
        time.sleep(0.3)
        chrome.execute_script("const c = document.getElementById('chat');"
                              "c.scrollTop = c.scrollHeight;")
        time.sleep(0.3)
        chrome.save_screenshot(str(args.out / "webui-phone.png"))
    finally:
        chrome.quit()
        server.stop()
    print(f"wrote {args.out / 'webui-desktop.png'} and {args.out / 'webui-phone.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
