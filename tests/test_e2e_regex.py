"""End to end: SmolLM2-135M-Instruct generates under regexes; every output must fully match.

One batched ``generate`` call carries every pattern (one grammar per row), greedy and then
sampled, so the real model runs only twice. Budget-aware closing guarantees a match within
``max_new_tokens`` even for unbounded patterns.
"""

from __future__ import annotations

import re

import pytest
import torch

from engine.hf.processor import generate_with_grammars
from grammar import compile_regex

MAX_NEW_TOKENS = 24


def _word_list(vocab, n: int = 300) -> list[str]:
    """``n`` distinct lowercase words (whole-word tokens of the vocabulary, spread over it)."""
    words = sorted(
        {t[1:].decode() for t in vocab.token_bytes if t[:1] == b" " and 5 <= len(t) <= 11 and t[1:].isalpha() and t[1:].islower()}
    )
    step = len(words) // n
    return words[::step][:n]


def _cases(vocab) -> list[tuple[str, str]]:
    words = _word_list(vocab)
    assert len(words) == 300
    return [
        ("When did Apollo 11 land on the moon? Answer with a date.", r"\d{4}-\d{2}-\d{2}"),
        ("Write the email address of John Smith at Example Corp.", r"[a-z0-9._%+-]+@[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,6}"),
        ("Give a US phone number for a pizza shop.", r"\(\d{3}\) \d{3}-\d{4}"),
        ("Name one thing you like.", "(" + "|".join(words) + ")"),
        ("Say a long word.", r"[a-z]{5,40}"),
        ("What time is lunch?", r"([01]\d|2[0-3]):[0-5]\d"),
        ("Give the IP address of a home router.", r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)"),
        ("What is the price of a coffee?", r"\$\d{1,3}(,\d{3})*\.\d{2}"),
        ("List some colors.", r"(red|green|blue)(, (red|green|blue))*"),
    ]




@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_smollm2_outputs_fullmatch(smollm2_model, smollm2_tokenizer, smollm2_vocab, do_sample):
    cases = _cases(smollm2_vocab)
    grammars = [compile_regex(p, smollm2_vocab) for _, p in cases]
    extra = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if do_sample else {}
    torch.manual_seed(0)
    outs = generate_with_grammars(
        smollm2_model, smollm2_tokenizer, [q for q, _ in cases], grammars,
        max_new_tokens=MAX_NEW_TOKENS, do_sample=do_sample, **extra,
    )
    bad = [(p[:60], out) for (_, p), out in zip(cases, outs) if not re.fullmatch(p, out, re.ASCII)]
    assert not bad, bad
    if not do_sample:
        assert outs[0][:2] in ("19", "20")  # the model does answer: a plausible year, not noise
