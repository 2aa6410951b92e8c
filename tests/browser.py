"""Helpers for driving the chat page: ``gguflm serve`` in its own process, and Debian's
headless Chromium through Selenium and chromedriver (the installed ones: Selenium is told
both paths, so it never looks for or downloads a browser of its own).

Used by tests/api_server/test_webui_browser.py and benchmarks/webui_screenshots.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
DESKTOP = (1280, 800)
PHONE = (390, 844)


def find_chromium() -> tuple[str, str] | str:
    """(chromium, chromedriver) paths, or a sentence saying what is missing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[test]')"
    browser = os.environ.get("GGUFLM_CHROMIUM") or shutil.which("chromium") \
        or shutil.which("chromium-browser")
    driver = os.environ.get("GGUFLM_CHROMEDRIVER") or shutil.which("chromedriver")
    if not browser or not driver:
        return ("headless Chromium is not installed (apt-get install chromium "
                "chromium-driver; .ci/run does it)")
    return browser, driver


def start_browser(browser: str, driver: str, size: tuple[int, int] = DESKTOP) -> Any:
    """A headless Chromium whose page viewport is ``size`` CSS pixels."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                "--lang=en-US", f"--window-size={size[0]},{size[1]}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=Service(driver))
    set_viewport(chrome, size)
    return chrome


def set_viewport(chrome: Any, size: tuple[int, int], mobile: bool = False) -> None:
    """Exactly ``size`` CSS pixels of page, as a phone (touch, mobile viewport) or not."""
    chrome.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": mobile})


class Server:
    """``gguflm serve MODEL --port 0 ARGS...`` in a child process, until ``stop()``."""

    def __init__(self, model: str | Path, *args: str, n_ctx: int = 2048,
                 timeout: float = 180) -> None:
        self._log = tempfile.NamedTemporaryFile(prefix="gguflm-serve-", suffix=".txt")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gguflm.cli", "serve", str(model), "--host", HOST,
             "--port", "0", "-c", str(n_ctx), *args],
            stdout=subprocess.DEVNULL, stderr=self._log)
        self.url = self.page_url = self.model_id = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            log = self.log()
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)/v1\n", log)
            page = re.search(r"chat page at (http://\S+)", log)
            if m and (page or "--no-webui" in args):
                self.url, self.page_url = m.group(1), page.group(1) if page else ""
                self.model_id = re.search(r"gguflm serve: (\S+) \(n_ctx", log).group(1)
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"gguflm serve did not start:\n{self.log()}")

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def kill(self) -> None:
        """Take the server away at once, as a crash or a power cut would."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()
