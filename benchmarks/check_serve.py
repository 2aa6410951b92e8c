"""The serving engine's correctness bars, against a live ``gguflm serve`` on loopback.

    .venv/bin/python benchmarks/check_serve.py [--model smollm2-135m] [-np 8] [-t 2]
        [--requests 200] [--clients 16] [--max-tokens 48]

1. Determinism: 8 prompts, each at temperature 0 and seeded at temperature 0.8, sent one at
   a time and then all at once by 8 concurrent clients: every reply identical token for
   token (the completions' text, compared exactly).
2. Soak: ``--requests`` requests from ``--clients`` concurrent clients (streaming and not,
   every fifth streaming one hanging up after its first piece; every seventh request an
   embedding of a prompt the others complete): none lost (every one that did not hang up
   answered in full), none mixed up (each reply equals that prompt's temperature-0 reply,
   each embedding that prompt's embedding alone, exactly), the server answers /health at
   the end, and its RSS is back within 10% of what it was after the warm-up.
Prints the figures and exits 1 if a bar is missed. Bounded in time; only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_serve import Server  # noqa: E402 - the same server process helper

HOST = "127.0.0.1"


def complete(port: int, body: dict, hang_up: bool = False, timeout: float = 600) -> str | None:
    """The text of one completion (streamed or not); None if we hung up on purpose."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return f"HTTP {resp.status}: {resp.read()[:200]!r}"
        if not body.get("stream"):
            return json.loads(resp.read())["choices"][0]["text"]
        text, done = [], False
        for line in resp:
            line = line.strip()
            if line == b"data: [DONE]":
                done = True
                break
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    text.append(chunk["choices"][0]["text"])
                    if hang_up and text[-1]:
                        conn.sock.close()
                        return None
        return "".join(text) if done else "stream ended without [DONE]"
    finally:
        conn.close()


def embed(port: int, text: str, timeout: float = 600) -> list[float] | None:
    """The embedding of ``text`` (``POST /v1/embeddings``); None if the request failed."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/embeddings", json.dumps({"input": text}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        return body["data"][0]["embedding"] if resp.status == 200 else None
    except (OSError, ValueError, KeyError, IndexError):
        return None
    finally:
        conn.close()


def soak_request(port: int, ps: list[str], i: int, max_tokens: int
                 ) -> tuple[str, str | list[float] | None, bool]:
    """The soak's request ``i``: (its prompt, its answer, whether it hung up on purpose).
    Every seventh an embedding, the rest completions, every other one streamed and every
    fifth streamed one hanging up after its first piece."""
    p = ps[i % len(ps)]
    if i % 7 == 3:
        return p, embed(port, p), False
    stream = i % 2 == 0
    hang = stream and i % 10 == 0
    return p, complete(port, {"prompt": p, "max_tokens": max_tokens, "temperature": 0,
                              "stream": stream}, hang_up=hang), hang


def prompts(n: int) -> list[str]:
    subjects = ["cats", "the ocean", "a robot", "winter", "bread", "trains", "the moon",
                "gardens", "music", "mountains", "a clock", "bees", "rivers", "a library",
                "snow", "coffee"]
    return [f"Here is a short note about {subjects[i % len(subjects)]} (#{i}):"
            for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("-np", "--parallel", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    from gguflm.hub import resolve_model

    srv = Server("gguflm", str(resolve_model(args.model)), args.parallel, args.threads, None)
    port = int(srv.url.rsplit(":", 1)[1])
    ok = True
    try:
        # 1. the same replies alone and with 8 concurrent clients
        bodies = []
        for i, p in enumerate(prompts(8)):
            bodies.append({"prompt": p, "max_tokens": args.max_tokens, "temperature": 0})
            bodies.append({"prompt": p, "max_tokens": args.max_tokens, "temperature": 0.8,
                           "seed": 1000 + i})
        alone = [complete(port, b) for b in bodies]
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda b: complete(port, b), bodies))
        same = sum(a == b for a, b in zip(alone, together, strict=True))
        print(f"determinism: {same}/{len(bodies)} replies identical alone and with 8 "
              f"concurrent clients (temperature 0 and seeded 0.8)")
        ok &= same == len(bodies)

        # 2. soak
        ps = prompts(args.clients * 2)
        expected = {p: complete(port, {"prompt": p, "max_tokens": args.max_tokens,
                                       "temperature": 0}) for p in ps}
        embeddings = {p: embed(port, p) for p in ps}
        rss0 = srv.rss_mib()
        results: list[tuple[str, str | list[float] | None, bool]] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            got = soak_request(port, ps, i, args.max_tokens)
            with lock:
                results.append(got)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(one, range(args.requests)))
        wall = time.perf_counter() - t0
        hung = sum(1 for _, _, h in results if h)
        lost = [(p, t) for p, t, h in results if not h and t is None]
        mixed = [(p, t) for p, t, h in results if not h and t is not None
                 and t != (embeddings[p] if isinstance(t, list) else expected[p])]
        time.sleep(1.0)
        conn = http.client.HTTPConnection(HOST, port, timeout=10)
        t1 = time.perf_counter()
        conn.request("GET", "/health")
        health = conn.getresponse()
        health_ms = (time.perf_counter() - t1) * 1000
        health_body = json.loads(health.read())
        conn.close()
        rss1 = srv.rss_mib()
        print(f"soak: {len(results)} requests from {args.clients} clients in {wall:.1f} s "
              f"({hung} hung up on purpose): {len(lost)} lost, {len(mixed)} mixed up; "
              f"/health {health.status} in {health_ms:.0f} ms, slots busy "
              f"{health_body.get('slots_processing')}; RSS {rss0:.0f} -> {rss1:.0f} MiB "
              f"({(rss1 / rss0 - 1) * 100:+.1f}%)")
        for p, t in mixed[:3]:
            what = "embedding" if isinstance(t, list) else f"{t!r} != {expected[p]!r}"
            print(f"  mixed: {p!r}: {what}")
        ok &= not lost and not mixed and health.status == 200 and rss1 <= 1.10 * rss0
    finally:
        srv.close()
    print("all bars met" if ok else "BARS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
