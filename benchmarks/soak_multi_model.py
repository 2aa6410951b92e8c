"""Soak ``gguflm serve`` with several models (issue 49's bar): SmolLM2, Gemma 3 270M and
all-MiniLM behind one server whose ``--mem-budget`` holds two of them, CLIENTS clients each
alternating the three models for DURATION seconds.

Checked: no 5xx answer; every reply equal to what a single-model server of the same file
gives at temperature 0 (the chat text; the embedding within 1e-6); the server's RSS never
above the budget plus the runtime's own floor (its RSS after every model has been loaded
once and unloaded: the compiled kernels, libraries, allocator); ``/api/ps`` at every sample
lists served models whose estimated sizes fit the budget. Reported: requests, swaps (loads
and unloads from the server's log), latencies, the RSS peak.

    .venv/bin/python benchmarks/soak_multi_model.py [--duration 300] [--clients 8]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gguflm.model_pool import ModelSpec, estimate_bytes  # noqa: E402

CACHE = Path.home() / ".cache" / "gguflm"
MODELS = {"smollm": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma": "gemma-3-270m-q4_k_m.gguf",
          "minilm": "all-MiniLM-L6-v2-F16.gguf"}
PROMPTS = ["Name three colours.", "What is 2 + 2?", "Write a haiku about rain.",
           "Say hello in French."]
N_CTX, PARALLEL, MAX_TOKENS = 512, 2, 16


def _call(url: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _ask(url: str, name: str, prompt: str) -> tuple[int, Any]:
    """(status, reply): the chat text, or the embedding."""
    if name == "minilm":
        status, body = _call(url, "/v1/embeddings", {"model": name, "input": prompt})
        return status, body["data"][0]["embedding"] if status == 200 else body
    status, body = _call(url, "/v1/chat/completions", {
        "model": name, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS, "temperature": 0})
    return status, body["choices"][0]["message"]["content"] if status == 200 else body


def _start(args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "gguflm.cli", "serve", *args,
                                 "--host", "127.0.0.1", "--port", "0", "-c", str(N_CTX),
                                 "-np", str(PARALLEL)],
                                stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 1800  # a first run compiles the kernels
    while time.monotonic() < deadline and proc.poll() is None:
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text())
        if m:
            return proc, m.group(1)
        time.sleep(0.2)
    raise SystemExit(f"the server did not start: {log.read_text()}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def references(tmp: Path) -> dict[tuple[str, str], Any]:
    """Each model's reply to each prompt from a server of that model alone."""
    out = {}
    for name, file in MODELS.items():
        proc, url = _start([str(CACHE / file), "--alias", name], tmp / f"single-{name}.txt")
        try:
            for prompt in PROMPTS:
                status, reply = _ask(url, name, prompt)
                assert status == 200, (name, status, reply)
                out[name, prompt] = reply
        finally:
            _stop(proc)
    return out


def same(a: Any, b: Any) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(abs(x - y) <= 1e-6 for x, y in zip(a, b, strict=True))
    return a == b


class Soak:
    def __init__(self, url: str, pid: int, budget: int, sizes: dict[str, int],
                 expected: dict[tuple[str, str], Any]) -> None:
        self.url, self.pid, self.budget, self.sizes = url, pid, budget, sizes
        self.expected = expected
        self.lock = threading.Lock()
        self.results: list[tuple[str, int, float, bool]] = []
        self.bad: list[str] = []
        self.ps_samples = 0
        self.rss_peak = 0
        self.stop = threading.Event()

    def client(self, i: int) -> None:
        names = list(MODELS)
        k = 0
        while not self.stop.is_set():
            name, prompt = names[(i + k) % 3], PROMPTS[(i + k // 3) % len(PROMPTS)]
            t0 = time.monotonic()
            status, reply = _ask(self.url, name, prompt)
            ok = status == 200 and same(reply, self.expected[name, prompt])
            with self.lock:
                self.results.append((name, status, time.monotonic() - t0, ok))
                if not ok:
                    self.bad.append(f"client {i} {name} {prompt!r}: {status} {reply!r:.200}")
            k += 1

    def sampler(self) -> None:
        while not self.stop.is_set():
            self.rss_peak = max(self.rss_peak, _rss(self.pid))
            status, body = _call(self.url, "/api/ps")
            names = [m["name"].removesuffix(":latest") for m in body["models"]]
            total = sum(self.sizes[n] for n in names)
            with self.lock:
                self.ps_samples += 1
                if status != 200 or not set(names) <= set(MODELS) or total > self.budget:
                    self.bad.append(f"/api/ps: {names} ({total} bytes, budget "
                                    f"{self.budget})")
            time.sleep(0.25)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds (default 300)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--json", metavar="FILE", help="also write the figures here")
    a = ap.parse_args()

    sizes = {n: estimate_bytes(ModelSpec(n, CACHE / f, {"n_ctx": N_CTX, "parallel": PARALLEL}))
             for n, f in MODELS.items()}
    budget = sum(sorted(sizes.values())[1:]) + min(sizes.values()) // 2  # two, never three
    tmp = Path(tempfile.mkdtemp(prefix="soak-multi-"))
    expected = references(tmp)
    config = tmp / "models.json"
    config.write_text(json.dumps({"models": {n: {"model": str(CACHE / f)}
                                             for n, f in MODELS.items()}}))
    log = tmp / "multi.txt"
    proc, url = _start(["--models-config", str(config), "--mem-budget", str(budget),
                        "--ttl", "600"], log)
    try:
        for name in MODELS:  # the runtime's own floor: every model loaded once, then none
            assert _call(url, "/models/load", {"model": name})[0] == 200
            assert _call(url, "/models/unload", {"model": name})[0] == 200
        time.sleep(1.0)
        floor = _rss(proc.pid)
        soak = Soak(url, proc.pid, budget, sizes, expected)
        threads = [threading.Thread(target=soak.client, args=(i,)) for i in range(a.clients)]
        threads.append(threading.Thread(target=soak.sampler))
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(a.duration)
        soak.stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        alive = proc.poll() is None
    finally:
        _stop(proc)
    stderr = log.read_text()
    n5xx = sum(1 for _, s, _, _ in soak.results if s >= 500)
    lat = sorted(d for _, _, d, _ in soak.results)
    figures = {
        "duration_s": round(elapsed, 1), "clients": a.clients, "requests": len(soak.results),
        "per_model": {n: sum(1 for m, *_ in soak.results if m == n) for n in MODELS},
        "status_5xx": n5xx, "mismatches": sum(1 for *_, ok in soak.results if not ok),
        "loads": stderr.count(": loaded "), "unloads": stderr.count(": unloaded "),
        "latency_p50_s": round(lat[len(lat) // 2], 2) if lat else None,
        "latency_p95_s": round(lat[int(len(lat) * 0.95)], 2) if lat else None,
        "latency_max_s": round(lat[-1], 2) if lat else None,
        "budget_mib": round(budget / 2**20), "floor_mib": round(floor / 2**20),
        "rss_peak_mib": round(soak.rss_peak / 2**20),
        "rss_within_budget_plus_floor": soak.rss_peak <= budget + floor,
        "ps_samples": soak.ps_samples, "server_alive": alive,
        "estimates_mib": {n: round(s / 2**20) for n, s in sizes.items()},
        "problems": soak.bad[:20],
    }
    print(json.dumps(figures, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=2))
    ok = (alive and n5xx == 0 and not soak.bad and figures["rss_within_budget_plus_floor"])
    print("PASS" if ok else "FAIL", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
