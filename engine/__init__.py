"""formcast.engine: composes ``grammar`` (constraints -> masks) and ``kernels`` (masks -> logits).

Data flow of one constrained decoding step, as built today on top of Hugging Face ``generate``
(``hf_processor.py``); formcast's own ModelRunner/scheduler will follow the same order:

    SamplingParams (sampling_params.py)        validated request options, incl. json_schema/regex/ebnf
      -> grammar.compile_*(..., vocab)          CompiledGrammar, cached per constraint + vocabulary
      -> GrammarMatcher per request             per-request automaton state
    each step:
      matcher.fill_next_token_bitmask(row)      int32 [B, ceil(V/32)], through a torch tensor's .numpy()
      kernels.apply_token_bitmask_inplace       disallowed logits -> -inf (Triton on GPU, torch on CPU)
      Sampler (sampling/)                       penalties, temperature, top-k/top-p/min-p, seeds, logprobs
      matcher.accept_token(next_id)             advance; EOS accepted only where the grammar may end

Entry points: ``hf_processor.FormcastLogitsProcessor`` / ``generate_constrained`` (a drop-in for
``transformers``), ``cli.main`` (``formcast generate``), ``model_files.load_model_and_tokenizer``
(the embedded SmolLM2-135M-Instruct, converted once to a Hugging Face folder).
"""

from .sampling_params import SamplingParams, to_sampling_params

__all__ = ["SamplingParams", "to_sampling_params"]
