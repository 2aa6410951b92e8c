"""Issue 34's bars, against a live ``gguflm serve`` on loopback.

    .venv/bin/python benchmarks/soak_hostile.py soak [--requests 200] [--clients 16]
    .venv/bin/python benchmarks/soak_hostile.py fuzz [--minutes 10]

``soak``: ``--requests`` ordinary requests from ``--clients`` concurrent clients (as
check_serve.py's soak: streamed and not, some hanging up, some embeddings) while two more
clients send the attacks of issue 34 round and round ($ref chains, rebinding Host headers,
abandoned completions and embeddings, grammars that break, memory-hungry regexes, NaN
penalties, huge integers, lone surrogates, bad logit_bias, 3,000 tools). Bars: nothing lost
or mixed up, no attack answered 500 (or anything but its 4xx), no internal error in the
server's log, /health in under 100 ms at the end, RSS back within 10% of its start.

``fuzz``: generated JSON schemas, regexes and GBNF grammars (hypothesis) sent for
``--minutes``: no 500, no crash, every answer within 10 s; /health in under 100 ms after.
Prints the figures and exits 1 if a bar is missed. Only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_serve import Server  # noqa: E402 - the same server process helper
from check_serve import complete, embed, prompts, soak_request  # noqa: E402

HOST = "127.0.0.1"


def post(port: int, path: str, body: bytes | dict, headers: dict | None = None,
         timeout: float = 120) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, data, {"Content-Type": "application/json"} | (headers or {}))
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, {}
    finally:
        conn.close()


def abandon(port: int, path: str, body: dict, after: float) -> tuple[int, dict]:
    data = json.dumps(body).encode()
    with socket.create_connection((HOST, port), timeout=30) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                  f"application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        time.sleep(after)
    return 0, {}


def _chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def attacks(port: int) -> list[tuple[str, tuple[int, ...], object]]:
    """(name, the statuses it may get, a callable sending it)."""
    chat = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}},
        "$defs": _chain(2500)["$defs"]}}}
    many = [{"type": "function", "function": {"name": f"t{i}", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}} for i in range(3000)]
    many[554]["function"]["parameters"]["properties"]["x"] = {"type": "array",
                                                              "uniqueItems": True}
    c = {"prompt": "Say:", "max_tokens": 4}
    out = [
        ("ref chain", (400,), lambda: post(port, "/v1/completions",
                                           c | {"json_schema": _chain(2500)})),
        ("tool ref chain", (400,), lambda: post(port, chat, {
            "messages": msgs, "max_tokens": 1, "tools": [tool], "tool_choice": "required"})),
        ("rebinding", (403,), lambda: post(port, "/v1/completions", c, {
            "Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"})),
        ("abandoned completion", (0,), lambda: abandon(
            port, "/v1/completions", {"prompt": "Once", "max_tokens": 300}, 0.5)),
        ("abandoned embedding", (0,), lambda: abandon(
            port, "/v1/embeddings", {"input": [list(range(100, 1100))] * 60}, 2.0)),
        ("3000 tools", (400,), lambda: post(port, chat, {
            "messages": msgs, "max_tokens": 1, "tools": many, "tool_choice": "required"})),
        ("presence -1e39", (400,), lambda: post(port, "/v1/completions", c | {
            "regex": "[0-9]+", "temperature": 0, "presence_penalty": -1e39})),
        ("repeat 1e-50", (400,), lambda: post(port, "/v1/completions", c | {
            "regex": "[0-9]+", "temperature": 0, "repeat_penalty": 1e-50})),
        ("repeat_last_n 2**63", (400,), lambda: post(port, "/v1/completions", c | {
            "repeat_last_n": 2**63})),
        ("surrogate regex", (400,), lambda: post(
            port, "/v1/completions", b'{"prompt": "x", "max_tokens": 1, "regex": "\\ud800"}')),
        ("bad logit_bias", (400,), lambda: post(port, "/v1/completions", c | {
            "logit_bias": {"99999999": 5}})),
        ("logit_bias", (200,), lambda: post(port, "/v1/completions", c | {
            "logit_bias": {"28": 3, "42": False}})),
    ]
    grammars = [
        ("json_schema", {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"},
                                                        "b": {"$ref": "#/$defs/a"}}}),
        ("grammar", 'root ::= root "a"'), ("regex", "[^\\x00-\\x{10FFFF}]"),
        ("grammar", 'root ::= "a"{1000000}'), ("regex", "(x{1000}){1000}"),
        ("grammar", "root ::= " + " | ".join(f'"w{i}"' for i in range(20000))),
    ]
    for field, value in grammars:
        out.append((f"{field} {str(value)[:24]}", (400,),
                    lambda f=field, v=value: post(port, "/v1/completions", c | {f: v})))
    for letter in "cdefghij":  # distinct memory-hungry regexes
        out.append((f"({letter}{{1000}}){{1000}}", (400,), lambda x=letter: post(
            port, "/v1/completions", c | {"regex": f"({x}{{1000}}){{1000}}"})))
    return out


def health(port: int) -> tuple[int, float, dict]:
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    t0 = time.perf_counter()
    conn.request("GET", "/health")
    resp = conn.getresponse()
    body = json.loads(resp.read())
    ms = (time.perf_counter() - t0) * 1000
    conn.close()
    return resp.status, ms, body


def wait_idle(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (health(port)[2].get("queue")
                                           or health(port)[2].get("slots_processing")):
        time.sleep(0.5)


def best_health_ms(port: int, tries: int = 5) -> float:
    return min(health(port)[1] for _ in range(tries))


def soak(srv: Server, port: int, args: argparse.Namespace) -> bool:
    ps = prompts(args.clients * 2)
    expected = {p: complete(port, {"prompt": p, "max_tokens": args.max_tokens,
                                   "temperature": 0}) for p in ps}
    embeddings = {p: embed(port, p) for p in ps}
    # the warm-up includes each attack once: what the server builds once and keeps (the
    # grammar engine's view of the vocabulary, the worker threads) is not growth
    rss_cold = srv.rss_mib()
    for _, _, send in attacks(port):
        send()
    # and every slot's KV cache written as far as the attacks write it (1,000-token inputs):
    # the cache's pages are committed as positions are first written (23 kB a position
    # here), which is the cache, not growth
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(lambda _: post(port, "/v1/embeddings", {"input": list(range(100, 1200))},
                                     timeout=900), range(args.parallel)))
    wait_idle(port)
    rss0 = srv.rss_mib()
    results: list[tuple[str, object, bool]] = []
    lock = threading.Lock()
    stop = threading.Event()
    seen: Counter[str] = Counter()
    wrong: list[str] = []

    def one(i: int) -> None:
        got = soak_request(port, ps, i, args.max_tokens)
        with lock:
            results.append(got)

    def attacker(offset: int) -> None:
        todo = attacks(port)
        i = offset
        while not stop.is_set():
            name, allowed, send = todo[i % len(todo)]
            i += 1
            try:
                status, body = send()
            except OSError as e:
                status, body = -1, {"error": str(e)}
            with lock:
                seen[name] += 1
                if status not in allowed and not (status == 503 and 0 not in allowed):
                    wrong.append(f"{name}: {status} {str(body)[:150]}")

    attackers = [threading.Thread(target=attacker, args=(k * 7,), daemon=True)
                 for k in range(2)]
    t0 = time.perf_counter()
    for t in attackers:
        t.start()
    with ThreadPoolExecutor(args.clients) as pool:
        list(pool.map(one, range(args.requests)))
    stop.set()
    for t in attackers:
        t.join(timeout=120)
    wall = time.perf_counter() - t0
    hung = sum(1 for _, _, h in results if h)
    lost = [(p, t) for p, t, h in results if not h and (t is None or isinstance(t, str)
                                                         and t.startswith("HTTP "))]
    mixed = [(p, t) for p, t, h in results if not h and t is not None and (p, t) not in lost
             and t != (embeddings[p] if isinstance(t, list) else expected[p])]
    wait_idle(port)  # the abandoned work is cancelled, the queue drains
    status, _, body = health(port)
    ms = best_health_ms(port)
    time.sleep(2)
    rss1 = srv.rss_mib()
    internal = Path(srv.log.name).read_text().count("internal error")
    print(f"soak: {len(results)} ordinary requests from {args.clients} clients and "
          f"{sum(seen.values())} attacks ({len(seen)} kinds) in {wall:.1f} s ({hung} hung up "
          f"on purpose): {len(lost)} lost, {len(mixed)} mixed up, {len(wrong)} attacks "
          f"answered wrongly, {internal} internal errors logged; /health {status} in "
          f"{ms:.0f} ms, queue {body.get('queue')}, slots busy {body.get('slots_processing')}; "
          f"RSS {rss0:.0f} -> {rss1:.0f} MiB ({(rss1 / rss0 - 1) * 100:+.1f}%; {rss_cold:.0f} MiB "
          "before the warm-up's attacks)")
    for line in wrong[:5]:
        print(f"  wrong: {line}")
    for p, t in (lost + mixed)[:3]:
        print(f"  lost/mixed: {p!r}: {str(t)[:120]}")
    return not lost and not mixed and not wrong and not internal and status == 200 \
        and ms < 100 and rss1 <= 1.10 * rss0


def fuzz(srv: Server, port: int, args: argparse.Namespace) -> bool:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    stats: Counter[str] = Counter()
    bad: list[str] = []
    slowest = [0.0]
    end = time.monotonic() + args.minutes * 60

    names = st.sampled_from(["a", "b", "x_1", "n"])
    leaf = st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["integer", "number", "string",
                                                        "boolean", "null"])}),
        st.fixed_dictionaries({"type": st.just("string"), "pattern": st.sampled_from(
            ["^[a-z]+$", "[0-9]{2,4}", "(a|b)*c", "x{0,1000}", "\\ud83d", "(",
             "[^\\x00-\\x{10FFFF}]"])}),
        st.fixed_dictionaries({"enum": st.lists(st.text(max_size=8), min_size=1, max_size=5)}),
        st.fixed_dictionaries({"$ref": st.sampled_from(["#", "#/$defs/a", "#/$defs/b",
                                                       "#/nowhere", "#x"])}),
        st.fixed_dictionaries({"type": st.just("integer"), "minimum": st.integers(-10**20, 10),
                               "maximum": st.integers(-10, 10**20)}),
    )
    schema = st.recursive(leaf, lambda kids: st.one_of(
        st.fixed_dictionaries({"type": st.just("object"),
                               "properties": st.dictionaries(names, kids, max_size=4),
                               "required": st.lists(names, max_size=3)}),
        st.fixed_dictionaries({"type": st.just("array"), "items": kids,
                               "minItems": st.integers(0, 3),
                               "maxItems": st.integers(0, 10**6)}),
        st.fixed_dictionaries({"anyOf": st.lists(kids, min_size=1, max_size=4)}),
        st.fixed_dictionaries({"allOf": st.lists(kids, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"$defs": st.fixed_dictionaries({"a": kids, "b": kids}),
                               "$ref": st.sampled_from(["#/$defs/a", "#/$defs/b"])}),
    ), max_leaves=30)
    atom = st.one_of(st.sampled_from(["a", "b", "[0-9]", "[^a]", "\\d", "\\w", ".", "x",
                                      "[a-z]", "\\x{10FFFF}", "[^\\x00-\\x{10FFFF}]"]),
                     st.text(alphabet="abc()[]{}|*+?\\^$.-,0123456789", max_size=6))
    regex = st.recursive(atom, lambda kids: st.one_of(
        st.tuples(kids, kids).map("".join),
        st.tuples(kids, kids).map(lambda t: f"({t[0]}|{t[1]})"),
        st.tuples(kids, st.integers(0, 3000), st.integers(0, 3000)).map(
            lambda t: f"({t[0]}){{{min(t[1], t[2])},{max(t[1], t[2])}}}"),
        kids.map(lambda k: f"({k})*"), kids.map(lambda k: f"({k})+")), max_leaves=12)
    rule = st.recursive(st.one_of(st.sampled_from(['"a"', '"bc"', "[0-9]", "[^\\n]", "x",
                                                   "root", '""', "[a-z]"])),
                        lambda kids: st.one_of(
                            st.tuples(kids, kids).map(" ".join),
                            st.tuples(kids, kids).map(lambda t: f"( {t[0]} | {t[1]} )"),
                            st.tuples(kids, st.integers(0, 10**6)).map(
                                lambda t: f"( {t[0]} ){{{t[1]}}}"),
                            kids.map(lambda k: f"( {k} )*"), kids.map(lambda k: f"( {k} )?")),
                        max_leaves=12)
    gbnf = st.tuples(rule, rule).map(lambda t: f"root ::= {t[0]}\nx ::= {t[1]} | \"z\"\n")
    request = st.one_of(schema.map(lambda s: ("json_schema", s)),
                        regex.map(lambda r: ("regex", r)), gbnf.map(lambda g: ("grammar", g)))

    @settings(max_examples=20, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(request, st.booleans())
    def one(req: tuple[str, object], stream: bool) -> None:
        if time.monotonic() > end:
            return
        field, value = req
        body = {"prompt": "Answer:", "max_tokens": 8, field: value, "stream": stream}
        t0 = time.perf_counter()
        try:
            status, out = post(port, "/v1/completions", body, timeout=60)
        except (OSError, http.client.HTTPException) as e:
            status, out = -1, {"error": repr(e)}
        took = time.perf_counter() - t0
        slowest[0] = max(slowest[0], took)
        stats[f"{field} {status}"] += 1
        if status not in (200, 400) or took > 10:
            bad.append(f"{status} in {took:.1f} s: {json.dumps(body)[:200]} -> "
                       f"{str(out)[:200]}")
        if srv.proc.poll() is not None:
            raise SystemExit("the server died")

    t0 = time.perf_counter()
    minute = time.monotonic() + 60
    while time.monotonic() < end:  # 20 examples a run, runs until the time is up
        one()
        if time.monotonic() > minute:
            minute += 60
            print(f"  {sum(stats.values())} requests, {len(bad)} bad, slowest "
                  f"{slowest[0]:.2f} s", flush=True)
    wall = time.perf_counter() - t0
    status, _, _ = health(port)
    ms = best_health_ms(port)
    internal = Path(srv.log.name).read_text().count("internal error")
    alive = srv.proc.poll() is None
    print(f"fuzz: {sum(stats.values())} requests in {wall / 60:.1f} min "
          f"({', '.join(f'{k}: {v}' for k, v in sorted(stats.items()))}); slowest answer "
          f"{slowest[0]:.2f} s; {len(bad)} bad, {internal} internal errors logged; server "
          f"{'alive' if alive else 'DEAD'}, /health {status} in {ms:.0f} ms")
    for line in bad[:5]:
        print(f"  bad: {line}")
    return not bad and not internal and alive and status == 200 and ms < 100


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("soak", "fuzz"))
    for flag, default in (("--model", "smollm2-135m"), ("--parallel", 8), ("--threads", 2),
                          ("--requests", 200), ("--clients", 16), ("--max-tokens", 48),
                          ("--minutes", 10.0)):
        ap.add_argument(flag, type=type(default), default=default)
    args = ap.parse_args()
    from gguflm.hub import resolve_model

    srv = Server("gguflm", str(resolve_model(args.model)), args.parallel, args.threads, None)
    port = int(srv.url.rsplit(":", 1)[1])
    try:
        ok = soak(srv, port, args) if args.what == "soak" else fuzz(srv, port, args)
    finally:
        srv.close()
    print("all bars met" if ok else "BARS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
