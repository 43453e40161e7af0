"""FormcastLogitsProcessor semantics: a tiny random Llama (fast) over the real SmolLM2 vocabulary."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from engine.hf.processor import FormcastLogitsProcessor, generate_constrained, generate_with_grammars
from grammar import GrammarMatcher, allocate_token_bitmask, compile_regex, unpack_bitmask


@pytest.fixture(scope="module")
def tiny_model(smollm2_vocab):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=smollm2_vocab.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaForCausalLM(config).eval()


def _allowed(scores_row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(scores_row)).flatten().tolist())


def _expected(compiled, accepted: list[int]) -> set[int]:
    m = GrammarMatcher(compiled)
    for t in accepted:
        assert m.accept_token(t)
    mask = allocate_token_bitmask(1, compiled.vocab.vocab_size)
    m.fill_next_token_bitmask(mask, 0)
    return set(np.flatnonzero(unpack_bitmask(mask[0], compiled.vocab.vocab_size)).tolist())


def test_first_call_masks_prompt_state_and_later_calls_accept_last_token(smollm2_vocab, smollm2_tokenizer):
    compiled = compile_regex(r"\d{4}-\d{2}", smollm2_vocab)
    proc = FormcastLogitsProcessor(compiled, 2)
    V = smollm2_vocab.vocab_size
    prompt = torch.tensor([[5, 6, 7], [8, 9, 10]])
    scores = proc(prompt, torch.randn(2, V))
    first = _expected(compiled, [])
    assert _allowed(scores[0]) == _allowed(scores[1]) == first
    assert all(chr(c).isdigit() for t in first for c in smollm2_vocab.token_bytes[t])
    one, two = smollm2_tokenizer.convert_tokens_to_ids(["1", "2"])
    scores = proc(torch.cat([prompt, torch.tensor([[one], [two]])], 1), torch.randn(2, V))
    assert _allowed(scores[0]) == _expected(compiled, [one])
    assert proc.matchers[1].num_accepted_tokens == 1 and proc.rejected_rows() == []


def test_logits_wider_than_vocab_are_masked(smollm2_vocab):
    compiled = compile_regex(r"[a-z]+", smollm2_vocab)
    proc = FormcastLogitsProcessor(compiled)
    scores = proc(torch.tensor([[1]]), torch.zeros(1, smollm2_vocab.vocab_size + 77))
    assert not torch.isfinite(scores[0, smollm2_vocab.vocab_size :]).any()
    assert _allowed(scores[0]) == _expected(compiled, [])


def test_terminated_rows_allow_only_eos_and_pad(smollm2_vocab, smollm2_tokenizer):
    g_short = compile_regex("a", smollm2_vocab)
    g_long = compile_regex("a+", smollm2_vocab)
    pad = 7  # pad distinct from EOS: generate feeds pad tokens into finished rows
    proc = FormcastLogitsProcessor([g_short, g_long], pad_token_id=pad)
    a = smollm2_tokenizer.convert_tokens_to_ids("a")
    V = smollm2_vocab.vocab_size
    ids = torch.tensor([[1], [1]])
    proc(ids, torch.randn(2, V))
    ids = torch.cat([ids, torch.tensor([[a], [a]])], 1)
    scores = proc(ids, torch.randn(2, V))
    assert _allowed(scores[0]) == set(smollm2_vocab.eos_token_ids)  # "a" complete: only EOS
    ids = torch.cat([ids, torch.tensor([[2], [a]])], 1)
    scores = proc(ids, torch.randn(2, V))
    assert proc.matchers[0].is_terminated()
    assert _allowed(scores[0]) == set(smollm2_vocab.eos_token_ids) | {pad}
    assert a in _allowed(scores[1])
    ids = torch.cat([ids, torch.tensor([[pad], [a]])], 1)  # the pad fed to the finished row is ignored
    scores = proc(ids, torch.randn(2, V))
    assert _allowed(scores[0]) == set(smollm2_vocab.eos_token_ids) | {pad}
    assert proc.rejected_rows() == []


def test_rejected_token_marks_row_and_new_prompt_resets(smollm2_vocab, smollm2_tokenizer):
    proc = FormcastLogitsProcessor(compile_regex(r"\d+", smollm2_vocab))
    V = smollm2_vocab.vocab_size
    a = smollm2_tokenizer.convert_tokens_to_ids("a")
    proc(torch.tensor([[1, 1]]), torch.randn(1, V))
    scores = proc(torch.tensor([[1, 1, a]]), torch.randn(1, V))
    assert proc.rejected_rows() == [0]
    assert _allowed(scores[0]) == set(smollm2_vocab.eos_token_ids)
    scores = proc(torch.tensor([[1, 1, 1, 1, 1]]), torch.randn(1, V))  # not previous + 1: a new generation
    assert proc.rejected_rows() == [] and proc.matchers[0].num_accepted_tokens == 0
    assert _allowed(scores[0]) == _expected(proc.matchers[0].compiled, [])


def test_argument_checks(smollm2_vocab):
    compiled = compile_regex("a", smollm2_vocab)
    with pytest.raises(ValueError, match="batch_size"):
        FormcastLogitsProcessor([compiled, compiled], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        FormcastLogitsProcessor(compiled, max_new_tokens=0)
    proc = FormcastLogitsProcessor(compiled, 2)
    with pytest.raises(ValueError, match="beam search"):
        proc(torch.tensor([[1]] * 4), torch.randn(4, smollm2_vocab.vocab_size))
    with pytest.raises(ValueError, match="exactly one"):
        generate_constrained(None, None, "x", regex="a", ebnf='root ::= "a"', vocab=smollm2_vocab)


def test_budget_aware_closing_with_random_model(tiny_model, smollm2_tokenizer, smollm2_vocab):
    """A random model samples anything allowed; the budget forces every row to close in time."""
    torch.manual_seed(1)
    patterns = [r"\d{4}-\d{2}-\d{2}", r"[a-z]{5,40}", r"(ab|cd)+e", r"x(y|z){3,}"]
    grammars = [compile_regex(p, smollm2_vocab) for p in patterns]
    prompts = ["date", "a word please", "pattern", "xyz"]
    outs = generate_with_grammars(
        tiny_model, smollm2_tokenizer, prompts, grammars, max_new_tokens=12, chat=False, do_sample=True, top_k=0
    )
    for p, out in zip(patterns, outs):
        assert re.fullmatch(p, out, re.ASCII), (p, out)


def test_greedy_generate_constrained_batch_left_padding(tiny_model, smollm2_tokenizer, smollm2_vocab):
    prompts = ["one", "a much longer prompt that forces padding of the first row"]
    outs = generate_constrained(
        tiny_model, smollm2_tokenizer, prompts, regex=r"(yes|no|maybe)", max_new_tokens=6, vocab=smollm2_vocab
    )
    assert len(outs) == 2 and all(o in ("yes", "no", "maybe") for o in outs)
    # Greedy decoding of the same prompt alone gives the same text: padding does not leak in.
    alone = generate_constrained(tiny_model, smollm2_tokenizer, prompts[1], regex=r"(yes|no|maybe)", max_new_tokens=6)
    assert alone == outs[1:]


def test_budget_error_in_one_row_aborts_only_that_row(smollm2_vocab, smollm2_tokenizer):
    from grammar.compiler import CompileBudget

    # Row 0's automaton may only ever grow to a handful of states; row 1 is unconstrained text.
    tiny = compile_regex(r"[a-z]{1,60}", smollm2_vocab, budget=CompileBudget(max_automaton_states=3, eager_mask_seconds=0))
    roomy = compile_regex(r"[a-z]{1,60}", smollm2_vocab)
    proc = FormcastLogitsProcessor([tiny, roomy], 2)
    V = smollm2_vocab.vocab_size
    scores = proc(torch.tensor([[5], [5]]), torch.randn(2, V))
    assert proc.errors[0] is not None and "states" in proc.errors[0]
    assert _allowed(scores[0]) <= set(smollm2_vocab.eos_token_ids) | {2}
    assert proc.errors[1] is None and _allowed(scores[1]) == _expected(roomy, [])
    assert proc.rejected_rows() == [0]
