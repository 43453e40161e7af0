"""Benchmark: the OpenAI-compatible server under 1, 8 and 32 concurrent streaming clients.

    python bench/serve_bench.py [--clients 1,8,32] [--rounds 2] [--max-tokens 32] [--threads 1]
                                [--port 30123] [--model PATH]
                                [--long-prompt-tokens N] [--policies off,64]

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
another with an N-word prompt and ``max_tokens`` 1 (its own timings are not in the table): the
head-of-line case where a long prefill stalls running streams. ``--policies off,64`` runs the
whole table once per server setting of ``--decode-prefill-budget`` ("off": none), one server
each, and prints the rows side by side with a ``policy`` column (ITL p99 is the figure to read).

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


async def one_request(http: httpx.AsyncClient, body: dict) -> RequestTiming:
    start = time.perf_counter()
    first, last, gaps, tokens = None, None, [], 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        reply.raise_for_status()
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
                if first is None:
                    first = now
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

        done = asyncio.Event()

        async def long_prompts() -> None:
            k = 0
            while not done.is_set():  # one long prefill after another while the clients stream
                words = " ".join(TOPICS[(k + i) % len(TOPICS)].split()[-1] for i in range(long_prompt_tokens))
                body = {"model": model, "messages": [{"role": "user", "content": f"{k}: {words}"}], "max_tokens": 1, "stream": True}
                await one_request(http, body)
                k += 1

        async def clients() -> None:
            await asyncio.gather(*(client(c) for c in range(scenario.clients)))
            done.set()

        await asyncio.gather(clients(), *([long_prompts()] if long_prompt_tokens else []))
        scenario.wall = time.perf_counter() - start
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


def start_server(args: argparse.Namespace, policy: str = "off") -> subprocess.Popen:
    command = [sys.executable, "-m", "engine", "serve", "--port", str(args.port), "--dtype", args.dtype, "--num-threads", str(args.threads),
               "--max-running-requests", str(max(args.clients) + 8), "--log-level", "warning", "--no-access-log"]  # fmt: skip
    if policy != "off":
        command += ["--decode-prefill-budget", policy]
    if args.model:
        command += ["--model", args.model]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(command, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{args.port}"
    for _ in range(1200):
        if proc.poll() is not None:
            raise SystemExit(f"formcast serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    proc.terminate()
    raise SystemExit("formcast serve did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,8,32", help="comma-separated client counts")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--port", type=int, default=30123)
    parser.add_argument("--model", default=None)
    parser.add_argument("--long-prompt-tokens", type=int, default=0, metavar="N", help="one more client sending N-word prompts throughout")
    parser.add_argument("--policies", default="off", help="comma-separated --decode-prefill-budget values of the server ('off': none)")
    parser.add_argument("--scenarios", default="none,json", help="none (unconstrained), json (JSON schema), or both")
    args = parser.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    rows = []
    for policy in args.policies.split(","):
        rows += [row(s, policy) for s in run_policy(args, policy)]
    header = ["policy", "clients", "constraint", "requests", "req/s", "out tok/s", "TTFT p50 s", "TTFT p99 s", "ITL p50 ms", "ITL p99 ms",
              "loop CPU ms/req", "loop / server CPU", "loop CPU / latency"]  # fmt: skip
    print(f"\nformcast serve, {args.dtype}, {args.threads} torch thread(s), max_tokens {args.max_tokens}, {args.rounds} requests per client, "
          f"{os.cpu_count()} CPUs, long-prompt client: {args.long_prompt_tokens or 'none'} words\n")  # fmt: skip
    print(markdown_table(header, rows, align_right_from=3))


def run_policy(args: argparse.Namespace, policy: str) -> list[Scenario]:
    """Every scenario against one server started with ``policy``."""
    proc = start_server(args, policy)
    url = f"http://127.0.0.1:{args.port}"
    scenarios = []
    try:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        index = 0
        kinds = [k == "json" for k in args.scenarios.split(",")]
        for constrained in kinds:
            for clients in args.clients:
                scenario = Scenario(f"{clients}-{constrained}", clients, constrained)
                asyncio.run(run_scenario(url, model, scenario, args.rounds, args.max_tokens, index, args.long_prompt_tokens))
                index += 1 + clients * args.rounds
                scenarios.append(scenario)
                print(f"done: policy {policy}, {clients} clients, constrained={constrained}: {len(scenario.timings)} requests in {scenario.wall:.1f} s", file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    return scenarios


if __name__ == "__main__":
    main()
