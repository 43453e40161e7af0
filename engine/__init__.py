"""formcast.engine: composes ``grammar`` (constraints -> masks) and ``formcast_kernels`` (masks -> logits)
into a batched generation engine.

Data flow::

    Engine.generate(prompt, SamplingParams(json_schema | regex | ebnf | structural_tag, ...))
      entrypoints/engine.py     tokenize + validate in the caller's thread -> Req
      constrained/              GrammarBackend: constraint -> CompiledGrammar (worker pool, cached)
      managers/scheduler.py     continuous batching: admission, chunked prefill, radix prefix cache,
                                retraction; ScheduleBatch -> ForwardBatch (tensors only)
      model_executor/           ModelRunner.forward: models/ + layers/ over the paged KV (mem_cache/)
      (meanwhile, a worker thread: each constrained row's matcher fills its bitmask row)
      sampling/                 Sampler: bitmask (formcast_kernels.apply_token_bitmask_inplace), penalties,
                                temperature / top-k / top-p / min-p, seeds, logprobs
      managers/output_processor matcher.accept_token, finish reasons, jump-forward
      managers/detokenizer.py   incremental text deltas -> the caller (sync or asyncio)

``hf/`` serves ``transformers`` users (a drop-in ``LogitsProcessor`` on the same grammar backend,
the embedded model's files, offline tokenizers). ``entrypoints/cli.py`` is ``formcast``;
``entrypoints/http_server.py`` is ``formcast serve``, the OpenAI-compatible server over one Engine
(``serving_chat.py`` / ``serving_completions.py`` map requests onto ``SamplingParams`` through
``openai_mapping.to_sampling_params``, ``tool_calls.py`` constrains and parses tool calls). ``extract/`` is
``formcast extract`` and ``Engine.extract``: resumable batch jobs over files of records, on one
Engine or through Ray Data (one Engine per actor).
"""

from .sampling_params import SamplingParams

__all__ = ["Engine", "SamplingParams", "to_sampling_params"]


def __getattr__(name: str):  # Engine pulls in torch and the model code: load it when asked
    if name == "Engine":
        from .entrypoints.engine import Engine

        return Engine
    if name == "to_sampling_params":  # the OpenAI mapping lives with the server (entrypoints/)
        from .entrypoints.openai_mapping import to_sampling_params

        return to_sampling_params
    raise AttributeError(name)
