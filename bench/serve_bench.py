"""Benchmark: the OpenAI-compatible server under 1, 8 and 32 concurrent streaming clients.

    python bench/serve_bench.py [--clients 1,8,32] [--rounds 2] [--max-tokens 32] [--threads 1]
                                [--port 30123] [--model PATH]
                                [--long-prompt-tokens N] [--policies off,64] [--scenarios none,json]
                                [--probes hol,compile] [--hol-tokens 4000] [--compile-clients 4]

Starts ``formcast serve`` in a subprocess (its own interpreter: the clients do not share its
GIL), then for each scenario -- unconstrained chat (``ignore_eos``, exactly ``--max-tokens``
tokens) and JSON-schema-constrained chat (outputs end when the document is complete), at each
client count -- runs ``clients x rounds`` streamed chat requests, each client sending its next
request when the previous one ends. Every request has its own user message; all share SmolLM2's
system prompt (the prefix cache serves it). One warm-up request per scenario is not counted.

Reported per scenario:
* requests/s and output tokens/s over the scenario's wall time;
* time to first token (request sent -> first chunk with text) p50 / p99, seconds;
* inter-token latency p50 / p99 over the gaps between consecutive text chunks, ms (one chunk is
  usually one token; a jump-forward chunk carries several, so its gap covers them all);
* server time outside the engine, from the server's /metrics: CPU seconds of the thread running
  the event loop (HTTP parsing, pydantic, the chat template and tokenizer, JSON, SSE: everything
  but the engine's scheduler, model, grammar and detokenizer threads) per request (less the cost
  of the /metrics scrape itself), as a share of the whole server process's CPU time over the
  scenario, and as a share of the mean request latency.

With ``--long-prompt-tokens N`` one more client sends, for the whole scenario, one request after
another with an N-word prompt (about N tokens) and ``max_tokens`` 1 (its own timings are not in
the table): the head-of-line case where a long prefill stalls running streams.
``--policies off,64`` starts one server per setting of ``--decode-prefill-budget`` ("off": none),
all at once on consecutive ports, and runs each scenario on every server in turn before the next
scenario, so the rows of one scenario are measured minutes apart at most on a machine whose load
changes; the table gets a ``policy`` column and, per scenario, the ratio of each policy's
figures to the first one's (ITL p99 is the figure to read).

Two probes, per server, after the table (``--probes hol,compile``; each needs the long prompt or
a compile):
* ``hol``: a request with an N-word prompt (``--long-prompt-tokens``, default 4000 here) and
  ``max_tokens`` 1, then, one second later, a short request with ``max_tokens`` 1: how long the
  short one waited (its whole latency) and how long the long one took;
* ``compile``: ``--compile-clients`` unconstrained streams run while a request with a JSON schema
  never seen before (string formats; a fresh key name each run, so no cache serves it) is sent;
  the streams' inter-token gaps that end while that compile is under way (from sending it to its
  first token) against the gaps before it: p50 / p99 of each and their ratio.

Absolute figures depend on the machine and on its other load; compare rows of one run. Not
collected by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import markdown_table, pct  # noqa: E402  (bench/ is on sys.path when run as a script)

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "city": {"type": "string", "maxLength": 24}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}  # fmt: skip
TOPICS = ["the sea", "a robot", "prime numbers", "Paris", "coffee", "the moon", "a violin", "winter"]


@dataclass
class RequestTiming:
    ttft: float
    gaps: list[float]
    e2e: float
    tokens: int


@dataclass
class Scenario:
    name: str
    clients: int
    constrained: bool
    timings: list[RequestTiming] = field(default_factory=list)
    wall: float = 0.0
    loop_cpu: float = 0.0
    process_cpu: float = 0.0


def request_body(model: str, index: int, constrained: bool, max_tokens: int) -> dict:
    topic = TOPICS[index % len(TOPICS)]
    body: dict = {"model": model, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": max_tokens, "temperature": 0.7, "seed": index}
    if constrained:
        body["messages"] = [{"role": "user", "content": f"Request {index}: a person who loves {topic}, as JSON."}]
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    else:
        body["messages"] = [{"role": "user", "content": f"Request {index}: write about {topic}."}]
        body["ignore_eos"] = True
    return body


def long_prompt_body(model: str, k: int, words: int) -> dict:
    """A ``words``-word prompt (about one token a word), its own from its first word (no prefix
    cache hit beyond the system prompt), answered with one token."""
    text = " ".join(TOPICS[(k + i) % len(TOPICS)].split()[-1] for i in range(words))
    return {"model": model, "messages": [{"role": "user", "content": f"{k}: {text}"}], "max_tokens": 1, "stream": True}


async def one_request(http: httpx.AsyncClient, body: dict, stamps: list[float] | None = None, first_only: bool = False) -> RequestTiming:
    """Send one streamed chat request; ``stamps`` (if given) receives the arrival time of every
    text chunk; ``first_only`` leaves after the first one (the disconnect aborts the request)."""
    start = time.perf_counter()
    first, last, gaps, tokens = None, None, [], 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{reply.status_code}: {(await reply.aread()).decode()[:500]}")
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any(c["delta"].get("content") for c in chunk["choices"]):
                now = time.perf_counter()
                if stamps is not None:
                    stamps.append(now)
                if first is None:
                    first = now
                    if first_only:
                        break
                else:
                    gaps.append(now - last)
                last = now
    end = time.perf_counter()
    return RequestTiming(ttft=(first or end) - start, gaps=gaps, e2e=end - start, tokens=tokens)


def scrape(url: str) -> tuple[float, float]:
    """(event-loop thread CPU seconds, process CPU seconds) from the server's /metrics."""
    values = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("formcast_server_loop_cpu_seconds_total", "process_cpu_seconds_total"):
            values[name] = float(value)
    return values["formcast_server_loop_cpu_seconds_total"], values["process_cpu_seconds_total"]


