"""Issue 48's traffic bar: the request shapes of Open WebUI and Claude Code, replayed.

    .venv/bin/python benchmarks/soak_clients.py [--minutes 10] [--clients 4] [MODEL]

One ``gguflm serve`` of MODEL (default SmolLM2) with 4 slots; ``--clients`` threads send,
round and round for ``--minutes``:

* Open WebUI's shapes: ``/api/chat`` (NDJSON streaming) and ``/v1/chat/completions``
  (streamed) with a long system prompt and a growing history, ``/api/tags``, ``/api/show``,
  ``/api/ps``, ``/api/version``, title generation (a short non-streamed request with
  ``format: "json"``), and ``/api/embed``;
* Claude Code's shapes: ``/v1/messages`` streamed with a long system prompt in blocks, a
  dozen tools with ``input_schema``, ``tool_result`` turns, ``tool_choice`` any, and
  ``/v1/messages/count_tokens``;
* both abort requests: a client hangs up in the middle of a stream.

Bars: no 5xx and no connection errors (every answer a 2xx or the API's own 4xx), nothing left
running at the end (``/health``'s slots idle and the queue empty), and the server's RSS at the
end within 10% of its RSS after the first minute's warm-up. Prints the figures; exit 1 if a
bar is missed. Only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_serve import Server  # noqa: E402 - the same server process helper

SYSTEM = ("You are a careful assistant inside a chat application. Follow the user's "
          "instructions, answer briefly, use Markdown where it helps, and never invent "
          "facts. " * 12)
TOOLS = [{"name": f"tool_{i}", "description": f"Tool number {i}: does thing {i}.",
          "input_schema": {"type": "object", "properties": {
              "path": {"type": "string", "maxLength": 40},
              "count": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["path"]}} for i in range(12)]
QUESTIONS = ["List three uses of a paperclip.", "What is 17 times 23?",
             "Summarise the plot of a fairy tale in two sentences.",
             "Write a haiku about rain.", "Which is larger, a cat or a mouse?"]


def request(port: int, method: str, path: str, body: dict | None = None,
            abort_after: float | None = None) -> int:
    """The status of one request, its body read to the end (or the connection dropped
    ``abort_after`` seconds into it: -2); -1 for a connection error."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, data, {"Content-Type": "application/json",
                                          "x-api-key": "x", "anthropic-version": "2023-06-01"})
        resp = conn.getresponse()
        if abort_after is not None:
            time.sleep(abort_after)
            conn.sock.shutdown(socket.SHUT_RDWR)
            return -2
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return -2 if abort_after is not None else -1
    finally:
        conn.close()


def webui_turn(port: int, rng: random.Random, history: list[dict]) -> list[int]:
    history.append({"role": "user", "content": rng.choice(QUESTIONS)})
    messages = [{"role": "system", "content": SYSTEM}] + history[-6:]
    stream = rng.random() < 0.5
    path, body = (("/api/chat", {"model": "m", "messages": messages,
                                 "options": {"num_predict": 24, "temperature": 0.7}})
                  if stream else
                  ("/v1/chat/completions", {"model": "m", "messages": messages,
                                            "max_tokens": 24, "stream": True}))
    abort = rng.random() < 0.15
    out = [request(port, "POST", path, body, 0.3 if abort else None)]
    history.append({"role": "assistant", "content": "Noted."})
    out.append(request(port, "POST", "/api/chat", {
        "model": "m", "stream": False, "format": "json", "options": {"num_predict": 16},
        "messages": [{"role": "user", "content": "Give a JSON title for: " +
                      history[-2]["content"]}]}))
    for path in ("/api/tags", "/api/ps", "/api/version"):
        out.append(request(port, "GET", path))
    out.append(request(port, "POST", "/api/show", {"model": "m"}))
    if rng.random() < 0.3:
        out.append(request(port, "POST", "/api/embed", {"model": "m",
                                                        "input": history[-2]["content"]}))
    return out


def claude_turn(port: int, rng: random.Random) -> list[int]:
    system = [{"type": "text", "text": SYSTEM}, {"type": "text", "text": "Project notes."}]
    messages = [{"role": "user", "content": rng.choice(QUESTIONS)}]
    if rng.random() < 0.5:
        messages += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                               "name": "tool_3", "input": {"path": "a.txt"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": "file contents " * 20}]}]
    body = {"model": "m", "max_tokens": 32, "system": system, "messages": messages,
            "tools": TOOLS, "stream": True}
    if rng.random() < 0.3:
        body["tool_choice"] = {"type": "any"}
    out = [request(port, "POST", "/v1/messages/count_tokens",
                   {k: v for k, v in body.items() if k not in ("max_tokens", "stream")})]
    abort = rng.random() < 0.15
    out.append(request(port, "POST", "/v1/messages", body, 0.3 if abort else None))
    return out


def client(port: int, seed: int, until: float, counts: Counter, lock: threading.Lock
           ) -> None:
    rng = random.Random(seed)
    history: list[dict] = []
    while time.monotonic() < until:
        statuses = webui_turn(port, rng, history) if seed % 2 == 0 else claude_turn(port, rng)
        with lock:
            counts.update(statuses)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    server = Server("gguflm", args.model, 4, args.threads, None)
    port = int(server.url.rsplit(":", 1)[1])
    counts: Counter = Counter()
    lock = threading.Lock()
    t0 = time.monotonic()
    until = t0 + args.minutes * 60
    workers = [threading.Thread(target=client, args=(port, i, until, counts, lock))
               for i in range(args.clients)]
    for w in workers:
        w.start()
    time.sleep(min(60.0, args.minutes * 60 / 5))
    rss_start = server.rss_mib()
    for w in workers:
        w.join()
    time.sleep(2)
    rss_end = server.rss_mib()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/health")
    health = json.loads(conn.getresponse().read())
    server.close()
    bad = {s: n for s, n in counts.items() if s == -1 or s >= 500}
    idle = health.get("slots_processing", 0) == 0 and health.get("queue", 0) == 0
    print(f"{sum(counts.values())} requests in {time.monotonic() - t0:.0f} s from "
          f"{args.clients} clients: {dict(sorted(counts.items()))} (-2: aborted on purpose)")
    print(f"RSS {rss_start:.0f} MiB after warm-up, {rss_end:.0f} MiB at the end "
          f"({(rss_end / rss_start - 1) * 100:+.1f}%); health at the end: {health}")
    ok = not bad and idle and rss_end <= rss_start * 1.10
    print("bars:", "met" if ok else f"MISSED (5xx/errors {bad}, idle {idle})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
