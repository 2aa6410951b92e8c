"""Serving throughput and latency: N concurrent streaming clients against ``gguflm serve``
(and llama.cpp's ``llama-server`` in the same run, when given), on loopback only.

    .venv/bin/python benchmarks/bench_serve.py [--model smollm2-135m] [--clients 1,2,4,8]
        [--max-tokens 128] [-t 2] [-r 3] [--llama-server PATH] [--latency] [--json]

For each N a server is started with N slots (``gguflm serve -np N -t T``; llama-server
``-np N -cb -t T -c N*1024``), N clients (the official ``openai`` client, one thread each)
stream ``--max-tokens``-token completions of different prompts at temperature 0, all at
once, and the script prints aggregate generated tokens/s (all tokens / wall time from the
first request to the last token) and p50/p95 time to first token. ``-r`` such runs (new
prompts each, so that no cache holds them) per server, as llama-bench repeats its tests,
with both servers up and their runs taking turns (this machine's speed drifts by a third
within minutes: runs minutes apart are not comparable): the run with the median tokens/s
is shown, with every run's figure in order. Ratios to gguflm's first N and to
llama-server at the same N
follow.

``--latency`` adds the two latency bars of the serving issue: the time to first token of a
request arriving while 7 others stream, against the same request on an idle server; and the
longest pause in 4 running streams while a 2,000-token prompt is evaluated beside them.
Every request and process is bounded in time; only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
CTX = 2560  # tokens per slot: room for the 2,000-token prompt of --latency
TOPICS = ["the sea", "a small town", "winter", "machines", "a garden", "the moon", "music",
          "an old library", "rivers", "the desert", "bread", "mountains", "trains", "bees",
          "a lighthouse", "clocks"]


OPENINGS = ["Write a long story about", "Tell me a long tale about",
            "Compose a long story about", "Narrate a long story about"]


def prompt(i: int) -> str:
    """Prompt i: each run of ``-r`` takes the next 16 (another opening: no shared start)."""
    opening = OPENINGS[i // len(TOPICS) % len(OPENINGS)]
    return f"{opening} {TOPICS[i % len(TOPICS)]}. Once upon a time,"


class Server:
    """A server process on a free port: gguflm serve, or llama-server."""

    def __init__(self, kind: str, model: str, n: int, threads: int, binary: str | None,
                 env: dict[str, str] | None = None) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-serve-{kind}-", suffix=".log",
                                               delete=False)
        if kind == "gguflm":
            cmd = [sys.executable, "-m", "gguflm.cli", "serve", model, "--port", "0",
                   "-np", str(n), "-t", str(threads), "-c", str(CTX)]
        else:
            import socket

            with socket.socket() as s:
                s.bind((HOST, 0))
                port = s.getsockname()[1]
            cmd = [binary, "-m", model, "--host", HOST, "--port", str(port), "-np", str(n),
                   "-cb", "-t", str(threads), "-c", str(CTX * n), "--no-webui"]
            self.url = f"http://{HOST}:{port}"
        self.kind = kind
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log,
                                     env=None if env is None else os.environ | env)
        self._wait_ready()

    def _wait_ready(self) -> None:
        import urllib.request

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: {Path(self.log.name).read_text()}")
            if self.kind == "gguflm" and not hasattr(self, "url"):
                m = re.search(r"listening on (http://127\.0\.0\.1:\d+)",
                              Path(self.log.name).read_text())
                if m:
                    self.url = m.group(1)
            if hasattr(self, "url"):
                try:
                    with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                        if r.status == 200:
                            return
                except OSError:
                    pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.kind} did not start")

    def rss_mib(self) -> float:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.unlink(self.log.name)


def stream_one(client, model: str, text: str, max_tokens: int, out: dict,  # noqa: ANN001
               seed: int | None = None, temperature: float = 0.0) -> None:
    """One streaming completion; fills out: ttft, end, tokens, text, gaps (between chunks)."""
    t0 = time.perf_counter()
    out["start"] = t0
    pieces, last, gaps, usage = [], None, [], None
    try:
        stream = client.completions.create(
            model=model, prompt=text, max_tokens=max_tokens, temperature=temperature,
            seed=seed, stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].text:
                if last is None:
                    out["ttft"] = now - t0
                else:
                    gaps.append((last, now))
                last = now
                pieces.append(chunk.choices[0].text)
    except Exception as e:  # noqa: BLE001 - reported
        out["error"] = f"{type(e).__name__}: {e}"
    out["end"] = time.perf_counter()
    out["text"] = "".join(pieces)
    out["tokens"] = usage.completion_tokens if usage is not None else 0
    out["gaps"] = gaps


def run_clients(url: str, model: str, n: int, max_tokens: int, offset: int = 0) -> dict:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                           timeout=900)
    outs = [{} for _ in range(n)]
    threads = [threading.Thread(target=stream_one, args=(client, model, prompt(offset + i),
                                                         max_tokens, outs[i]))
               for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=1200)
    errors = [o["error"] for o in outs if "error" in o]
    tokens = sum(o.get("tokens", 0) for o in outs)
    wall = max(o["end"] for o in outs) - t0
    ttft = sorted(o.get("ttft", float("nan")) for o in outs)
    return {"n": n, "tokens": tokens, "seconds": wall, "tokens_per_second": tokens / wall,
            "ttft_p50": statistics.median(ttft),
            "ttft_p95": ttft[min(len(ttft) - 1, int(round(0.95 * (len(ttft) - 1))))],
            "errors": errors}


def latency(url: str, model: str) -> dict:
    """TTFT of a probe alone and beside 7 streams (medians of three); the longest stall of
    4 streams while a 2,000-token prompt is evaluated."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                           timeout=900)
    probe = "The quick brown fox jumps over the lazy dog. In the end,"
    idle = []
    for _ in range(3):
        o: dict = {}
        stream_one(client, model, probe, 4, o)
        idle.append(o["ttft"])
    outs = [{} for _ in range(7)]
    threads = [threading.Thread(target=stream_one, args=(client, model, prompt(i), 96, outs[i]))
               for i in range(7)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # all 7 are streaming
    busy: dict = {}
    beside = []
    for _ in range(3):  # a probe lands at a random point of a step: the median of three
        one: dict = {}
        stream_one(client, model, probe, 4, one)
        if "ttft" in one:
            beside.append(one["ttft"])
        busy.update(one)
        time.sleep(0.5)
    if beside:
        busy["ttft"] = statistics.median(beside)
    for t in threads:
        t.join(timeout=900)
    # stall: 4 streams, then a long prompt joins
    outs = [{} for _ in range(4)]
    threads = [threading.Thread(target=stream_one, args=(client, model, prompt(i), 200, outs[i]))
               for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    # ~2,000 tokens with both models' tokenizers (common words are one token each; "wordN"
    # took ~3 tokens each with SmolLM2's, overflowing the slot)
    long_prompt = " ".join(f"Story {i}: the cat sat on the mat and watched the birds."
                           for i in range(123))
    lo: dict = {}
    t_long = time.perf_counter()
    stream_one(client, model, long_prompt, 2, lo)
    t_long_end = time.perf_counter()
    for t in threads:
        t.join(timeout=900)
    stall = 0.0
    for o in outs:
        for a, b in o.get("gaps", []):
            if b >= t_long and a <= t_long_end:
                stall = max(stall, b - a)
    steady = [b - a for o in outs for a, b in o.get("gaps", []) if b < t_long]
    return {"ttft_idle": statistics.median(idle), "ttft_beside_7": busy.get("ttft"),
            "ttft_ratio": busy.get("ttft", float("nan")) / statistics.median(idle),
            "long_prompt_seconds": t_long_end - t_long,
            "longest_stall_during_long_prompt": stall,
            "median_gap_before": statistics.median(steady) if steady else None,
            "errors": [o["error"] for o in [*outs, lo, busy] if "error" in o]}


def _alternating(kinds: list[str], path: str, n: int, args: argparse.Namespace) -> dict:
    """Each server's figures at N = n: the servers all up at once (an idle one waits
    without spinning), their runs taking turns (run k of every server, then run k + 1), so
    the machine's drift over the minutes falls on both alike; the median run of each."""
    servers = {}
    try:
        for kind in kinds:
            servers[kind] = Server(kind, path, n, args.threads, args.llama_server,
                                   env=dict(args.gguflm_env) if kind == "gguflm" else None)
            run_clients(servers[kind].url, args.model, 1, 8, offset=99)  # warm up
        runs: dict[str, list] = {kind: [] for kind in kinds}
        for k in range(max(1, args.repetitions)):
            for kind, srv in servers.items():
                runs[kind].append(run_clients(srv.url, args.model, n, args.max_tokens,
                                              offset=k * len(TOPICS)))
        out = {}
        for kind, srv in servers.items():
            ordered = sorted(runs[kind], key=lambda r: r["tokens_per_second"])
            r = dict(ordered[len(ordered) // 2])
            r["runs_tokens_per_second"] = [x["tokens_per_second"] for x in runs[kind]]
            r["errors"] = [e for x in ordered for e in x["errors"]]
            r["rss_mib"] = srv.rss_mib()
            out[kind] = r
        return out
    finally:
        for srv in servers.values():
            srv.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3,
                    help="runs per server; the median run's figures are shown")
    ap.add_argument("--llama-server", metavar="PATH", help="llama-server binary to compare")
    ap.add_argument("--latency", action="store_true", help="also the latency bars")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--gguflm-env", action="append", default=[], metavar="NAME=VALUE",
                    type=lambda s: tuple(s.split("=", 1)),
                    help="an environment variable for gguflm serve only (e.g. "
                         "OMP_WAIT_POLICY=active), to compare settings")
    args = ap.parse_args()
    from gguflm.hub import resolve_model

    path = str(resolve_model(args.model))
    ns = [int(x) for x in args.clients.split(",")]
    results: dict = {"model": args.model, "threads": args.threads,
                     "max_tokens": args.max_tokens, "gguflm": {}, "llama-server": {}}
    kinds = ["gguflm"] + (["llama-server"] if args.llama_server else [])
    for n in ns:
        for kind, r in _alternating(kinds, path, n, args).items():
            results[kind][n] = r
            if not args.json:
                errors = f"  ERRORS: {r['errors']}" if r["errors"] else ""
                spread = r["runs_tokens_per_second"]
                runs_text = (f" (runs {', '.join(f'{x:.1f}' for x in spread)})"
                             if len(spread) > 1 else "")
                print(f"{kind:12s} N={n}: {r['tokens_per_second']:7.1f} tokens/s aggregate"
                      f"{runs_text} ({r['tokens']} tokens in {r['seconds']:.1f} s), TTFT p50 "
                      f"{r['ttft_p50']:.2f} s p95 {r['ttft_p95']:.2f} s, RSS "
                      f"{r['rss_mib']:.0f} MiB{errors}", flush=True)
        if args.latency and n == max(ns):
            srv = Server("gguflm", path, n, args.threads, None, env=dict(args.gguflm_env))
            try:
                results["latency"] = latency(srv.url, args.model)
            finally:
                srv.close()
    g = results["gguflm"]
    if not args.json:
        base = g[ns[0]]["tokens_per_second"]
        for n in ns:
            line = f"N={n}: {g[n]['tokens_per_second'] / base:.2f}x gguflm N={ns[0]}"
            if n in results["llama-server"]:
                theirs = results["llama-server"][n]["tokens_per_second"]
                line += f", {g[n]['tokens_per_second'] / theirs:.2f}x llama-server"
            print(line)
        if "latency" in results:
            lat = results["latency"]
            print(f"latency: TTFT idle {lat['ttft_idle']:.3f} s, beside 7 streams "
                  f"{lat['ttft_beside_7']:.3f} s ({lat['ttft_ratio']:.2f}x); a 2,000-token "
                  f"prompt took {lat['long_prompt_seconds']:.1f} s, longest stall of the "
                  f"running streams {lat['longest_stall_during_long_prompt']:.3f} s (their "
                  f"median gap before: {lat['median_gap_before']:.3f} s)")
            for err in lat["errors"]:
                print(f"latency: a request failed: {err}")
    else:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