async def run_scenario(url: str, model: str, scenario: Scenario, rounds: int, max_tokens: int, first_index: int, long_prompt_tokens: int = 0) -> None:
    limits = httpx.Limits(max_connections=scenario.clients + 4, max_keepalive_connections=scenario.clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900), limits=limits) as http:
        await one_request(http, request_body(model, first_index, scenario.constrained, max_tokens))  # warm-up
        # What one scrape costs the loop thread (the window below holds about one): subtracted.
        before, _ = scrape(url)
        loop0, proc0 = scrape(url)
        scrape_cpu = loop0 - before
        start = time.perf_counter()

        async def client(c: int) -> None:
            for r in range(rounds):
                body = request_body(model, first_index + 1 + c * rounds + r, scenario.constrained, max_tokens)
                scenario.timings.append(await one_request(http, body))

        async def long_prompts() -> None:
            k = 0
            while True:  # one long prefill after another while the clients stream
                await one_request(http, long_prompt_body(model, k + 1000 * first_index, long_prompt_tokens))
                k += 1

        # The long-prompt client is cut when the clients are done (its disconnect aborts its request).
        background = asyncio.create_task(long_prompts()) if long_prompt_tokens else None
        await asyncio.gather(*(client(c) for c in range(scenario.clients)))
        scenario.wall = time.perf_counter() - start
        if background is not None:
            background.cancel()
            await asyncio.gather(background, return_exceptions=True)
        loop1, proc1 = scrape(url)
        scenario.loop_cpu, scenario.process_cpu = max(0.0, loop1 - loop0 - scrape_cpu), proc1 - proc0


def row(s: Scenario, policy: str) -> list:
    n = len(s.timings)
    gaps = [g for t in s.timings for g in t.gaps]
    ttft = [t.ttft for t in s.timings]
    tokens = sum(t.tokens for t in s.timings)
    return [
        policy, s.clients, "JSON schema" if s.constrained else "none", n,
        f"{n / s.wall:.2f}", f"{tokens / s.wall:.1f}",
        f"{pct(ttft, 50):.2f}", f"{pct(ttft, 99):.2f}",
        f"{1000 * pct(gaps, 50):.0f}", f"{1000 * pct(gaps, 99):.0f}",
        f"{1000 * s.loop_cpu / n:.1f}", f"{100 * s.loop_cpu / max(s.process_cpu, 1e-9):.1f}%",
        f"{100 * (s.loop_cpu / n) / (sum(t.e2e for t in s.timings) / n):.2f}%",
    ]  # fmt: skip


def start_server(args: argparse.Namespace, policy: str, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "engine", "serve", "--port", str(port), "--dtype", args.dtype, "--num-threads", str(args.threads),
               "--max-running-requests", str(max(args.clients) + 8), "--log-level", "warning", "--no-access-log"]  # fmt: skip
    if policy != "off":
        command += ["--decode-prefill-budget", policy]
    if args.model:
        command += ["--model", args.model]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(command, cwd=ROOT, env=env)


