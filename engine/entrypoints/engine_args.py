"""``EngineArgs``: every option of an ``Engine``, with its default, checked in one place."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any


# Reasoning syntaxes by name -> the tag that ends the reasoning (the start tag is it without "/").
REASONING_PARSERS = {"qwen3": "</think>", "deepseek-r1": "</think>", "think": "</think>"}


@dataclass
class EngineArgs:
    model_path: str | None = None  # a Hugging Face folder or a .gguf file; None = the embedded SmolLM2-135M-Instruct
    tokenizer_path: str | None = None  # default: the model's own (folder or GGUF file)
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 ("auto": half precision where it is fast)
    device: str = "cpu"
    # Weight-only quantization of a Hugging Face folder at load: "int8" (Q8_0) or "int4" (Q4_0)
    # blocks of 32, multiplied by the GGUF kernels; the forward runs in float32. CPU only.
    quantization: str | None = None
    max_total_tokens: int | None = None  # KV cache slots; default from mem_fraction
    mem_fraction: float = 0.2  # of the memory free after loading, for the KV cache
    max_running_requests: int = 64
    max_waiting_requests: int | None = None  # None: the Engine is unbounded; the server bounds it at 16 x max_running_requests (503 beyond)
    context_length: int | None = None  # cap below the model's own
    chunked_prefill_size: int = 512  # prompt tokens per forward; longer prompts go in chunks
    # The latency policy: while any request is decoding, a forward takes at most this many prompt
    # tokens (None: chunked_prefill_size), so a long prompt arriving never stalls running streams
    # for a whole chunk; prefills take more steps instead. With it on, a prompt being prefilled in
    # chunks also leaves half of each step to waiting requests (no short request waits out a long prefill).
    decode_prefill_budget: int | None = None
    enable_prefix_cache: bool = True
    enable_jump_forward: bool = True
    # bfloat16 on the CPU: every prompt row computed alone (the compiled linear loop at every row
    # count, each query through the paged attention kernel), so a cached prefix never changes a
    # greedy output. Costs about 2x the prefill time (512 tokens: 1.3 -> 2.5 s). Process-wide:
    # the switch is the layers' (the last Engine created sets it).
    enable_deterministic_inference: bool = False
    # CUDA: decode batches of up to this many rows replay CUDA graphs captured at start (None:
    # min(max_running_requests, 32)); disable_cuda_graph turns them off. Ignored on the CPU.
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    reasoning_end: str | None = None  # e.g. "</think>": the constraint applies after it
    # A reasoning model's syntax by name (qwen3, deepseek-r1: <think>...</think>); sets reasoning_end.
    reasoning_parser: str | None = None
    # The tool-call syntax (hermes, qwen, llama3, mistral, json); None: detected from the chat
    # template and the model family (engine.entrypoints.tool_formats).
    tool_call_parser: str | None = None
    grammar_workers: int = 1
    grammar_compile_timeout: float | None = None  # seconds of wall-clock backstop; default: the grammar budget's
    # Child processes that run constraint front ends, so a big compile never holds the GIL that
    # decoding needs (0: compile in the worker threads, as the library does).
    grammar_compile_processes: int = 1
    # On a fresh install (numba's cache empty) be ready before the grammar kernels are compiled:
    # constraints run their Python twins (grammar.kernel_tier; slower masks, the same ones) while
    # niced children compile, then switch. False: wait for the compile before reporting ready.
    grammar_python_tier: bool = True
    # Compiled grammars kept on disk across restarts ("default": $FORMCAST_CACHE/grammars or
    # ~/.cache/formcast/grammars; None: off), and the most bytes they may take.
    grammar_cache_dir: str | None = "default"
    grammar_cache_bytes: int = 512 << 20
    num_threads: int | None = None  # torch CPU threads
    # Speculative decoding: none | ngram | grammar | draft_model, or a "+" join (ngram+grammar).
    speculative_algorithm: str = "none"
    speculative_num_draft_tokens: int = 4
    speculative_draft_model_path: str | None = None  # default for draft_model: the target's first layers
    speculative_draft_num_layers: int | None = None  # layers of that self-speculative draft
    # Cost of one more verified row relative to a decode forward (bench/spec_bench.py measures
    # it): draft lengths then maximize expected tokens per cost. None: the accept-all rule.
    speculative_verify_cost: float | None = None
    # gc.freeze() once loaded: full collections then skip the startup heap (numba alone brings
    # 50k objects; the tokenizer, the vocabulary and the model add more), each one otherwise a
    # stall of 100 ms or more for every running request.
    freeze_gc_after_startup: bool = True

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: Any) -> EngineArgs:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown Engine option(s) {unknown}; known: {sorted(known)}")
        args = cls(model_path=model_path, **options)
        args.check()
        return args

    def check(self) -> None:
        positive = ("max_running_requests", "chunked_prefill_size", "grammar_workers", "speculative_num_draft_tokens")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("max_total_tokens", "context_length", "max_waiting_requests", "num_threads", "decode_prefill_budget"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or an integer >= 1, got {value!r}")
        if self.cuda_graph_max_bs is not None and (not isinstance(self.cuda_graph_max_bs, int) or self.cuda_graph_max_bs < 0):
            raise ValueError(f"cuda_graph_max_bs must be None or an integer >= 0, got {self.cuda_graph_max_bs!r}")
        if not isinstance(self.grammar_compile_processes, int) or self.grammar_compile_processes < 0:
            raise ValueError(f"grammar_compile_processes must be an integer >= 0, got {self.grammar_compile_processes!r}")
        if self.tool_call_parser is not None:
            from .tool_formats import get_format

            get_format(self.tool_call_parser)
        if self.reasoning_parser is not None:
            if self.reasoning_parser not in REASONING_PARSERS:
                raise ValueError(f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}, got {self.reasoning_parser!r}")
            end = REASONING_PARSERS[self.reasoning_parser]
            if self.reasoning_end not in (None, end):
                raise ValueError(f"reasoning_parser {self.reasoning_parser!r} ends reasoning at {end!r}, but reasoning_end is {self.reasoning_end!r}")
            self.reasoning_end = end
        cost = self.speculative_verify_cost
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < float("inf")):
            raise ValueError(f"speculative_verify_cost must be None or a number >= 0, got {cost!r}")
        if self.grammar_compile_timeout is not None and self.grammar_compile_timeout <= 0:
            raise ValueError(f"grammar_compile_timeout must be > 0, got {self.grammar_compile_timeout!r}")

    def replace(self, **changes: Any) -> EngineArgs:
        return dataclasses.replace(self, **changes)
