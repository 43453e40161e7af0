"""``BatchPlanner``: which requests run in the next forward, and with how many tokens.

Every running request gets a row: a decoding request feeds its uncached tokens (one, or more
after jump-forward), a request still prefilling feeds its next chunk. Waiting requests are
admitted first come, first served while there are request slots, prefill budget
(``chunked_prefill_size`` tokens per forward; ``decode_prefill_budget`` while any request is
decoding, which bounds the inter-token latency of running streams; with that policy on, a prompt
being chunk-prefilled takes at most half a step's budget while requests wait, so a short request
does not queue behind a long prompt's whole prefill) and KV room (free plus evictable slots, keeping a
small reserve per running request for its next tokens); an admitted request starts from its
longest prefix in the radix cache. A request whose uncached prompt shares a long prefix with one
being prefilled right now waits a step, then reuses that prefill. Drafts (speculation) are
proposed for decoding rows. Then KV slots for every fed token: drafts are dropped first, unused
cache evicted next, and if still short the latest admitted requests are retracted (their KV goes
to the cache, they re-queue at the front and later resume with the same outputs).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from ..mem_cache.radix_cache import RadixCache
from ..model_executor.model_runner import ModelRunner
from .req import Req
from .schedule_batch import ScheduleBatch

if TYPE_CHECKING:
    from ..speculative.worker import SpeculativeWorker
    from .scheduler import SchedulerConfig

# KV slots kept free per running request for its coming tokens when admitting new ones.
DECODE_RESERVE = 16
# A waiting request sharing at least this many uncached leading tokens with a request being
# prefilled waits for that prefill to land in the radix cache.
SHARED_PREFIX_WAIT = 32


class BatchPlanner:
    def __init__(
        self,
        runner: ModelRunner,
        tree_cache: RadixCache,
        config: SchedulerConfig,
        spec: SpeculativeWorker | None,
        stats: dict[str, int],
    ) -> None:
        self.runner = runner
        self.tree_cache = tree_cache
        self.config = config
        self.spec = spec
        self.stats = stats  # the scheduler's counters: retractions, cached tokens
        self.max_running = min(config.max_running_requests, runner.req_to_token_pool.size)

    def next_batch(self, running: list[Req], waiting: deque[Req]) -> ScheduleBatch | None:
        """This step's rows (admitting from ``waiting`` into ``running``), KV allocated; None
        when there is nothing to run."""
        reqs, counts = [], []
        budget = self.config.chunked_prefill_size
        limit = self.config.decode_prefill_budget
        if limit is not None and any(req.kv_len >= len(req.origin_input_ids) for req in running):
            budget = min(budget, limit)  # decodes first: this step's prefill stays short
        # Under the latency policy a long prompt being prefilled leaves half of each step to the
        # waiting requests, so a short request behind it starts within a step, not after it.
        chunk_cap = max(1, budget // 2) if limit is not None and waiting else budget
        for req in running:
            uncached = req.seq_len - req.kv_len
            if uncached <= 0:  # cannot happen; finishing it beats waiting forever
                req.abort("internal error: nothing left to compute for this request")
                continue
            n = uncached if uncached <= 1 or req.kv_len >= len(req.origin_input_ids) else min(uncached, budget, chunk_cap)
            if n <= 0:
                continue
            if uncached > 1 and req.kv_len < len(req.origin_input_ids):
                budget -= n
            reqs.append(req)
            counts.append(n)
        self._admit(running, waiting, reqs, counts, budget)
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
            victim = self._retract_one(running, waiting)
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

    def _admit(self, running: list[Req], waiting: deque[Req], reqs: list[Req], counts: list[int], budget: int) -> None:
        pool = self.runner.token_to_kv_pool
        prefilling = [r for r, n in zip(reqs, counts) if n > 1 and r.kv_len < len(r.origin_input_ids)]
        reserve = sum(min(r.remaining_tokens, DECODE_RESERVE) for r in running)
        room = pool.available_size() + self.tree_cache.evictable_size() - sum(counts) - reserve
        deferred = []
        while waiting and budget > 0 and len(running) < self.max_running:
            req = waiting[0]
            if self._shares_prefill(req, prefilling):
                deferred.append(waiting.popleft())
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
            if n + min(req.remaining_tokens, DECODE_RESERVE) > room and running:
                self._unadmit(req)
                break
            waiting.popleft()
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            if req.retractions == 0:
                req.cached_tokens = req.kv_len
                self.stats["cached_tokens"] += req.kv_len
            room -= n + min(req.remaining_tokens, DECODE_RESERVE)
            budget -= n
            running.append(req)
            reqs.append(req)
            counts.append(n)
            prefilling.append(req)
        waiting.extendleft(reversed(deferred))

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

    def _retract_one(self, running: list[Req], waiting: deque[Req]) -> Req | None:
        """Move the latest admitted running request back to the waiting queue."""
        if len(running) <= 1:
            return None
        victim = running.pop()
        if self.spec is not None:
            self.spec.release(victim)
        self.tree_cache.cache_finished_req(victim)
        victim.retractions += 1
        self.stats["retractions"] += 1
        waiting.appendleft(victim)
        return victim
