"""``Scheduler``: continuous batching in its own thread.

Each iteration (``step``):
1. take new requests, aborts and calls from the inbox; a request with a constraint waits
   (holding nothing) until the grammar backend has compiled it; a refused constraint finishes
   its request with ``abort`` and the compiler's message;
2. ``BatchPlanner`` picks this step's rows (running requests, newly admitted ones, chunked
   prefills, speculative drafts) and allocates their KV slots, retracting if it must;
3. one forward for all rows (prefill and decode mixed) while a worker thread fills the grammar
   bitmask rows (``constrained.bitmask_filler``); then sampling, or verification of drafts;
4. ``OutputProcessor`` applies the tokens (grammar, finish reasons, jump-forward), this step's
   outputs go to ``sink``, and finished requests hand their KV to the radix cache.

Nothing here raises for one bad request: a failure becomes that request's ``abort``; a bug in a
step aborts the requests in flight and the loop goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from grammar import GrammarError, GrammarMatcher, TokenVocabulary

from ..constrained.bitmask_filler import fill_grammar_masks
from ..constrained.grammar_backend import GrammarBackend
from ..constrained.output_budget import check_output_budget
from ..constrained.reasoning import prompt_closes_reasoning
from ..mem_cache.radix_cache import RadixCache
from ..model_executor.model_runner import ModelRunner
from ..sampling.sampling_batch_info import make_generator
from ..sampling_params import InvalidSamplingParams
from .detokenizer import TokenTexts
from .io_struct import BatchTokenIDOutput
from .output_processor import OutputProcessor
from .req import Req
from .batch_planner import BatchPlanner
from .schedule_batch import RowResult, ScheduleBatch

if TYPE_CHECKING:
    from ..speculative.worker import SpeculativeWorker

log = logging.getLogger("formcast.scheduler")


@dataclass
class SchedulerConfig:
    max_running_requests: int = 64
    chunked_prefill_size: int = 512
    decode_prefill_budget: int | None = None  # prompt tokens per forward while requests decode
    enable_prefix_cache: bool = True
    enable_jump_forward: bool = True
    reasoning_end: str | None = None


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Any,
        vocab: TokenVocabulary,
        grammar_backend: GrammarBackend,
        config: SchedulerConfig,
        sink: Callable[[BatchTokenIDOutput], None],
        speculative: SpeculativeWorker | None = None,
    ) -> None:
        """``speculative``: the drafter and verifier (``speculative.worker.build_worker``), or
        None to decode one token per step."""
        self.runner = runner
        self.vocab = vocab
        self.grammar_backend = grammar_backend
        self.config = config
        self.sink = sink
        self.texts = TokenTexts(vocab, tokenizer)
        self.outputs = OutputProcessor(
            tokenizer, self.texts, enable_jump_forward=config.enable_jump_forward, reasoning_end=config.reasoning_end
        )
        self.spec = speculative
        self.tree_cache = RadixCache(runner.req_to_token_pool, runner.token_to_kv_pool, disabled=not config.enable_prefix_cache)
        self.eos_ids = frozenset(vocab.eos_token_ids)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.grammar_wait: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self._mask_pool = ThreadPoolExecutor(1, thread_name_prefix="formcast-mask")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = {"forwards": 0, "prefill_tokens": 0, "cached_tokens": 0, "retractions": 0, "finished": 0}
        self.planner = BatchPlanner(runner, self.tree_cache, config, self.spec, self.stats)
        # Seconds spent per phase of a step (the benchmarks read them).
        self.timing = {"schedule": 0.0, "forward": 0.0, "mask_wait": 0.0, "sample": 0.0, "process": 0.0}

    # ------------------------------------------------------------------ thread / inbox
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="formcast-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; requests still pending finish with ``abort``."""
        self._stop.set()
        self.inbox.put(None)
        if self._thread is not None:
            self._thread.join()
        self._drain_inbox()
        self._abort_all("the engine was shut down")
        self._mask_pool.shutdown(wait=True)

    def submit(self, req: Req) -> None:
        self.inbox.put(("req", req))

    def abort(self, rid: str, message: str = "aborted by the caller") -> None:
        self.inbox.put(("abort", rid, message))

    def _run(self) -> None:
        self.runner.bind_threads()
        while not self._stop.is_set():
            try:
                if not self.step():
                    self._wait_for_work()
            except Exception:  # a bug must not kill the engine silently: fail every request
                log.exception("scheduler step failed")
                self._abort_all("internal error in the scheduler (see the server log)")

    def _wait_for_work(self) -> None:
        timeout = 0.005 if self.grammar_wait else None
        try:
            item = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return
        self._handle(item)

    def _drain_inbox(self) -> None:
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(item)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the scheduler thread between steps and return its result (blocks)."""
        from concurrent.futures import Future

        future: Future = Future()
        self.inbox.put(("call", fn, future))
        return future.result()

    def _handle(self, item: Any) -> None:
        if item is None:
            return
        if item[0] == "req":
            self._add(item[1])
        elif item[0] == "abort":
            self._abort(item[1], item[2])
        else:
            _, fn, future = item
            try:
                future.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

    def _add(self, req: Req) -> None:
        req.arrival_time = time.monotonic()
        req.decode = self.texts.text
        req.generator = make_generator(req.sampling_params, self.runner.device)
        future = self.grammar_backend.submit(req.sampling_params)
        if future is None:
            req.grammar_ready_time = time.monotonic()
            # Unconstrained: the reasoning is only watched when it has a budget to enforce.
            if req.sampling_params.max_reasoning_tokens is not None:
                req.reasoning_done = self._reasoning_closed_in_prompt(req)
            self.outputs.jump_forward_at_admission(req)
            self.waiting.append(req)
        else:
            req.grammar_future = future
            # When the compile ends (on the compiling thread; at once if it already has): note
            # the time and wake an idle scheduler, which would otherwise notice at its next
            # 5 ms poll.
            future.add_done_callback(lambda _: self._grammar_ready(req))
            self.grammar_wait.append(req)

    def _grammar_ready(self, req: Req) -> None:
        _mark_grammar_ready(req)
        self.inbox.put(None)

    def _abort(self, rid: str, message: str) -> None:
        for group in (self.waiting, self.grammar_wait):
            for req in list(group):
                if req.rid == rid:
                    group.remove(req)
                    self._finish_unscheduled(req, message)
        for req in self.running:
            if req.rid == rid:
                req.abort(message)

    def _finish_unscheduled(self, req: Req, message: str, field: str | None = None) -> None:
        req.abort(message, field)
        req.check_finished()
        self.stats["finished"] += 1
        self.sink(OutputProcessor.step_outputs([req]))

    def _abort_all(self, message: str) -> None:
        for req in list(self.waiting) + self.grammar_wait:
            self._finish_unscheduled(req, message)
        self.waiting.clear()
        self.grammar_wait.clear()
        for req in self.running:
            req.abort(message)
        self._release_finished()

    # ------------------------------------------------------------------ one iteration
    @torch.inference_mode()
    def step(self) -> bool:
        """One scheduling iteration; False when there was nothing to run."""
        self._drain_inbox()
        self._poll_grammars()
        self._release_finished()  # aborted while running
        start = time.perf_counter()
        batch = self.planner.next_batch(self.running, self.waiting)
        self.timing["schedule"] += time.perf_counter() - start
        if batch is None:
            return False
        self._run_batch(batch)
        self._release_finished()
        return True

    def _poll_grammars(self) -> None:
        still = []
        for req in self.grammar_wait:
            future = req.grammar_future
            assert future is not None
            if not future.done():
                still.append(req)
                continue
            req.grammar_future = None
            _mark_grammar_ready(req)  # a future runs its callbacks just after it reports done
            try:
                compiled = future.result()
                # The count was taken at compile time; reading it here touches nothing shared.
                check_output_budget(compiled, req.sampling_params)
                req.grammar = GrammarMatcher(compiled)
            except (GrammarError, InvalidSamplingParams) as exc:  # refused, or no output fits the budget
                self._finish_unscheduled(req, str(exc), getattr(exc, "field", None))
                continue
            except Exception as exc:  # noqa: BLE001 - a compiler bug aborts this request only
                log.exception("grammar compilation crashed")
                self._finish_unscheduled(req, f"internal error compiling the constraint: {exc!r}")
                continue
            req.reasoning_done = self._reasoning_closed_in_prompt(req)
            self.outputs.jump_forward_at_admission(req)
            self.waiting.append(req)
        self.grammar_wait = still

    def _reasoning_closed_in_prompt(self, req: Req) -> bool:
        """No reasoning to wait for: none configured, or the template closed the think block."""
        end = self.config.reasoning_end
        return end is None or prompt_closes_reasoning(self.texts.text(req.origin_input_ids[-64:], skip_special_tokens=False), end)

    # ------------------------------------------------------------------ running
    def _run_batch(self, batch: ScheduleBatch) -> None:
        runner, timing = self.runner, self.timing
        t0 = time.perf_counter()
        forward = batch.to_forward_batch(runner.req_to_token_pool, runner.token_to_kv_pool, self.vocab.vocab_size, self.eos_ids)
        info = forward.sampling_info
        fill = None
        if info is not None and info.vocab_mask is not None:
            fill = self._mask_pool.submit(fill_grammar_masks, batch, forward)
        t1 = time.perf_counter()
        logits = runner.forward(forward)
        t2 = time.perf_counter()
        mask_errors, advanced = fill.result() if fill is not None else ({}, {})
        t3 = time.perf_counter()
        results: list[RowResult] = []
        if info is not None:
            if batch.has_drafts:
                assert self.spec is not None
                results = self.spec.verify(batch, runner.sampling_logits(logits, forward), forward, advanced)
                for i, error in mask_errors.items():
                    results[i].error = error
            else:
                results = self.outputs.results_from_sampler(batch, runner.sample(logits, forward), mask_errors)
        t4 = time.perf_counter()
        self.stats["forwards"] += 1
        self.stats["prefill_tokens"] += sum(n for r, n in zip(batch.reqs, batch.num_tokens) if n > 1)
        self.outputs.process(batch, logits, results, advanced, runner.token_to_kv_pool)
        timing["schedule"] += t1 - t0
        timing["forward"] += t2 - t1
        timing["mask_wait"] += t3 - t2
        timing["sample"] += t4 - t3
        timing["process"] += time.perf_counter() - t4
        for req, n in zip(batch.reqs, batch.num_tokens):
            if n > 1 and not req.finished and req.kv_len - n < len(req.origin_input_ids):
                self.tree_cache.cache_unfinished_req(req)  # a prompt (chunk) others may share
        out = self.outputs.step_outputs(batch.reqs)
        if out.outputs:
            self.sink(out)

    def _release_finished(self) -> None:
        done = [r for r in self.running if r.finished or r.to_abort is not None]
        if not done:
            return
        for req in done:
            if not req.finished:
                req.check_finished()
            if not req.reported:
                self.sink(OutputProcessor.step_outputs([req]))
            if self.spec is not None:
                self.spec.release(req)
            self.tree_cache.cache_finished_req(req)
            self.stats["finished"] += 1
        self.running = [r for r in self.running if r.req_pool_idx is not None]

    # ------------------------------------------------------------------ introspection
    def load(self) -> dict[str, int]:
        pool = self.runner.token_to_kv_pool
        return {
            "running": len(self.running),
            "waiting": len(self.waiting) + len(self.grammar_wait) + self.inbox.qsize(),
            "kv_free": pool.available_size(),
            "kv_cached": self.tree_cache.evictable_size() + self.tree_cache.protected_size(),
            "kv_total": pool.size,
        }


def _mark_grammar_ready(req: Req) -> None:
    if req.grammar_ready_time is None:
        req.grammar_ready_time = time.monotonic()
