"""``Engine``: formcast's Python API over its own batched engine.

    with Engine() as engine:                                   # the embedded SmolLM2-135M-Instruct
        out = engine.generate("Name a color:", {"max_new_tokens": 8, "temperature": 0})
        out = engine.chat([{"role": "user", "content": "A user profile"}],
                          {"json_schema": schema, "max_new_tokens": 128})
        for chunk in engine.generate(prompt, params, stream=True): print(chunk["text"], end="")

Threads: the caller's thread tokenizes and validates (bad input raises here, before anything is
admitted); the scheduler thread batches and runs the model; a delivery thread detokenizes each
step's tokens and hands results to the waiting callers (blocking queues for ``generate``, asyncio
queues for ``async_generate``), so any number of threads and event loops may call at once.

Each result is ``{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
"completion_tokens", "cached_tokens", "jump_forward_tokens", "output_token_logprobs",
"output_top_logprobs", "input_token_logprobs", "hidden_states", "routed_experts",
"routed_expert_weights", "e2e_latency", "grammar_wait", "queue_wait", "prefill_latency"}}``;
logprob entries are ``(logprob, token_id, token_text)``;
``routed_experts`` (mixture-of-experts models, on request) holds per output token the expert ids
each MoE layer chose, ``[moe_layer][k]``. Streaming yields chunks of the same shape whose
``text`` and ``output_ids`` are deltas; the last one carries the finish reason. A request's last
result also says where its time to the first token went, in seconds (``RequestTimings``):
``grammar_wait`` (its constraint compiling), ``queue_wait`` (then waiting for a batch),
``prefill_latency`` (then its prompt's forward passes); None for a span it never reached.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, TypeVar

from grammar import TokenVocabulary, disk_cache, jit_warmup, kernel_tier
from grammar.token_masks import load_compiled_kernels, vocabulary_masks

from ..constrained.grammar_backend import GrammarBackend
from ..errors import PromptError  # defined with the other field errors; imported from here too
from ..layers import cpu_kernel_warmup
from ..layers.attention import set_row_invariant_prefill
from ..managers.detokenizer import Detokenizer, TokenTexts
from ..managers.io_struct import BatchTokenIDOutput, ReqStrOutput
from ..managers.req import Req
from ..managers.scheduler import Scheduler, SchedulerConfig
from ..model_executor.model_runner import ModelRunner
from ..sampling_params import InvalidSamplingParams, SamplingParams
from ..speculative.worker import SpeculativeConfig, build_worker
from .engine_args import EngineArgs
from .tool_formats import ToolCallFormat, detect_format, marker_token_texts


# apply_chat_template's own arguments: a caller's template variables may not override them.
_TEMPLATE_RESERVED = frozenset({"conversation", "tools", "documents", "chat_template", "tokenize", "add_generation_prompt", "continue_final_message", "return_tensors", "return_dict", "padding", "truncation", "max_length", "tokenizer_kwargs"})


T = TypeVar("T")


def _on_passing_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a new thread that exits once it returns.

    Why: torch and numba each run their parallel loops on an OpenMP runtime (libgomp) that keeps
    a pool of worker threads per calling thread for as long as that thread lives. Once a second
    pool exists, libgomp counts more threads than cores and its workers stop spinning between
    parallel regions, sleeping instead: each region then pays a wake-up. Measured on 2 cores,
    SmolLM2 Q4_1 at batch 1: a decode step took 19 ms on the scheduler's thread after the model
    had loaded on the caller's (its torch ops ran a region there), against 9 ms when no other
    living thread had run one. The engine starts here and warms its kernels up on passing threads
    too, so the scheduler's thread is the one whose pools are alive (a caller's own torch work on
    a thread that stays alive brings the sleeping back)."""
    with ThreadPoolExecutor(1, thread_name_prefix="formcast-load") as pool:
        return pool.submit(fn, *args, **kwargs).result()


