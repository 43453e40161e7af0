"""``Scheduler``: continuous batching in its own thread.

Each iteration (``step``):
1. take new requests and aborts from the inbox; requests with a constraint wait (without holding
   anything) until the grammar backend has compiled it; a refused constraint finishes its request
   with ``abort`` and the compiler's message;
2. every running request gets a row: decode rows feed their uncached tokens (one, or more after
   jump-forward), a request still prefilling feeds its next chunk;
3. waiting requests are admitted first come, first served while there are request slots, prefill
   budget (``chunked_prefill_size`` tokens per forward) and KV room (free + evictable, with a
   small reserve per running request for its next tokens); an admitted request starts from its
   longest prefix in the radix cache. A request whose uncached prompt shares a long prefix with
   one being prefilled right now waits one step, then reuses that prefill;
4. KV slots for all fed tokens: evict unused cache, and if still short retract running requests
   (latest admitted first: their KV goes to the cache, they re-queue at the front and resume
   later with the same outputs);
5. one forward for all rows (prefill and decode mixed), the grammar bitmask filled by a worker
   thread *while the forward runs* (the tokens it depends on were sampled last step), sampling,
   then ``OutputProcessor`` and the outputs of this step go to ``sink``.

Nothing here raises for one bad request: a failure becomes that request's ``abort``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from grammar import GrammarError, GrammarMatcher, TokenVocabulary

from ..constrained.grammar_backend import GrammarBackend
from ..mem_cache.radix_cache import RadixCache
from ..model_executor.model_runner import ModelRunner
from ..sampling.sampling_batch_info import make_generator
from ..speculative.worker import SpeculativeConfig, SpeculativeWorker, build_drafter
from .detokenizer import TokenTexts
from .io_struct import BatchTokenIDOutput
from .output_processor import OutputProcessor
from .req import Req
from .schedule_batch import RowResult, ScheduleBatch

log = logging.getLogger("formcast.scheduler")

# KV slots kept free per running request for its coming tokens when admitting new ones.
DECODE_RESERVE = 16
# A waiting request sharing at least this many uncached leading tokens with a request being
# prefilled waits for that prefill to land in the radix cache.
SHARED_PREFIX_WAIT = 32


@dataclass
class SchedulerConfig:
    max_running_requests: int = 64
    chunked_prefill_size: int = 512
    enable_prefix_cache: bool = True
    enable_jump_forward: bool = True
    reasoning_end: str | None = None
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Any,
        vocab: TokenVocabulary,
        grammar_backend: GrammarBackend,
        config: SchedulerConfig,
        sink: Callable[[BatchTokenIDOutput], None],
    ) -> None:
        self.runner = runner
        self.vocab = vocab
        self.grammar_backend = grammar_backend
        self.config = config
        self.sink = sink
        self.texts = TokenTexts(vocab, tokenizer)
        self.outputs = OutputProcessor(
            tokenizer, self.texts, enable_jump_forward=config.enable_jump_forward, reasoning_end=config.reasoning_end
        )
        self.spec: SpeculativeWorker | None = None
        if config.speculative.enabled:
            drafter = build_drafter(config.speculative, runner, tokenizer, self.texts, vocab.vocab_size, frozenset(vocab.eos_token_ids))
            self.spec = SpeculativeWorker(drafter, runner.sampler, config.speculative)
        self.tree_cache = RadixCache(runner.req_to_token_pool, runner.token_to_kv_pool, disabled=not config.enable_prefix_cache)
        self.max_running = min(config.max_running_requests, runner.req_to_token_pool.size)
        self.eos_ids = frozenset(vocab.eos_token_ids)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.grammar_wait: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self._mask_pool = ThreadPoolExecutor(1, thread_name_prefix="formcast-mask")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = {"forwards": 0, "prefill_tokens": 0, "cached_tokens": 0, "retractions": 0, "finished": 0}
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
        req.decode = self.texts.text
        req.generator = make_generator(req.sampling_params, self.runner.device)
        future = self.grammar_backend.submit(req.sampling_params)
        if future is None:
            self.waiting.append(req)
        else:
            req.grammar_future = future
            self.grammar_wait.append(req)

    def _abort(self, rid: str, message: str) -> None:
        for group in (self.waiting, self.grammar_wait):
            for req in list(group):
                if req.rid == rid:
                    group.remove(req)
                    self._finish_unscheduled(req, message)
        for req in self.running:
            if req.rid == rid:
                req.abort(message)

    def _finish_unscheduled(self, req: Req, message: str) -> None:
        req.abort(message)
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
        batch = self._next_batch()
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
            try:
                req.grammar = GrammarMatcher(future.result())
            except GrammarError as exc:
                self._finish_unscheduled(req, str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - a compiler bug aborts this request only
                log.exception("grammar compilation crashed")
                self._finish_unscheduled(req, f"internal error compiling the constraint: {exc!r}")
                continue
            req.reasoning_done = self.config.reasoning_end is None
            self.waiting.append(req)
        self.grammar_wait = still

    # ------------------------------------------------------------------ batch formation
    def _next_batch(self) -> ScheduleBatch | None:
        reqs, counts = [], []
        budget = self.config.chunked_prefill_size
        for req in self.running:
            uncached = req.seq_len - req.kv_len
            if uncached <= 0:  # cannot happen; finishing it beats waiting forever
                req.abort("internal error: nothing left to compute for this request")
                continue
            n = uncached if uncached <= 1 or req.kv_len >= len(req.origin_input_ids) else min(uncached, budget)
            if n <= 0:
                continue
            if uncached > 1 and req.kv_len < len(req.origin_input_ids):
                budget -= n
            reqs.append(req)
            counts.append(n)
        self._admit(reqs, counts, budget)
        if not reqs:
            return None
        batch = ScheduleBatch(reqs, counts)
        if self.spec is not None:
            self._draft(batch)
        while not batch.allocate(self.runner.token_to_kv_pool):
            if batch.has_drafts:  # drafts are optional: drop them before evicting anything
                batch.drop_drafts()
                continue
            need = batch.total_tokens - self.runner.token_to_kv_pool.available_size()
            if self.tree_cache.evict(need) >= need:
                continue
            victim = self._retract_one(batch)
            if victim is None:  # one request alone outgrew the pool
                for req in batch.reqs:
                    req.abort(f"out of KV cache memory: the pool holds {self.runner.token_to_kv_pool.size} tokens")
                return None
            i = batch.reqs.index(victim) if victim in batch.reqs else -1
            if i >= 0:
                del batch.reqs[i], batch.num_tokens[i]
            if not batch.reqs:
                return None
            batch = ScheduleBatch(batch.reqs, batch.num_tokens)
        return batch

    def _draft(self, batch: ScheduleBatch) -> None:
        """Drafts for the rows that decode (their prompt is cached; they sample this step)."""
        assert self.spec is not None
        rows = [r for r in batch.sampling_rows if batch.reqs[r].kv_len >= len(batch.reqs[r].origin_input_ids)]
        if not rows:
            return
        proposals = self.spec.plan([batch.reqs[r] for r in rows])
        for r, draft in zip(rows, proposals):
            batch.drafts[r] = draft

    def _admit(self, reqs: list[Req], counts: list[int], budget: int) -> None:
        pool = self.runner.token_to_kv_pool
        prefilling = [r for r, n in zip(reqs, counts) if n > 1 and r.kv_len < len(r.origin_input_ids)]
        reserve = sum(min(r.remaining_tokens, DECODE_RESERVE) for r in self.running)
        room = pool.available_size() + self.tree_cache.evictable_size() - sum(counts) - reserve
        deferred = []
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            req = self.waiting[0]
            if self._shares_prefill(req, prefilling):
                deferred.append(self.waiting.popleft())
                continue
            slot = self.runner.req_to_token_pool.alloc()
            assert slot is not None
            req.req_pool_idx = slot[0]
            if req.return_logprob and len(req.input_token_logprobs) < len(req.origin_input_ids):
                self.tree_cache.inc_lock_ref(self.tree_cache.root)
                req.last_node, req.kv_len = self.tree_cache.root, 0
            else:
                self.tree_cache.attach_prefix(req)
            n = min(req.seq_len - req.kv_len, budget)
            if n + min(req.remaining_tokens, DECODE_RESERVE) > room and self.running:
                self._unadmit(req)
                break
            self.waiting.popleft()
            if req.retractions == 0:
                req.cached_tokens = req.kv_len
                self.stats["cached_tokens"] += req.kv_len
            room -= n + min(req.remaining_tokens, DECODE_RESERVE)
            budget -= n
            self.running.append(req)
            reqs.append(req)
            counts.append(n)
            prefilling.append(req)
        self.waiting.extendleft(reversed(deferred))

    def _shares_prefill(self, req: Req, prefilling: list[Req]) -> bool:
        if not self.config.enable_prefix_cache or not prefilling:
            return False
        ids = req.fill_ids
        for other in prefilling:
            theirs = other.fill_ids
            n = 0
            limit = min(len(ids), len(theirs)) - 1
            while n < limit and ids[n] == theirs[n]:
                n += 1
            if n >= SHARED_PREFIX_WAIT:
                return True
        return False

    def _unadmit(self, req: Req) -> None:
        assert req.last_node is not None and req.req_pool_idx is not None
        self.tree_cache.dec_lock_ref(req.last_node)
        self.runner.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.last_node, req.kv_len = None, None, 0

    def _retract_one(self, batch: ScheduleBatch) -> Req | None:
        """Move the latest admitted running request back to the waiting queue."""
        if len(self.running) <= 1:
            return None
        victim = self.running.pop()
        if self.spec is not None:
            self.spec.release(victim)
        self.tree_cache.cache_finished_req(victim)
        victim.retractions += 1
        self.stats["retractions"] += 1
        self.waiting.appendleft(victim)
        return victim

    # ------------------------------------------------------------------ running
    def _run_batch(self, batch: ScheduleBatch) -> None:
        runner, timing = self.runner, self.timing
        t0 = time.perf_counter()
        forward = batch.to_forward_batch(runner.req_to_token_pool, runner.token_to_kv_pool, self.vocab.vocab_size, self.eos_ids)
        info = batch.sampling_info
        fill = None
        if info is not None and info.vocab_mask is not None:
            fill = self._mask_pool.submit(self._fill_masks, batch, info)
        t1 = time.perf_counter()
        logits = runner.forward(forward)
        t2 = time.perf_counter()
        mask_errors, advanced = fill.result() if fill is not None else ({}, {})
        t3 = time.perf_counter()
        results: list[RowResult] = []
        if info is not None:
            rows = batch.sampling_logit_rows()
            scored = logits.next_token_logits
            if len(rows) != scored.shape[0]:
                scored = scored.index_select(0, torch.tensor(rows, dtype=torch.int64, device=scored.device))
            if batch.has_drafts:
                assert self.spec is not None
                results = self.spec.verify(batch, scored, info, advanced)
                for i, error in mask_errors.items():
                    results[i].error = error
            else:
                sampled = runner.sampler.sample(scored, info)
                results = self.outputs.results_from_sampler(batch, sampled, mask_errors)
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

    @staticmethod
    def _fill_masks(batch: ScheduleBatch, info: Any) -> tuple[dict[int, str], dict[int, int]]:
        """Each constrained virtual row's allowed tokens; runs beside the forward. A row with
        drafts fills one mask per position, pushing its drafts into the matcher as it goes
        (``advanced``: how many; the output step rolls back the rejected ones). Errors per row."""
        bitmask = info.vocab_mask_numpy()
        errors: dict[int, str] = {}
        advanced: dict[int, int] = {}
        v = 0
        for i, row in enumerate(batch.sampling_rows):
            req, drafts = batch.reqs[row], batch.drafts[row].tokens
            if not info.grammar_rows[v]:
                v += len(drafts) + 1
                continue
            done = 0
            try:
                for j in range(len(drafts) + 1):
                    req.grammar.fill_next_token_bitmask(bitmask, v + j, remaining_tokens=max(1, req.remaining_tokens - j))
                    if j < len(drafts):
                        if not req.grammar.accept_token(drafts[j]):
                            break
                        done += 1
            except GrammarError as exc:
                errors[i] = str(exc)
                bitmask[v : v + len(drafts) + 1] = -1
            advanced[i] = done
            v += len(drafts) + 1
        return errors, advanced

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
