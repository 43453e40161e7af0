"""The plain reference for every mask shortcut: each token's bytes stepped through the automaton.

Token-major and vectorized over the whole vocabulary with numpy: no trie, no shortcut, no cache,
no compiled kernel. A token is allowed iff every one of its bytes has a live transition.
"""

from __future__ import annotations

import numpy as np

from grammar import GrammarMatcher
from grammar.bitmask import pack_bool_mask


class ReferenceWalk:
    """The vocabulary laid out token-major once; ``allowed(automaton, state)`` per state."""

    def __init__(self, vocab) -> None:
        ids = [i for i, t in enumerate(vocab.token_bytes) if t and i not in vocab.special_token_ids]
        toks = [vocab.token_bytes[i] for i in ids]
        self.vocab = vocab
        self.ids = np.array(ids, dtype=np.int64)
        self.lengths = np.array([len(t) for t in toks], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.flat = np.frombuffer(b"".join(toks), dtype=np.uint8)
        self.eos = np.array(sorted(vocab.eos_token_ids), dtype=np.int64)

    def allowed(self, automaton, state: int) -> np.ndarray:
        """bool [vocab]: tokens whose bytes all have live transitions from ``state`` (no EOS)."""
        states = np.full(len(self.ids), state, dtype=np.int64)
        alive = np.ones(len(self.ids), dtype=bool)
        for pos in range(int(self.lengths.max())):
            act = np.flatnonzero(alive & (self.lengths > pos))
            if not len(act):
                break
            for s in np.unique(states[act]).tolist():
                automaton.expand(s)
            states[act] = automaton.table[states[act], self.flat[self.offsets[act] + pos]]
            alive[act] = states[act] >= 0
        out = np.zeros(self.vocab.vocab_size, dtype=bool)
        out[self.ids[alive]] = True
        return out

    def row(self, automaton, state: int) -> np.ndarray:
        """The packed int32 row the matcher must produce for ``state`` (EOS when accepting)."""
        return self.row_of(automaton, state, self.allowed(automaton, state))

    def row_of(self, automaton, state: int, allowed: np.ndarray) -> np.ndarray:
        """``row`` from ``allowed(automaton, state)`` already computed (left unchanged)."""
        if automaton.accepting[state]:
            allowed = allowed.copy()
            allowed[self.eos] = True
        return pack_bool_mask(allowed)


def random_walk_check(compiled, vocab, rng, *, walks: int, steps: int, pick=None, ref: ReferenceWalk | None = None) -> int:
    """Compare ``token_mask`` with the reference at every state of random walks (``pick(vocab,
    choices, step, rng)`` chooses each next token; uniform by default); return how many states
    were checked."""
    ref = ref or ReferenceWalk(vocab)
    checked = 0
    for _ in range(walks):
        m = GrammarMatcher(compiled)
        for step in range(steps):
            state = m.state
            allowed = ref.allowed(compiled.automaton, state)  # once per state: the row and the next token's choices
            expected = ref.row_of(compiled.automaton, state, allowed)
            got = compiled.token_mask(state)
            assert np.array_equal(got, expected), f"state {state} (step {step}): words {np.flatnonzero(got != expected)[:10]}"
            checked += 1
            choices = [t for t in np.flatnonzero(allowed)]
            if not choices:
                break
            assert m.accept_token(int(pick(vocab, choices, step, rng) if pick else rng.choice(choices)))
    return checked


def probe_fingerprint(compiled, probes: list[bytes], *, with_steps: bool = False) -> str:
    """A digest of what a compiled grammar answers along ``probes``: each probe's verdict and,
    where it is accepted, the mask, the mask under a budget of 6 tokens (the completion
    distances) and whether the grammar may end there (``with_steps``: the compile's counted
    steps too). Two builds of one constraint that agree give one digest."""
    import hashlib

    h = hashlib.sha256(str(compiled.compile_steps).encode() if with_steps else b"")
    for probe in probes:
        m = GrammarMatcher(compiled)
        ok = m.accept_bytes(probe)
        h.update(bytes([ok]))
        if ok:
            h.update(compiled.token_mask(m.state).tobytes())
            h.update(compiled.budgeted_token_mask(m.state, 6).tobytes())
            h.update(bytes([m.can_terminate()]))
    return h.hexdigest()