def wait_ready(proc: subprocess.Popen, url: str) -> None:
    for _ in range(2400):
        if proc.poll() is not None:
            raise SystemExit(f"formcast serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    proc.terminate()
    raise SystemExit("formcast serve did not come up")


def compile_schema(tag: str) -> dict:
    """A JSON schema no cache has seen (``tag`` in its key names and bounds) whose compile takes
    seconds: six length-bounded emails (each a product of the format's automaton with a
    counter; about 0.5 s each on the loaded development machine; above 72 characters the
    product passes the compiler's state cap)."""
    h = sum(map(ord, tag))
    key = "".join(c for c in tag if c.isalnum())[-6:]
    props = {f"contact{i}_{key}": {"type": "string", "format": "email", "maxLength": 60 + (h + i) % 12} for i in range(6)}
    return {"type": "object", "properties": props, "required": list(props)}


async def hol_probe(url: str, model: str, words: int) -> tuple[float, float]:
    """(the short request's latency, the long prompt's latency), seconds: a 1-token request sent
    one second after a ``words``-word prompt."""
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800)) as http:
        long = asyncio.create_task(one_request(http, long_prompt_body(model, 99_999, words)))
        await asyncio.sleep(1.0)
        short = await one_request(http, {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "stream": True})
        return short.e2e, (await long).e2e


async def compile_probe(url: str, model: str, clients: int, max_tokens: int, tag: str) -> dict:
    """Inter-token gaps of ``clients`` running streams before and during a fresh compile."""
    stamps: list[list[float]] = [[] for _ in range(clients)]
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800), limits=limits) as http:
        streams = [asyncio.create_task(one_request(http, request_body(model, 500 + c, False, max_tokens), stamps[c])) for c in range(clients)]
        while min(len(s) for s in stamps) < 6:  # every stream decoding, a few gaps each
            await asyncio.sleep(0.05)
        body = {"model": model, "messages": [{"role": "user", "content": "An email address, as JSON."}], "max_tokens": 400, "temperature": 0, "stream": True,
                "response_format": {"type": "json_schema", "json_schema": {"name": "contact", "schema": compile_schema(tag)}}}  # fmt: skip
        sent = time.perf_counter()
        constrained = await one_request(http, body, first_only=True)
        first = sent + constrained.ttft
        await asyncio.gather(*streams)
    before, during = [], []
    for s in stamps:
        for a, b in zip(s[1:], s[2:]):  # the first gap of a stream may include its prefill
            if b < sent:
                before.append(b - a)
            elif b <= first:
                during.append(b - a)
    return {"compile_s": first - sent, "before": before, "during": during}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,8,32", help="comma-separated client counts")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--port", type=int, default=30123, help="first port (one per policy)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--long-prompt-tokens", type=int, default=0, metavar="N", help="one more client sending N-word prompts throughout")
    parser.add_argument("--policies", default="off", help="comma-separated --decode-prefill-budget values of the server ('off': none)")
    parser.add_argument("--scenarios", default="none,json", help="none (unconstrained), json (JSON schema), or both; empty: probes only")
    parser.add_argument("--probes", default="", help="hol, compile, or both (after the table)")
    parser.add_argument("--hol-tokens", type=int, default=4000, help="prompt words of the hol probe's long request")
    parser.add_argument("--compile-clients", type=int, default=4, help="running streams of the compile probe")
    parser.add_argument("--compile-stream-tokens", type=int, default=64, help="max_tokens of the compile probe's streams")
    args = parser.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    policies = args.policies.split(",")
    servers = {}
    try:
        for k, policy in enumerate(policies):  # all at once: each loads while the others do
            servers[policy] = (start_server(args, policy, args.port + k), f"http://127.0.0.1:{args.port + k}")
        for proc, url in servers.values():
            wait_ready(proc, url)
        model = httpx.get(next(iter(servers.values()))[1] + "/v1/models").json()["data"][0]["id"]
        print(f"\nformcast serve, {args.dtype}, {args.threads} torch thread(s), max_tokens {args.max_tokens}, {args.rounds} requests per client, "
              f"{os.cpu_count()} CPUs, load average at the start {os.getloadavg()[0]:.1f}, long-prompt client: {args.long_prompt_tokens or 'none'} words\n", flush=True)  # fmt: skip
        if args.scenarios:
            run_table(args, servers, model)
        probes = [p for p in args.probes.split(",") if p]
        if "hol" in probes:
            rows = []
            for policy, (_, url) in servers.items():
                short, long = asyncio.run(hol_probe(url, model, args.hol_tokens))
                rows.append([policy, f"{short:.2f}", f"{long:.2f}", f"{short / long:.2f}"])
                print(f"done: hol probe, policy {policy}", file=sys.stderr, flush=True)
            print(f"\n1-token request sent 1 s after a {args.hol_tokens}-word prompt (max_tokens 1 both), load average {os.getloadavg()[0]:.1f}\n")
            print(markdown_table(["policy", "short request waited s", "long prompt took s", "short / long"], rows, align_right_from=1))
        if "compile" in probes:
            rows = []
            for k, (policy, (_, url)) in enumerate(servers.items()):
                r = asyncio.run(compile_probe(url, model, args.compile_clients, args.compile_stream_tokens, f"{time.time()}-{k}"))
                b, d = r["before"], r["during"]
                rows.append([policy, f"{r['compile_s']:.2f}", len(b), f"{1000 * pct(b, 50):.0f}", f"{1000 * pct(b, 99):.0f}", len(d),
                             *([f"{1000 * pct(d, 50):.0f}", f"{1000 * pct(d, 99):.0f}", f"{pct(d, 50) / pct(b, 50):.2f}", f"{pct(d, 99) / pct(b, 99):.2f}"] if d else ["", "", "", ""])])  # fmt: skip
                print(f"done: compile probe, policy {policy}", file=sys.stderr, flush=True)
            print(f"\n{args.compile_clients} streams while a fresh JSON schema compiles (send -> its first token), load average {os.getloadavg()[0]:.1f}\n")
            header = ["policy", "compile + first token s", "gaps before", "ITL p50 ms before", "ITL p99 ms before", "gaps during",
                      "ITL p50 ms during", "ITL p99 ms during", "p50 during / before", "p99 during / before"]  # fmt: skip
            print(markdown_table(header, rows, align_right_from=1))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait(60)


