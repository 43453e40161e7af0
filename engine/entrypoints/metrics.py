"""``/metrics``: the server's Prometheus metrics (text exposition format).

Each server has its own ``CollectorRegistry`` (several servers may live in one process, as in
the tests). Counters and histograms are updated by the serving code as requests run; the engine's
state is read when scraped:

* ``formcast_num_requests_running`` / ``_waiting``, ``formcast_kv_cache_usage_ratio`` (slots held
  by requests or the prefix cache over the pool) and the free / total slot counts;
* ``formcast_prompt_tokens_total``, ``formcast_generation_tokens_total``,
  ``formcast_cached_prompt_tokens_total``, ``formcast_requests_total{endpoint, finish_reason}``
  and ``formcast_request_errors_total{status}``;
* histograms: ``formcast_time_to_first_token_seconds`` (from the request's arrival),
  ``formcast_inter_token_latency_seconds`` (per output token), ``formcast_e2e_request_latency_seconds``
  and ``formcast_grammar_compile_seconds`` (each real compile; cache hits do not compile);
* ``formcast_grammar_cache_hits_total`` / ``formcast_grammar_compiles_total``: per constrained
  request, whether its constraint was already compiled; ``formcast_grammar_refused_total``: those
  answered 400 (counted by the server, whose check is each request's first lookup: the scheduler's
  own lookup that follows is always a hit and is not counted);
* ``formcast_server_loop_cpu_seconds_total``: CPU time of the thread that runs the event loop,
  i.e. everything the server does outside the engine's threads (HTTP, pydantic, JSON, SSE,
  chat templates and tokenization); beside ``process_cpu_seconds_total`` (the whole process, from
  prometheus-client's process collector), it gives the share of the server's CPU spent outside the
  engine, which ``bench/serve_bench.py`` reports.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class ServerMetrics:
    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter("formcast_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("formcast_generation_tokens", "Output tokens of finished requests", registry=r)
        self.cached_tokens = Counter("formcast_cached_prompt_tokens", "Prompt tokens reused from the prefix cache", registry=r)
        self.requests = Counter("formcast_requests", "Finished requests (one per choice)", ["endpoint", "finish_reason"], registry=r)
        self.errors = Counter("formcast_request_errors", "Requests answered with an error", ["status"], registry=r)
        self.ttft = Histogram("formcast_time_to_first_token_seconds", "Request arrival to its first output token", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("formcast_inter_token_latency_seconds", "Time between output tokens", buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("formcast_e2e_request_latency_seconds", "Request arrival to its last token", buckets=_E2E_BUCKETS, registry=r)
        self.grammar_hits = Counter("formcast_grammar_cache_hits", "Constrained requests whose grammar was already compiled", registry=r)
        self.grammar_compiles = Counter("formcast_grammar_compiles", "Constrained requests that compiled their grammar", registry=r)
        self.grammar_refused = Counter("formcast_grammar_refused", "Constrained requests refused with 400 by the compiler", registry=r)
        self.compile_time = Histogram("formcast_grammar_compile_seconds", "Grammar compile time (cache misses)", buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_EngineCollector(engine))
        ProcessCollector(registry=r)
        engine.grammar_backend.compile_observers.append(lambda kind, seconds: self.compile_time.observe(seconds))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """Values read from the engine (and the loop thread's CPU clock) at scrape time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        load = self.engine.get_load()
        total = max(1, load["kv_total"])
        yield GaugeMetricFamily("formcast_num_requests_running", "Requests in the running batch", value=load["running"])
        yield GaugeMetricFamily("formcast_num_requests_waiting", "Requests queued (or compiling their grammar)", value=load["waiting"])
        yield GaugeMetricFamily("formcast_kv_cache_usage_ratio", "KV slots not free (requests + prefix cache) / pool", value=(total - load["kv_free"]) / total)
        yield GaugeMetricFamily("formcast_kv_cache_free_tokens", "Free KV slots", value=load["kv_free"])
        yield GaugeMetricFamily("formcast_kv_cache_total_tokens", "KV slots in the pool", value=load["kv_total"])
        # Scraped from the loop thread (the /metrics route is async), so this is that thread's clock.
        yield CounterMetricFamily("formcast_server_loop_cpu_seconds", "CPU time of the server's event-loop thread", value=time.thread_time())
