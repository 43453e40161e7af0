"""The latency policy (``decode_prefill_budget``): while a request decodes, no forward takes more
prompt tokens than the budget, so a long prompt arriving cannot stall a running stream for a whole
prefill chunk; and a short request arriving behind a long prompt's chunked prefill starts before
that prefill ends. Observed on the real SmolLM2 engine by recording the planner's batches."""

from __future__ import annotations

import threading

import pytest

from engine import Engine
from engine.managers.batch_planner import BatchPlanner


def _largest_prefill_beside_a_decode(monkeypatch, **options) -> int:
    seen: list[int] = []
    plan = BatchPlanner.next_batch

    def recording(self, running, waiting):
        batch = plan(self, running, waiting)
        if batch is not None:
            prompt = [n for r, n in zip(batch.reqs, batch.num_tokens) if r.kv_len < len(r.origin_input_ids)]
            decoding = any(r.kv_len >= len(r.origin_input_ids) for r in batch.reqs)
            if decoding and prompt:
                seen.append(sum(prompt))
        return batch

    monkeypatch.setattr(BatchPlanner, "next_batch", recording)
    with Engine(dtype="float32", max_total_tokens=2000, num_threads=1, chunked_prefill_size=256, **options) as eng:
        started = threading.Event()

        def stream() -> None:
            for _ in eng.generate("Count from one to fifty.", {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}, stream=True):
                started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(300)
        eng.generate(" ".join(["word"] * 500), {"max_new_tokens": 1, "temperature": 0})
        t.join(300)
    monkeypatch.undo()
    return max(seen, default=0)


@pytest.mark.slow
def test_prefill_beside_a_decode_stays_within_the_budget(monkeypatch):
    assert _largest_prefill_beside_a_decode(monkeypatch) > 32  # without the policy: whole chunks
    assert 0 < _largest_prefill_beside_a_decode(monkeypatch, decode_prefill_budget=32) <= 32


def _short_request_starts_during_the_long_prefill(monkeypatch, **options) -> bool:
    """Whether a short request sent while a 600-word prompt is being prefilled in chunks gets its
    first forward before that prefill is over."""
    events: list[str] = []
    plan = BatchPlanner.next_batch
    long_started = threading.Event()

    def recording(self, running, waiting):
        batch = plan(self, running, waiting)
        if batch is not None:
            for r, n in zip(batch.reqs, batch.num_tokens):
                if r.kv_len < len(r.origin_input_ids):
                    kind = "long" if len(r.origin_input_ids) > 300 else "short"
                    events.append(kind if kind == "short" or r.kv_len + n < len(r.origin_input_ids) else "long-done")
                    if kind == "long":
                        long_started.set()
        return batch

    monkeypatch.setattr(BatchPlanner, "next_batch", recording)
    with Engine(dtype="float32", max_total_tokens=2000, num_threads=1, chunked_prefill_size=64, **options) as eng:
        t = threading.Thread(target=eng.generate, args=(" ".join(["word"] * 600), {"max_new_tokens": 1, "temperature": 0}))
        t.start()
        assert long_started.wait(300)
        eng.generate("Hi", {"max_new_tokens": 1, "temperature": 0})
        t.join(300)
    monkeypatch.undo()
    assert "short" in events and "long-done" in events, events
    return events.index("short") < events.index("long-done")


@pytest.mark.slow
def test_a_short_request_does_not_wait_out_a_long_prefill(monkeypatch):
    assert not _short_request_starts_during_the_long_prefill(monkeypatch)  # first come, first served
    assert _short_request_starts_during_the_long_prefill(monkeypatch, decode_prefill_budget=32)
