"""The Engine end to end with the embedded SmolLM2: batching invariance, finish reasons, stop
strings, streaming, abort, bad input, logprobs. The constrained batch tests live in
``test_engine_constrained.py``."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine import Engine, SamplingParams
from engine.entrypoints.engine import PromptError
from engine.managers.io_struct import RequestTimings
from engine.managers.req import Req
from engine.sampling_params import InvalidSamplingParams

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0}
TOPICS = ["the sea", "a robot", "prime numbers", "Paris", "coffee", "the moon", "a violin", "winter",
          "bees", "chess", "volcanoes", "a lighthouse", "rivers", "bread", "trains", "clouds"]  # fmt: skip


@pytest.fixture(scope="module")
def engine():
    # A 2,048-token context (the model's is 8,192): test_every_finish_reason fills it to 3 tokens
    # short of the end, and a prefill of the full context took most of a minute of the suite.
    with Engine(dtype="float32", max_total_tokens=12_000, max_running_requests=24, num_threads=1, context_length=2048) as eng:
        yield eng


def _prompts(engine: Engine, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        words = " ".join(["Please"] * (i % 5))  # mixed lengths
        out.append(engine.apply_chat_template([{"role": "user", "content": f"{words} Write a sentence about {TOPICS[i % 16]}."}]))
    return out


def _free_slots(engine: Engine) -> int:
    """KV slots not held by a request (free or in the evictable cache), read between steps."""
    sched = engine.scheduler
    return sched.call(lambda: engine.runner.token_to_kv_pool.available_size() + sched.tree_cache.evictable_size())


def _wait_idle(engine: Engine) -> None:
    for _ in range(200):
        if engine.scheduler.call(lambda: not engine.scheduler.running and not engine.scheduler.waiting):
            return
        time.sleep(0.02)
    raise AssertionError("engine did not go idle")


# ---------------------------------------------------------------------- batching invariance


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_batching_invariance(prefix_cache, engine):
    eng = engine if prefix_cache else Engine(dtype="float32", max_total_tokens=12_000, max_running_requests=24, num_threads=1, enable_prefix_cache=False)
    try:
        prompts = _prompts(eng, 16)
        params = [
            {**GREEDY, "max_new_tokens": 6 + (i % 4) * 4, **({"regex": r"(Yes|No), [a-z ]{1,20}\."} if i % 3 == 0 else {})}
            for i in range(16)
        ]
        together = eng.generate(input_ids=prompts, sampling_params=params)
        for i in (0, 1, 5, 9):
            alone = eng.generate(input_ids=prompts[i], sampling_params=params[i])
            assert alone["output_ids"] == together[i]["output_ids"], i
            assert alone["text"] == together[i]["text"]
    finally:
        if not prefix_cache:
            eng.shutdown()


def test_retraction_keeps_outputs(engine):
    prompts = _prompts(engine, 8)
    params = {**GREEDY, "max_new_tokens": 48, "ignore_eos": True}
    reference = engine.generate(input_ids=prompts, sampling_params=params)
    # 8 x (~40 prompt + 48 output) tokens do not fit in 300 slots at once: requests are retracted.
    with Engine(dtype="float32", max_total_tokens=300, max_running_requests=8, num_threads=1) as small:
        got = small.generate(input_ids=prompts, sampling_params=params)
        assert small.scheduler.stats["retractions"] > 0
        assert [g["output_ids"] for g in got] == [r["output_ids"] for r in reference]
        _wait_idle(small)
        small.flush_cache()
        assert small.runner.token_to_kv_pool.available_size() == 300


def test_prefix_cache_reuses_a_shared_prompt(engine):
    doc = "Formcast is an engine. " * 30
    first = engine.generate(f"{doc} Question: what is formcast?", {**GREEDY, "max_new_tokens": 4})
    second = engine.generate(f"{doc} Question: who wrote it?", {**GREEDY, "max_new_tokens": 4})
    assert first["meta_info"]["cached_tokens"] == 0 or first["meta_info"]["cached_tokens"] < 10
    assert second["meta_info"]["cached_tokens"] >= 150


def test_chunked_prefill_matches_one_pass(engine):
    prompt = engine.apply_chat_template([{"role": "user", "content": "Summarize: " + "the quick brown fox jumps. " * 120}])
    assert len(prompt) > 600
    with Engine(dtype="float32", max_total_tokens=4000, chunked_prefill_size=128, num_threads=1, enable_prefix_cache=False) as chunky:
        chunked = chunky.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 8})
    whole = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 8})
    assert chunked["output_ids"] == whole["output_ids"]


# ---------------------------------------------------------------------- finish reasons


def test_every_finish_reason(engine):
    chat = engine.apply_chat_template([{"role": "user", "content": "Say hello."}])
    length = engine.generate(input_ids=chat, sampling_params={**GREEDY, "max_new_tokens": 3})
    assert length["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert length["meta_info"]["completion_tokens"] == 3
    eos = engine.generate(input_ids=chat, sampling_params={**GREEDY, "max_new_tokens": 64})
    assert eos["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    first = eos["output_ids"][0]
    stop_id = engine.generate(input_ids=chat, sampling_params={**GREEDY, "max_new_tokens": 64, "stop_token_ids": [first]})
    assert stop_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": first} and stop_id["output_ids"] == [first]
    word = eos["text"].split()[1]
    stop_str = engine.generate(input_ids=chat, sampling_params={**GREEDY, "max_new_tokens": 64, "stop": [word]})
    assert stop_str["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert stop_str["text"] == eos["text"][: eos["text"].index(word)]
    grammar_end = engine.generate(input_ids=chat, sampling_params={**GREEDY, "max_new_tokens": 64, "regex": "Hi"})
    assert grammar_end["text"] == "Hi" and grammar_end["meta_info"]["finish_reason"]["type"] == "stop"
    refused = engine.generate(input_ids=chat, sampling_params={"max_new_tokens": 8, "regex": "(?<=x)"})
    assert refused["meta_info"]["finish_reason"]["type"] == "abort"
    assert "lookbehind" in refused["meta_info"]["finish_reason"]["message"]
    near_context = [chat[0]] * (engine.context_len - 3)
    ctx = engine.generate(input_ids=near_context, sampling_params={**GREEDY, "max_new_tokens": 50, "ignore_eos": True}) if engine.runner.max_total_tokens > engine.context_len else None
    if ctx is not None:
        assert ctx["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


def test_timing_spans_of_a_request_in_fixed_times():
    req = Req(rid="r", origin_input_ids=[1, 2], sampling_params=SamplingParams(), eos_token_ids=frozenset({0}), context_len=16)
    assert req.timings() == RequestTimings(None, None, None)
    req.arrival_time, req.grammar_ready_time = 10.0, 10.25
    assert req.timings() == RequestTimings(grammar_wait=0.25, queue_wait=None, prefill_latency=None)
    req.first_scheduled_time, req.first_token_time = 10.5, 11.5
    assert req.timings() == RequestTimings(grammar_wait=0.25, queue_wait=0.25, prefill_latency=1.0)


def test_the_last_output_says_where_the_time_to_the_first_token_went(engine):
    chat = engine.apply_chat_template([{"role": "user", "content": "Give me a number."}])
    spans = ("grammar_wait", "queue_wait", "prefill_latency")
    # A pattern no other test uses: its compile is part of this request's wait.
    out = engine.generate(input_ids=chat, sampling_params={**GREEDY, "max_new_tokens": 8, "regex": "[1-9][0-9]{0,2} apples?"})
    meta = out["meta_info"]
    assert all(isinstance(meta[k], float) and meta[k] >= 0 for k in spans), meta
    # Consecutive spans inside the request's life as the caller saw it.
    assert sum(meta[k] for k in spans) <= meta["e2e_latency"]
    chunks = list(engine.generate(input_ids=chat, sampling_params={**GREEDY, "max_new_tokens": 4}, stream=True))
    assert all(not set(spans) & set(c["meta_info"]) for c in chunks[:-1])
    assert all(isinstance(chunks[-1]["meta_info"][k], float) for k in spans)
    # Refused at compile: it waited for its grammar and never reached a batch.
    refused = engine.generate(input_ids=chat, sampling_params={"max_new_tokens": 8, "regex": "(?<=x)y"})["meta_info"]
    assert refused["finish_reason"]["type"] == "abort"
    assert isinstance(refused["grammar_wait"], float) and refused["queue_wait"] is None and refused["prefill_latency"] is None


def test_stop_string_across_token_boundaries(engine):
    chat = engine.apply_chat_template([{"role": "user", "content": "Count from 1 to 20 separated by commas."}])
    base = engine.generate(input_ids=chat, sampling_params={**GREEDY, "max_new_tokens": 40})
    text = base["text"]
    stop = "7\n8."  # spans four tokens ("7", "\n", "8", ".")
    assert stop in text
    out = engine.generate(input_ids=chat, sampling_params={**GREEDY, "max_new_tokens": 40, "stop": [stop, "zzz"]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[: text.index(stop)]
    chunks = list(engine.generate(input_ids=chat, sampling_params={**GREEDY, "max_new_tokens": 40, "stop": [stop]}, stream=True))
    assert "".join(c["text"] for c in chunks) == out["text"]
    assert all(stop not in "".join(c["text"] for c in chunks[: k + 1]) for k in range(len(chunks)))


def test_streaming_deltas_concatenate_and_never_split_characters(engine):
    prompt = engine.apply_chat_template([{"role": "user", "content": "Write three emoji and the word café."}])
    params = {"temperature": 0.9, "sampling_seed": 7, "max_new_tokens": 40}
    final = engine.generate(input_ids=prompt, sampling_params=params)
    chunks = list(engine.generate(input_ids=prompt, sampling_params=params, stream=True))
    assert "".join(c["text"] for c in chunks) == final["text"]
    assert sum((c["output_ids"] for c in chunks), []) == final["output_ids"]
    assert all("\ufffd" not in c["text"] for c in chunks if "\ufffd" not in final["text"])
    assert [c["meta_info"]["finish_reason"] is not None for c in chunks].count(True) == 1


def test_seeded_sampling_is_reproducible_and_batch_independent(engine):
    prompt = engine.apply_chat_template([{"role": "user", "content": "Tell me a story."}])
    params = {"temperature": 1.0, "top_p": 0.9, "sampling_seed": 1234, "max_new_tokens": 12}
    a = engine.generate(input_ids=prompt, sampling_params=params)
    others = _prompts(engine, 5)
    batch = engine.generate(input_ids=[prompt, *others], sampling_params=[params] + [{"max_new_tokens": 12}] * 5)
    assert a["output_ids"] == batch[0]["output_ids"]


def test_abort_running_request_frees_its_kv(engine):
    _wait_idle(engine)
    start = _free_slots(engine)
    prompt = engine.apply_chat_template([{"role": "user", "content": "Write a long essay."}])
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 400, "ignore_eos": True}, rid="to-abort")))
    thread.start()
    for _ in range(500):
        if engine.scheduler.call(lambda: any(r.rid == "to-abort" and r.output_ids for r in engine.scheduler.running)):
            break
        time.sleep(0.01)
    engine.abort("to-abort")
    thread.join(timeout=60)
    assert result["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < result["meta_info"]["completion_tokens"] < 400
    _wait_idle(engine)
    assert _free_slots(engine) == start
    engine.flush_cache()
    assert engine.runner.token_to_kv_pool.available_size() == engine.runner.token_to_kv_pool.size


def test_stream_consumer_that_stops_early_aborts(engine):
    _wait_idle(engine)
    start = _free_slots(engine)
    stream = engine.generate("Once upon a time", {"max_new_tokens": 300, "ignore_eos": True}, stream=True)
    next(stream)
    stream.close()
    _wait_idle(engine)
    assert _free_slots(engine) == start


# ---------------------------------------------------------------------- logprobs, hidden states, n


def test_logprobs_and_top_logprobs(engine):
    prompt = engine.apply_chat_template([{"role": "user", "content": "Name a fruit."}])
    out = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 5}, return_logprob=True, top_logprobs_num=3)
    meta = out["meta_info"]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
    for (lp, tok, _), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert len(top) == 3 and top[0][1] == tok and abs(top[0][0] - lp) < 1e-5  # greedy = the top token
        assert lp <= 0
    inputs = meta["input_token_logprobs"]
    assert len(inputs) == len(prompt) and inputs[0][0] is None and all(lp <= 0 for lp, _, _ in inputs[1:])
    assert [t for _, t, _ in inputs] == prompt


def test_hidden_states_and_n(engine):
    out = engine.generate("Hello", {**GREEDY, "max_new_tokens": 3, "return_hidden_states": True})
    hs = out["meta_info"]["hidden_states"]
    assert len(hs) == 3 and len(hs[0]) == engine.runner.model_config.hidden_size
    many = engine.generate("Pick a number:", {"temperature": 1.0, "max_new_tokens": 4, "n": 3, "sampling_seed": 5})
    assert len(many) == 3


def test_async_generate_and_stream(engine):
    async def run():
        one = await engine.async_generate("The sky is", {**GREEDY, "max_new_tokens": 5})
        chunks = [c async for c in await engine.async_generate("The sky is", {**GREEDY, "max_new_tokens": 5}, stream=True)]
        both = await asyncio.gather(*(engine.async_generate("Hi", {**GREEDY, "max_new_tokens": 3}) for _ in range(3)))
        return one, chunks, both

    one, chunks, both = asyncio.run(run())
    assert "".join(c["text"] for c in chunks) == one["text"]
    assert len({b["text"] for b in both}) == 1


# ---------------------------------------------------------------------- bad input


def test_bad_input_is_refused_before_admission(engine):
    with pytest.raises(PromptError, match="empty"):
        engine.generate("", {"max_new_tokens": 4})
    with pytest.raises(PromptError, match="context"):
        engine.generate(input_ids=[5] * (engine.context_len + 1))
    with pytest.raises(PromptError, match="input_ids"):
        engine.generate(input_ids=[10**9])
    with pytest.raises(InvalidSamplingParams, match="temperature"):
        engine.generate("hi", {"temperature": -1})
    with pytest.raises(InvalidSamplingParams, match="bogus"):
        engine.generate("hi", {"bogus": 1})
    with pytest.raises(InvalidSamplingParams, match="json_schema"):
        engine.generate("hi", SamplingParams(json_schema={"type": "integer"}, regex="a"))
    with pytest.raises(FileNotFoundError):
        Engine("/nonexistent/model")
    with pytest.raises(TypeError, match="no_such_option"):
        Engine(no_such_option=1)
    assert engine.generate("hi", {**GREEDY, "max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


def test_reasoning_end_leaves_text_free_until_the_marker():
    """With ``reasoning_end`` the constraint starts after the marker. Greedy SmolLM2 answers this
    prompt with "In the year 2023, ..."; with the marker "year" the text stays free up to it,
    then " \\d{4}" is enforced and the output ends there. A thinking budget closes the reasoning
    itself (the engine writes "\\nyear"), as does a max_new_tokens that leaves only the room of
    the shortest constrained answer."""
    with Engine(dtype="float32", max_total_tokens=2000, num_threads=1, reasoning_end="year") as eng:
        prompt = eng.apply_chat_template([{"role": "user", "content": "Write a title line, then a year on the next line."}])
        ask = {**GREEDY, "max_new_tokens": 40, "regex": r" \d{4}"}
        out = eng.generate(input_ids=prompt, sampling_params=ask)
        budget = eng.generate(input_ids=prompt, sampling_params={**ask, "max_reasoning_tokens": 2})
        tight = eng.generate(input_ids=prompt, sampling_params={**ask, "max_new_tokens": 9})
        unconstrained = eng.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 6, "max_reasoning_tokens": 2})
        # Logprobs stay one per output token across the forced close (streamed deltas too).
        logged = eng.generate(input_ids=prompt, sampling_params={**ask, "max_reasoning_tokens": 2}, return_logprob=True, top_logprobs_num=2)
        chunks = list(eng.generate(input_ids=prompt, sampling_params={**ask, "max_reasoning_tokens": 2}, return_logprob=True, stream=True))
        tokens = lambda text: len(eng.tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    free, marker, constrained = out["text"].rpartition("year")
    assert marker and free, out["text"]
    assert len(constrained) == 5 and constrained[1:].isdigit(), out["text"]
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    for res in (budget, tight):
        thought, marker, answer = res["text"].partition("\nyear")
        assert marker and free.startswith(thought), res["text"]  # the same greedy start, cut short
        assert len(answer) == 5 and answer[1:].isdigit() and res["meta_info"]["finish_reason"]["type"] == "stop", res["text"]
    assert tokens(budget["text"].partition("\nyear")[0]) == 2
    assert tokens(tight["text"]) <= 8  # the EOS that ended it is the 9th
    close = eng.tokenizer.encode("\nyear", add_special_tokens=False)
    meta = logged["meta_info"]
    assert logged["text"] == budget["text"] and [t for _, t, _ in meta["output_token_logprobs"]] == logged["output_ids"]
    assert [(lp, t) for lp, t, _ in meta["output_token_logprobs"][2 : 2 + len(close)]] == [(0.0, t) for t in close]
    assert len(meta["output_top_logprobs"]) == len(logged["output_ids"]) and meta["output_top_logprobs"][2][0][:2] == (0.0, close[0])
    streamed = [t for c in chunks for _, t, _ in c["meta_info"].get("output_token_logprobs") or []]
    assert streamed == logged["output_ids"]
    assert "\nyear" in unconstrained["text"] and tokens(unconstrained["text"].partition("\nyear")[0]) == 2, unconstrained["text"]


def test_startup_heap_is_frozen_out_of_full_collections():
    # The objects loaded at startup (numba, tokenizer, vocabulary, trie) are never garbage; a
    # full collection walking them stalled the decode loop for 100 ms or more. Shutting down
    # hands them back to the collector.
    import gc

    gc.unfreeze()
    with Engine(dtype="float32", max_total_tokens=500, num_threads=1) as eng:
        assert eng.args.freeze_gc_after_startup
        assert gc.get_freeze_count() > 50_000
    assert gc.get_freeze_count() == 0
    with Engine(dtype="float32", max_total_tokens=500, num_threads=1, freeze_gc_after_startup=False):
        assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("model_format", ["gguf", "hf"])
def test_no_request_compiles_a_cpu_kernel_after_ready(model_format):
    # Issue 25: the engine runs its CPU kernels (block products, norms, linear loop, panel
    # product, paged decode attention) before it reports ready, with the types and thread count
    # a forward passes them, so a request compiles none of them. The GGUF default keeps its
    # matrices in blocks; the HF folder's are float panels.
    from numba.core.registry import CPUDispatcher

    from engine.hf.model_files import default_model_dir
    from engine.layers import cpu_decode_attention, cpu_kernel_warmup, cpu_linear, ggml_quants, panel_linear, row_ops

    path = default_model_dir() if model_format == "hf" else None
    with Engine(path, dtype="float32", max_total_tokens=500, num_threads=1) as eng:
        cfg = eng.runner.model_config
        kernels = {f"{m.__name__}.{n}": d for m in (cpu_linear, ggml_quants, row_ops, panel_linear) for n, d in vars(m).items() if isinstance(d, CPUDispatcher)}
        kernels["attention"] = cpu_decode_attention.kernel_for(cfg.head_dim, cfg.num_heads // cfg.num_kv_heads, False)
        if model_format == "hf":
            assert panel_linear.panel_weights(eng.runner.model), "an HF folder loads into panels"
            used = ["attention", "engine.layers.panel_linear._product"]
        else:  # one thread (num_threads=1): the Q4_1 matrices' and the Q8_0 head's loops on this thread
            used = ["attention", "engine.layers.ggml_quants._mm_q4_1", "engine.layers.ggml_quants._mm_q8_0", "engine.layers.row_ops._rms_norm"]
        ready = {n: len(k.signatures) for n, k in kernels.items()}
        assert all(ready[n] for n in used), "compiled or loaded before ready"
        # both formats hold every matrix in their own kernels' layout: no float loop is compiled
        assert cpu_kernel_warmup.dense_matrix_dtypes(eng.runner.model) == set()
        out = eng.generate("The capital of France is", {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert out["meta_info"]["completion_tokens"] == 4
        assert {n: len(k.signatures) for n, k in kernels.items()} == ready, "a forward compiled another version"
