"""Differential test against an independent implementation: outlines-core's ``Index``.

For each regex we walk sample strings token by token (SmolLM2 tokenization) and, at every state
visited, compare formcast's allowed-token set with outlines-core's. outlines-core builds its
index from the same token byte strings, so any difference is a bug in one of the two.

outlines-core 0.2.14 drops some transitions out of accepting states (for ``1(a5)?`` it allows
only EOS after ``1``), so a token formcast allows and outlines-core does not is settled by a
third judge: the text so far, plus the token, plus formcast's shortest completion after it, must
``re.fullmatch``. A token outlines-core allows and formcast does not is always a failure.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import require_optional
from grammar import GrammarMatcher, allocate_token_bitmask, compile_regex, unpack_bitmask

outlines_core = require_optional("outlines_core")

# outlines-core reads \d, \w and \s as Unicode classes (Arabic-Indic digits match \d there), while
# formcast gives them re.ASCII's meaning, so the patterns spell ASCII classes out.
CASES = [
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", ["2024-01-31", "1999-12-01"]),
    (r"[a-z]{3,8}@[a-z]{2,6}\.(com|org|net)", ["alice@mail.com", "bob@xy.org"]),
    (r"(\+1 )?\([0-9]{3}\) [0-9]{3}-[0-9]{4}", ["(555) 123-4567", "+1 (212) 555-0100"]),
    (r"(true|false|null|-?(0|[1-9][0-9]*)(\.[0-9]+)?)", ["true", "-12.5", "0"]),
    (r"[A-Z][a-z]+( [A-Z][a-z]+)*", ["Hello World", "Marie Curie"]),
    (r"v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?", ["v1.2.3", "v10.0.1-rc.1"]),
    (r'"([^"\\]|\\.)*"', ['"hello there"', '"a \\"quoted\\" word"']),
    (r"[Ss][Ee][Ll][Ee][Cc][Tt] [a-z_]+ [Ff][Rr][Oo][Mm] [a-z_]+", ["SELECT a FROM t", "select name from users"]),
    (r"[^\n]{0,20}\n", ["any line here\n"]),
    (r"café|naïve|日本語+", ["café", "日本語語"]),
]


@pytest.fixture(scope="module")
def outlines_vocab(smollm2_vocab):
    mapping: dict[bytes, list[int]] = {}
    for i, t in enumerate(smollm2_vocab.token_bytes):
        if t:
            mapping.setdefault(t, []).append(i)
    eos = min(smollm2_vocab.eos_token_ids)
    return outlines_core.Vocabulary(eos, mapping)


def _outlines_allowed(index, state, vocab_size: int, eos_ids) -> np.ndarray:
    allowed = np.zeros(vocab_size, dtype=bool)
    ids = [t for t in (index.get_allowed_tokens(state) or []) if t < vocab_size]
    allowed[ids] = True
    return allowed


@pytest.mark.parametrize("pattern,samples", CASES)
def test_allowed_tokens_equal_outlines_index(pattern, samples, smollm2_vocab, smollm2_tokenizer, outlines_vocab):
    index = outlines_core.Index(pattern, outlines_vocab)
    compiled = compile_regex(pattern, smollm2_vocab)
    V = smollm2_vocab.vocab_size
    eos = min(smollm2_vocab.eos_token_ids)
    mask = allocate_token_bitmask(1, V)
    for text in samples:
        assert re.fullmatch(pattern, text, re.ASCII)
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        m = GrammarMatcher(compiled)
        state = index.get_initial_state()
        for tid in ids + [None]:
            m.fill_next_token_bitmask(mask)
            ours = unpack_bitmask(mask[0], V)
            theirs = _outlines_allowed(index, state, V, smollm2_vocab.eos_token_ids)
            # outlines-core only knows one EOS id; compare the rest exactly and that one EOS.
            other_eos = [e for e in smollm2_vocab.eos_token_ids if e != eos]
            ours[other_eos] = False
            missing = np.flatnonzero(theirs & ~ours)
            assert len(missing) == 0, (
                f"{pattern!r} after {m.num_accepted_tokens} tokens of {text!r}: formcast rejects "
                f"{[smollm2_vocab.token_bytes[i] for i in missing[:8]]}"
            )
            done = smollm2_vocab.decode_bytes(ids[: m.num_accepted_tokens])
            for extra in np.flatnonzero(ours & ~theirs)[:50].tolist():
                if extra == eos:
                    assert re.fullmatch(pattern, done.decode(), re.ASCII)
                    continue
                probe = m.copy()
                assert probe.accept_token(extra)
                completed = done + smollm2_vocab.token_bytes[extra] + probe.shortest_completion()
                assert re.fullmatch(pattern, completed.decode("utf-8"), re.ASCII), (pattern, completed)
            if tid is None:
                assert ours[eos]
                break
            assert m.accept_token(tid)
            state = index.get_next_state(state, tid)
            if state is None:  # outlines-core lost this (valid) transition; nothing left to compare
                break
