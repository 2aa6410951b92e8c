"""Load test for ``gguflm serve``: N concurrent streaming requests against a live server on
loopback; checks that none is lost and that the server stays up, and reports requests/s and
tokens/s.

    .venv/bin/python benchmarks/load_test_server.py [--model M] [--requests 50]
        [--max-tokens 8] [--kind chat|completion] [--timeout 900] [--json]

Starts ``gguflm serve MODEL --port 0`` in a child process (or uses ``--port P`` of a server
already running on 127.0.0.1) and fires all requests at once, each in its own thread over
the stdlib's http.client, with ``stream_options.include_usage`` so every stream reports its
exact token count. Only ever connects to 127.0.0.1. Bounded: the number of requests is capped
(200), every socket has a timeout, and the whole run stops at ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"  # loopback only, always
MAX_REQUESTS = 200


@dataclass
class Result:
    index: int
    status: int = 0
    done: bool = False  # saw "data: [DONE]"
    text: str = ""
    completion_tokens: int = 0
    first_token_s: float = 0.0
    total_s: float = 0.0
    error: str = ""


def _body(kind: str, i: int, max_tokens: int) -> dict:
    common = {"max_tokens": max_tokens, "temperature": 0.7, "seed": i, "stream": True,
              "stream_options": {"include_usage": True}}
    if kind == "chat":
        return common | {"messages": [{"role": "user", "content": f"Say something about {i}."}]}
    return common | {"prompt": f"Request {i}: the number {i} is"}


def one_request(port: int, kind: str, i: int, max_tokens: int, timeout: float,
                t_start: float, out: Result) -> None:
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
        conn.request("POST", path, body=json.dumps(_body(kind, i, max_tokens)),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out.status = resp.status
        if resp.status != 200:
            out.error = resp.read().decode("utf-8", "replace")[:200]
            return
        pieces = []
        for raw in resp:  # SSE: "data: {...}" lines separated by blank lines
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                out.done = True
                break
            event = json.loads(data)
            if "error" in event:
                out.error = event["error"]["message"]
                continue
            if event.get("usage"):
                out.completion_tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") if kind == "chat" \
                    else choice.get("text")
                if piece:
                    if not pieces:
                        out.first_token_s = time.perf_counter() - t_start
                    pieces.append(piece)
        out.text = "".join(pieces)
        conn.close()
    except Exception as e:  # noqa: BLE001 - every failure is a lost request, reported
        out.error = f"{type(e).__name__}: {e}"
    finally:
        out.total_s = time.perf_counter() - t_start


def start_server(model: str, timeout: float) -> tuple[subprocess.Popen, int, Path]:
    log = Path(tempfile.mkstemp(prefix="gguflm-serve-", suffix=".log")[1])
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "gguflm.cli", "serve", model, "--host",
                                 HOST, "--port", "0"], stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())
        if m:
            return proc, int(m.group(1)), log
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not start:\n{log.read_text()}")


def health(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=30)
        conn.request("GET", "/health")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="model for the server it starts")
    ap.add_argument("--port", type=int, help="use a server already on 127.0.0.1:PORT")
    ap.add_argument("--requests", type=int, default=50, help=f"concurrent requests (<= "
                                                            f"{MAX_REQUESTS}; default 50)")
    ap.add_argument("--max-tokens", type=int, default=8, help="tokens per request (default 8)")
    ap.add_argument("--kind", choices=("chat", "completion"), default="chat")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for the whole run")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()
    if not 1 <= args.requests <= MAX_REQUESTS:
        ap.error(f"--requests must be 1..{MAX_REQUESTS}")

    proc = log = None
    if args.port is None:
        proc, port, log = start_server(args.model, timeout=300)
    else:
        port = args.port
    try:
        assert health(port), "the server is not answering /health"
        results = [Result(i) for i in range(args.requests)]
        t0 = time.perf_counter()
        threads = [threading.Thread(target=one_request, daemon=True,
                                    args=(port, args.kind, i, args.max_tokens, args.timeout,
                                          t0, results[i]))
                   for i in range(args.requests)]
        for t in threads:
            t.start()
        up_during = health(port)  # /health does not wait for the model
        deadline = t0 + args.timeout
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.perf_counter()))
        wall = time.perf_counter() - t0
        up_after = health(port)
        alive = proc is None or proc.poll() is None
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    ok = [r for r in results if r.status == 200 and r.done and not r.error]
    lost = [r for r in results if r not in ok]
    tokens = sum(r.completion_tokens for r in ok)
    firsts = sorted(r.first_token_s for r in ok if r.first_token_s)
    summary = {
        "requests": args.requests, "completed": len(ok), "lost": len(lost),
        "kind": args.kind, "max_tokens": args.max_tokens,
        "wall_seconds": round(wall, 2),
        "requests_per_second": round(len(ok) / wall, 3),
        "tokens": tokens, "tokens_per_second": round(tokens / wall, 2),
        "first_token_seconds": {
            "min": round(firsts[0], 2) if firsts else None,
            "median": round(statistics.median(firsts), 2) if firsts else None,
            "max": round(firsts[-1], 2) if firsts else None},
        "health_during_load": up_during, "health_after": up_after, "server_alive": alive,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['completed']}/{args.requests} streaming {args.kind} requests completed "
              f"({summary['lost']} lost) in {summary['wall_seconds']} s")
        print(f"  {summary['requests_per_second']} requests/s, {tokens} tokens, "
              f"{summary['tokens_per_second']} tokens/s")
        ft = summary["first_token_seconds"]
        print(f"  time to first token: min {ft['min']} s, median {ft['median']} s, "
              f"max {ft['max']} s (requests are served one at a time, in arrival order)")
        print(f"  /health during load: {up_during}, after: {up_after}; server alive: {alive}")
    for r in lost[:5]:
        print(f"  lost request {r.index}: HTTP {r.status}, done={r.done}, {r.error}",
              file=sys.stderr)
    if log is not None:
        log.unlink(missing_ok=True)
    return 0 if not lost and up_after and alive else 1


if __name__ == "__main__":
    sys.exit(main())