def run_table(args: argparse.Namespace, servers: dict, model: str) -> None:
    """The scenario table, each scenario run on every server in turn, then the ratios to the first policy."""
    by: dict[tuple, dict[str, Scenario]] = {}
    index = 0
    kinds = [k == "json" for k in args.scenarios.split(",")]
    for constrained in kinds:
        for clients in args.clients:
            for policy, (_, url) in servers.items():
                scenario = Scenario(f"{clients}-{constrained}", clients, constrained)
                asyncio.run(run_scenario(url, model, scenario, args.rounds, args.max_tokens, index, args.long_prompt_tokens))
                by.setdefault((constrained, clients), {})[policy] = scenario
                print(f"done: policy {policy}, {clients} clients, constrained={constrained}: {len(scenario.timings)} requests in {scenario.wall:.1f} s, "
                      f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)  # fmt: skip
            index += 1 + clients * args.rounds
    header = ["policy", "clients", "constraint", "requests", "req/s", "out tok/s", "TTFT p50 s", "TTFT p99 s", "ITL p50 ms", "ITL p99 ms",
              "loop CPU ms/req", "loop / server CPU", "loop CPU / latency"]  # fmt: skip
    print(markdown_table(header, [row(s, p) for runs in by.values() for p, s in runs.items()], align_right_from=3))
    policies = list(servers)
    if len(policies) > 1:
        ratios = []
        for (constrained, clients), runs in by.items():
            base = runs[policies[0]]
            for p in policies[1:]:
                ratios.append([p, clients, "JSON schema" if constrained else "none", *(f"{f(runs[p]) / max(f(base), 1e-9):.2f}" for f in FIGURES)])
        print(f"\nEach policy's figure over policy {policies[0]}'s, same scenario (< 1: lower with the policy)\n")
        print(markdown_table(["policy", "clients", "constraint", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "out tok/s"], ratios, align_right_from=3))


def _gaps(s: Scenario) -> list[float]:
    return [g for t in s.timings for g in t.gaps]


FIGURES = (
    lambda s: pct([t.ttft for t in s.timings], 50),
    lambda s: pct([t.ttft for t in s.timings], 99),
    lambda s: pct(_gaps(s), 50),
    lambda s: pct(_gaps(s), 99),
    lambda s: sum(t.tokens for t in s.timings) / s.wall,
)


if __name__ == "__main__":
    main()