class Engine:
    def __init__(self, model_path: str | None = None, **options: Any) -> None:
        # The whole start (model load, warm-ups, vocabulary) on a thread that then exits: the
        # scheduler's thread is to be the only living one whose OpenMP pools ran a parallel region.
        _on_passing_thread(self._start, model_path, **options)

    def _start(self, model_path: str | None = None, **options: Any) -> None:
        self.args = EngineArgs.from_options(model_path, **options)
        args = self.args
        # A fresh install compiles the grammar kernels in child processes while the model loads;
        # until they are done the engine runs their Python twins (grammar.kernel_tier), so no
        # request waits for a JIT compile and the engine is ready as soon as the model is.
        kernels = jit_warmup.start(background=args.grammar_python_tier)
        cold = bool(kernels.procs) or kernels.elsewhere
        if cold:  # a progress line at once: the model load that follows says nothing
            print("formcast: first start after install: compiling kernels (once) while the model loads...", file=sys.stderr, flush=True)
        set_row_invariant_prefill(args.enable_deterministic_inference)
        self.runner = ModelRunner(
            args.model_path,
            dtype=args.dtype,
            device=args.device,
            max_total_tokens=args.max_total_tokens,
            mem_fraction=args.mem_fraction,
            max_running_requests=args.max_running_requests,
            context_length=args.context_length,
            num_threads=args.num_threads,
            quantization=args.quantization,
            cuda_graph_max_bs=0 if args.disable_cuda_graph else args.cuda_graph_max_bs,
        )
        # The model's CPU kernels compile (cold) or load (warm) on a thread while the tokenizer and
        # the vocabulary load: on a cold cache the decode attention's compile is a child process's
        # seconds that the main thread need not wait for.
        cpu_kernels = ThreadPoolExecutor(1, thread_name_prefix="formcast-cpu-kernels")
        cpu_warm = cpu_kernels.submit(self._warm_up_cpu_kernels)
        cpu_kernels.shutdown(wait=False)
        self.tokenizer = load_tokenizer(args.tokenizer_path or self.runner.model_path)
        self.vocab = _with_model_eos(TokenVocabulary.from_tokenizer(self.tokenizer), self.runner.model_config.eos_token_ids)
        # Tool-call markers the model writes as one control token are text to the grammar and the parser.
        self.vocab = self.vocab.with_text_tokens(marker_token_texts(self.tool_call_format, self.tokenizer, self.vocab.special_token_ids))
        self.context_len = self.runner.context_len
        if cold and args.grammar_python_tier:
            # Ready now: constraints run the grammar kernels' Python twins until the children are
            # done, then the compiled kernels (grammar.kernel_tier); no request waits for a compile.
            kernel_tier.use_python()
            print("formcast: ready before the grammar kernels are compiled: constraints run as Python (slower masks) "
                  "until they are", file=sys.stderr, flush=True)  # fmt: skip
        else:
            kernels.wait(progress=lambda line: print(line, file=sys.stderr, flush=True))
        vocabulary_masks(self.vocab)  # the token trie and the mask kernels, loaded before ready
        cpu_warm.result()
        self.grammar_backend = GrammarBackend(
            self.vocab, num_workers=args.grammar_workers, budget=_budget(args),
            compile_processes=args.grammar_compile_processes, disk=grammar_disk_cache(args),
            tokenizer=self.tokenizer,
        )
        if kernel_tier.compiled():
            self.grammar_backend.start_compile_processes()
        else:  # their first compile would JIT-compile the front end's kernels: after the switch
            kernel_tier.switch_when(
                kernels.wait, before_switch=load_compiled_kernels,
                after_switch=[self.grammar_backend.start_compile_processes,
                              lambda: print("formcast: grammar kernels compiled; constraints now run them", file=sys.stderr, flush=True)],
            )  # fmt: skip
        self.texts = TokenTexts(self.vocab, self.tokenizer)
        self._detokenizer = Detokenizer(self.texts)
        self._requests: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._delivery: queue.SimpleQueue = queue.SimpleQueue()
        self._delivery_thread = threading.Thread(target=self._deliver_loop, name="formcast-detokenizer", daemon=True)
        self._delivery_thread.start()
        config = SchedulerConfig(
            max_running_requests=args.max_running_requests,
            chunked_prefill_size=args.chunked_prefill_size,
            decode_prefill_budget=args.decode_prefill_budget,
            enable_prefix_cache=args.enable_prefix_cache,
            enable_jump_forward=args.enable_jump_forward,
            reasoning_end=args.reasoning_end,
        )
        speculative = SpeculativeConfig(
            algorithm=args.speculative_algorithm,
            num_draft_tokens=args.speculative_num_draft_tokens,
            draft_model_path=args.speculative_draft_model_path,
            draft_num_layers=args.speculative_draft_num_layers,
            verify_cost=args.speculative_verify_cost,
            jump_forward=args.enable_jump_forward,
        )
        spec = build_worker(speculative, self.runner, self.tokenizer, self.texts, self.vocab)
        self.scheduler = Scheduler(self.runner, self.tokenizer, self.vocab, self.grammar_backend, config, self._delivery.put, spec)
        self.grammar_backend.compile_beside(lambda: bool(self.scheduler.running))
        if args.freeze_gc_after_startup:
            gc.collect()
            gc.freeze()
        self.scheduler.start()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def _warm_up_cpu_kernels(self) -> None:
        """The model's CPU kernels, compiled here (cold) while the grammar's children compile theirs.
        The decode attention compiles in a child process of its own: its thread waits beside the
        block-format and linear loops, which numba compiles in this process one at a time."""
        if self.runner.device.type != "cpu":
            return
        cfg = self.runner.model_config
        self.runner.bind_threads()  # the products' variants are those of the scheduler's thread
        with ThreadPoolExecutor(1, thread_name_prefix="formcast-attention-kernel") as pool:
            attention = pool.submit(
                cpu_kernel_warmup.warm_up_attention, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads,
                self.runner.token_to_kv_pool.dtype, f16_probs=self.runner.attn_backend.f16, softcap=cfg.attn_softcap,
            )  # fmt: skip
            cpu_kernel_warmup.warm_up_linear(self.runner.model)
            cpu_kernel_warmup.warm_up_quantized(self.runner.model)
            cpu_kernel_warmup.warm_up_panels(self.runner.model)
            cpu_kernel_warmup.warm_up_moe(self.runner.model)
            attention.result()

    def shutdown(self) -> None:
        """Stop the engine; requests still running finish with ``abort``."""
        if self._closed:
            return
        self._closed = True
        self.scheduler.stop()
        self._delivery.put(None)
        self._delivery_thread.join()
        self.grammar_backend.shutdown()
        if self.args.freeze_gc_after_startup:
            # Frozen objects are never collected: an engine shut down inside a longer-lived
            # process (tests, notebooks) hands its startup heap back to the collector.
            gc.unfreeze()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def abort(self, rid: str) -> None:
        """Finish request ``rid`` with ``abort`` (its KV cache is freed); unknown ids are ignored."""
        self.scheduler.abort(rid)

    # ------------------------------------------------------------------ generate
    def precompile(self, constraints: Sequence[SamplingParams | dict[str, Any]]) -> list[str | None]:
        """Compile constraints before traffic arrives: each ``SamplingParams`` or a dict such as
        ``{"json_schema": {...}}``. They are kept in memory and in the on-disk store
        (``grammar_cache_dir``), so a restarted engine answers them without compiling. Returns,
        per constraint, None or the refusal's message."""
        return self.grammar_backend.precompile(constraints)

    def generate(
        self,
        prompt: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]] | None = None,
        sampling_params: SamplingParams | dict | Sequence[SamplingParams | dict] | None = None,
        *,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        return_hidden_states: bool = False,
        stream: bool = False,
        rid: str | Sequence[str] | None = None,
    ) -> dict | list[dict] | Iterator[dict]:
        """One result per prompt (times ``n``), in order; a single prompt returns a dict."""
        reqs, single = self._make_reqs(prompt, input_ids, sampling_params, return_logprob, top_logprobs_num, return_hidden_states, stream, rid)
        channel: queue.SimpleQueue = queue.SimpleQueue()
        self._submit(reqs, channel, None)
        if stream:
            return self._stream(reqs, channel)
        results = self._collect(reqs, channel)
        return results[0] if single else results

    def chat(self, messages: list[dict], sampling_params: SamplingParams | dict | None = None, **kwargs: Any) -> Any:
        """``generate`` on ``messages`` rendered with the model's chat template."""
        return self.generate(input_ids=self.apply_chat_template(messages, tools=kwargs.pop("tools", None)), sampling_params=sampling_params, **kwargs)

    async def async_generate(
        self,
        prompt: Any = None,
        sampling_params: Any = None,
        *,
        input_ids: Any = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        return_hidden_states: bool = False,
        stream: bool = False,
        rid: Any = None,
    ) -> Any:
        """Like ``generate``; with ``stream=True`` returns an async iterator of chunks."""
        reqs, single = self._make_reqs(prompt, input_ids, sampling_params, return_logprob, top_logprobs_num, return_hidden_states, stream, rid)
        loop = asyncio.get_running_loop()
        channel: asyncio.Queue = asyncio.Queue()
        self._submit(reqs, channel, loop)
        if stream:
            return self._astream(reqs, channel)
        results: list[dict | None] = [None] * len(reqs)
        order = {r.rid: i for i, r in enumerate(reqs)}
        try:
            while any(r is None for r in results):
                chunk = await channel.get()
                results[order[chunk["meta_info"]["id"]]] = chunk
        except asyncio.CancelledError:
            for r in reqs:
                self.abort(r.rid)
            raise
        return results[0] if single else results

    async def async_chat(self, messages: list[dict], sampling_params: Any = None, **kwargs: Any) -> Any:
        ids = self.apply_chat_template(messages, tools=kwargs.pop("tools", None))
        return await self.async_generate(input_ids=ids, sampling_params=sampling_params, **kwargs)

    def extract(self, records: Any, schema: Any = None, **options: Any) -> Iterator[Any]:
        """Batch extraction for notebooks: an iterator of ``ExtractResult`` (``id``, ``value``,
        ``error``, ...), one per record, in the order they finish. ``records`` are dicts (the
        document in ``field``, default ``text``) or strings; options: ``regex``, ``ebnf``,
        ``prompt_template``, ``field``, ``id_field``, ``chat``, ``max_new_tokens``,
        ``temperature`` and other sampling fields. See ``engine.extract``."""
        from ..extract.runner import extract

        return extract(self, records, schema, **options)

    def apply_chat_template(
        self, messages: list[dict], tools: list | None = None, *, continue_final_message: bool = False, **template_kwargs: Any
    ) -> list[int]:
        """Prompt ids of ``messages``: a new assistant turn opened, or with ``continue_final_message``
        the last (assistant) message left open to be continued. ``template_kwargs`` reach the
        template as variables (``enable_thinking``, ``reasoning_effort``, ...)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise PromptError("messages", "the model has no chat template; send a plain prompt")
        reserved = sorted(set(template_kwargs) & _TEMPLATE_RESERVED)
        if reserved:
            raise PromptError("chat_template_kwargs", f"{reserved[0]!r} is set by the engine, not by the caller")
        if continue_final_message and (not messages or messages[-1].get("role") != "assistant"):
            raise PromptError("continue_final_message", "the last message must be an assistant message to continue")
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=not continue_final_message,
            continue_final_message=continue_final_message,
            **template_kwargs,
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ introspection
    @property
    def tool_call_format(self) -> ToolCallFormat:
        """The syntax tool calls are constrained and read in: ``tool_call_parser``, else the one
        the chat template renders, else the model family's (``tool_formats.detect_format``)."""
        template = getattr(self.tokenizer, "chat_template", None)
        family = getattr(self.runner.model_config, "architecture", None)
        return detect_format(template if isinstance(template, str) else None, family, self.args.tool_call_parser)

    def get_load(self) -> dict[str, int]:
        return self.scheduler.load()

    def flush_cache(self) -> int:
        """Evict every unused entry of the prefix cache (returns the tokens freed)."""
        cache = self.scheduler.tree_cache
        return self.scheduler.call(lambda: cache.evict(cache.evictable_size()))

    # ------------------------------------------------------------------ requests
    def _make_reqs(self, prompt, input_ids, sampling_params, return_logprob, top_logprobs_num, return_hidden_states, stream, rid):  # type: ignore[no-untyped-def]
        if self._closed:
            raise RuntimeError("the engine was shut down")
        prompts, single = self._prompts(prompt, input_ids)
        params = _params_per_prompt(sampling_params, len(prompts))
        rids = _rids(rid, len(prompts))
        reqs = []
        for i, (ids, p) in enumerate(zip(prompts, params)):
            p = dataclasses.replace(p)
            if return_logprob or top_logprobs_num:
                p.logprobs, p.top_logprobs_num = True, max(top_logprobs_num, p.top_logprobs_num)
            if return_hidden_states:
                p.return_hidden_states = True
            p.normalize(self.tokenizer)
            p.verify(self.vocab.vocab_size)
            self._check_prompt(ids, p)
            for k in range(p.n):
                copy = dataclasses.replace(p, n=1)
                if k and p.sampling_seed is not None:
                    copy.sampling_seed = (p.sampling_seed + k) % (2**63)
                reqs.append(self._req(rids[i] if p.n == 1 else f"{rids[i]}-{k}", ids, copy, stream))
        return reqs, single and len(reqs) == 1

    def _req(self, rid: str, ids: list[int], params: SamplingParams, stream: bool) -> Req:
        return Req(
            rid=rid,
            origin_input_ids=list(ids),
            sampling_params=params,
            eos_token_ids=frozenset(self.vocab.eos_token_ids),
            context_len=self.context_len,
            return_logprob=bool(params.logprobs),
            top_logprobs_num=params.top_logprobs_num,
            return_hidden_states=params.return_hidden_states,
            return_routed_experts=params.return_routed_experts or params.return_routed_expert_weights,
            return_routed_expert_weights=params.return_routed_expert_weights,
            stream=stream,
        )

    def _prompts(self, prompt: Any, input_ids: Any) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise PromptError("prompt", "give exactly one of prompt and input_ids")
        source = prompt if prompt is not None else input_ids
        if isinstance(source, str):
            return [self._tokenize(source)], True
        if not isinstance(source, Sequence) or not source:
            raise PromptError("prompt", "must be a string, a list of strings, or token ids")
        if all(isinstance(t, int) for t in source):
            return [list(source)], True
        out = []
        for item in source:
            if isinstance(item, str):
                out.append(self._tokenize(item))
            elif isinstance(item, Sequence) and all(isinstance(t, int) for t in item):
                out.append(list(item))
            else:
                raise PromptError("prompt", f"each prompt must be a string or a list of token ids, got {type(item).__name__}")
        return out, False

    def _tokenize(self, text: str) -> list[int]:
        if not text:
            raise PromptError("prompt", "is empty")
        return list(self.tokenizer(text)["input_ids"])

    def _check_prompt(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise PromptError("prompt", "is empty")
        vocab = self.runner.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise PromptError("input_ids", f"token id {bad} is outside [0, {vocab})")
        if len(ids) >= self.context_len:
            raise PromptError("prompt", f"has {len(ids)} tokens; the context holds {self.context_len} (prompt plus output)")
        if len(ids) + 1 > self.runner.max_total_tokens:
            raise PromptError("prompt", f"has {len(ids)} tokens; the KV cache holds {self.runner.max_total_tokens}")
        if (params.return_routed_experts or params.return_routed_expert_weights) and self.runner.model_config.moe is None:
            raise PromptError("return_routed_experts", f"the model ({self.runner.model_config.architecture}) has no experts")
        room = self.context_len - len(ids)
        if params.min_new_tokens > room:
            raise InvalidSamplingParams(
                "min_new_tokens", f"{params.min_new_tokens} tokens cannot fit: the prompt has {len(ids)} tokens and the context holds {self.context_len}"
            )

    # ------------------------------------------------------------------ delivery
    def _submit(self, reqs: list[Req], channel: Any, loop: asyncio.AbstractEventLoop | None) -> None:
        with self._lock:
            for r in reqs:
                if r.rid in self._requests:
                    raise PromptError("rid", f"request id {r.rid!r} is already running")
            for r in reqs:
                self._requests[r.rid] = _Pending(channel, loop, time.monotonic())
        for r in reqs:
            self.scheduler.submit(r)

    def _collect(self, reqs: list[Req], channel: queue.SimpleQueue) -> list[dict]:
        order = {r.rid: i for i, r in enumerate(reqs)}
        results: list[dict | None] = [None] * len(reqs)
        left = len(reqs)
        while left:
            chunk = channel.get()
            results[order[chunk["meta_info"]["id"]]] = chunk
            left -= 1
        return results  # type: ignore[return-value]

    def _stream(self, reqs: list[Req], channel: queue.SimpleQueue) -> Iterator[dict]:
        left = len(reqs)
        try:
            while left:
                chunk = channel.get()
                if chunk["meta_info"]["finish_reason"] is not None:
                    left -= 1
                yield chunk
        finally:
            if left:  # the consumer stopped early: free the requests' memory
                for r in reqs:
                    self.abort(r.rid)

    async def _astream(self, reqs: list[Req], channel: asyncio.Queue) -> AsyncIterator[dict]:
        left = len(reqs)
        try:
            while left:
                chunk = await channel.get()
                if chunk["meta_info"]["finish_reason"] is not None:
                    left -= 1
                yield chunk
        finally:
            if left:
                for r in reqs:
                    self.abort(r.rid)

    def _deliver_loop(self) -> None:
        while True:
            batch = self._delivery.get()
            if batch is None:
                return
            assert isinstance(batch, BatchTokenIDOutput)
            for out in self._detokenizer.process(batch).outputs:
                self._deliver(out)

    def _deliver(self, out: ReqStrOutput) -> None:
        step = out.step
        with self._lock:
            pending = self._requests.get(step.rid)
            if pending is None:
                return
            if step.finished_reason is not None:
                del self._requests[step.rid]
        chunk = self._chunk(out, pending)
        if pending.loop is not None:
            pending.loop.call_soon_threadsafe(pending.channel.put_nowait, chunk)
        else:
            pending.channel.put(chunk)

    def _chunk(self, out: ReqStrOutput, pending: _Pending) -> dict:
        step = out.step
        text = self.texts.token_text
        meta: dict[str, Any] = {
            "id": step.rid,
            "finish_reason": step.finished_reason.to_json() if step.finished_reason else None,
            "prompt_tokens": step.prompt_tokens,
            "completion_tokens": step.completion_tokens,
            "cached_tokens": step.cached_tokens,
            "jump_forward_tokens": step.forced_tokens,
            "e2e_latency": time.monotonic() - pending.start,
        }
        if step.timings is not None:  # the last output: where the time to the first token went
            meta.update(dataclasses.asdict(step.timings))
        if step.output_token_logprobs is not None:
            meta["output_token_logprobs"] = [(lp, t, text(t)) for lp, t in step.output_token_logprobs]
            if step.output_top_logprobs is not None:
                meta["output_top_logprobs"] = [[(lp, t, text(t)) for lp, t in top] for top in step.output_top_logprobs]
        if step.input_token_logprobs is not None:
            meta["input_token_logprobs"] = [(lp, t, text(t)) for lp, t in step.input_token_logprobs]
        if step.hidden_states is not None:
            meta["hidden_states"] = step.hidden_states
        if step.routed_experts is not None:
            meta["routed_experts"] = step.routed_experts
            if step.routed_expert_weights is not None:
                meta["routed_expert_weights"] = step.routed_expert_weights
        return {"text": out.text_delta, "output_ids": list(step.new_token_ids), "meta_info": meta}


def _with_model_eos(vocab: TokenVocabulary, model_eos: tuple[int, ...]) -> TokenVocabulary:
    """The tokenizer's end tokens plus those the checkpoint's config / generation_config name."""
    extra = {t for t in model_eos if 0 <= t < vocab.vocab_size} - vocab.eos_token_ids
    if not extra:
        return vocab
    return TokenVocabulary.from_token_bytes(vocab.token_bytes, vocab.eos_token_ids | extra, vocab.special_token_ids)


@dataclasses.dataclass
class _Pending:
    channel: Any  # queue.SimpleQueue or asyncio.Queue
    loop: asyncio.AbstractEventLoop | None
    start: float


def _params_per_prompt(spec: Any, count: int) -> list[SamplingParams]:
    if isinstance(spec, (list, tuple)):
        if len(spec) != count:
            raise InvalidSamplingParams("sampling_params", f"{len(spec)} given for {count} prompts")
        return [_params(s) for s in spec]
    return [_params(spec)] * count


def _params(spec: Any) -> SamplingParams:
    if spec is None:
        return SamplingParams()
    if isinstance(spec, SamplingParams):
        return spec
    if isinstance(spec, dict):
        known = {f.name for f in dataclasses.fields(SamplingParams) if f.init}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise InvalidSamplingParams(unknown[0], f"unknown sampling parameter (known: {', '.join(sorted(known))})")
        return SamplingParams(**spec)
    raise InvalidSamplingParams("sampling_params", f"must be SamplingParams or a dict, got {type(spec).__name__}")


def _rids(rid: Any, count: int) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    rids = [rid] if isinstance(rid, str) else list(rid)
    if len(rids) != count:
        raise PromptError("rid", f"{len(rids)} ids for {count} prompts")
    return [str(r) for r in rids]


def grammar_disk_cache(args: EngineArgs) -> Any:
    """The engine's on-disk store of compiled grammars: ``grammar_cache_dir``; its "default" is
    $FORMCAST_GRAMMAR_CACHE when set ("off": none), else $FORMCAST_CACHE/grammars."""
    directory = args.grammar_cache_dir
    if directory == "default":
        directory = os.environ.get("FORMCAST_GRAMMAR_CACHE") or directory
    if directory is None or directory == "off":
        return None
    return disk_cache.DiskCache(disk_cache.default_directory() if directory == "default" else directory, args.grammar_cache_bytes)


def _budget(args: EngineArgs) -> Any:
    if args.grammar_compile_timeout is None:
        return None
    from grammar import CompileBudget

    return CompileBudget(max_compile_seconds=args.grammar_compile_timeout)


def load_tokenizer(path: Any) -> Any:
    from transformers import AutoTokenizer

    from ..models.loader import is_gguf

    if is_gguf(path):
        from ..hf.gguf_tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    if _declares_fast_tokenizer(path):
        # AutoTokenizer would resolve the class through AutoConfig, importing the model family's
        # modules and much of transformers (4 to 12 s of a start, issue 25) to arrive at the
        # class the folder already names; the same class loads the same tokenizer directly.
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


# tokenizer_config.json classes that are the plain fast tokenizer over tokenizer.json.
_FAST_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def _declares_fast_tokenizer(path: Any) -> bool:
    """True when the folder ``path`` names the plain fast tokenizer class in its
    tokenizer_config.json (no remote code), beside a tokenizer.json."""
    folder = Path(path)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(config, dict) and config.get("tokenizer_class") in _FAST_TOKENIZER_CLASSES
            and "auto_map" not in config and (folder / "tokenizer.json").is_file())
