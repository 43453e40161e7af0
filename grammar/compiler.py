"""IR -> token-level automaton: :class:`CompiledGrammar` (the cached ``compile_*`` entry points
that build one from a constraint are in ``api.py``).

A ``CompiledGrammar`` is immutable from the caller's point of view and shared by every request
using the same constraint: the lazy byte automaton, the vocabulary trie and the per-state mask
cache only grow. Per-request state lives in ``GrammarMatcher``.

Compilation does only parsing and NFA construction; determinization and masks happen on demand,
so time to first mask is parse + NFA + the first state's trie walk (an eager precompute of the
first states' masks is available through ``CompileBudget.eager_mask_seconds``, off by default).
"""

from __future__ import annotations

import threading
import time
import numpy as np

from . import ir
from .automaton import DEAD, AutomatonBudget, LazyAutomaton
from .budget import CompileBudget, charge, compile_scope, steps_used
from .bitmask import bitmask_width, pack_bool_mask
from .completion import CompletionDistance
from .fsm import ByteNFA, build_nfa
from .lru import ByteLRU
from .token_masks import GrammarMasks, vocabulary_masks
from .vocab import TokenVocabulary


# With CompileBudget.eager_mask_seconds > 0, grammars whose NFA has at most this many states
# have the masks of their states nearest the start computed at compile time.
EAGER_MAX_NFA_STATES = 1500
# Budget-aware masks look this many tokens ahead; a larger remaining budget counts as unlimited.
BUDGET_HORIZON = 512


class CompiledGrammar:
    """A constraint compiled against one vocabulary."""

    def __init__(
        self,
        grammar: ir.Grammar | None,
        vocab: TokenVocabulary,
        budget: CompileBudget | None = None,
        *,
        kind: str = "ir",
        source: str = "",
        nfa: ByteNFA | None = None,
    ) -> None:
        """From the IR ``grammar``, or from its already built ``nfa`` (compiled in another
        process or read from disk; ``grammar`` is then None: such grammars carry no check)."""
        self.budget = budget or CompileBudget()
        # The IR is not kept: once the NFA is built nothing reads it, and a JSON schema's IR is
        # tens of thousands of Python objects that every full garbage collection would walk for
        # as long as the grammar is cached (a 16 ms collection inside one MaskBench mask).
        self.compiled_here = grammar is not None  # False: built from arrays (disk, a compile process)
        self.check = grammar.check if grammar is not None else None  # a vocabulary-aware check (uniqueItems)
        self.vocab = vocab
        self.kind = kind
        self.source = source
        self.constraint = None  # the Constraint it was compiled from (set by api.compile_constraint)
        self.vocabulary_masks = vocabulary_masks(vocab)  # per vocabulary, outside the budget (see api)
        if self.check is not None:
            self.check.prepare(vocab.token_bytes)  # its per-vocabulary indexes, built once
        if nfa is not None:
            self.nfa, self.compile_steps = nfa, 0
        else:
            assert grammar is not None
            with compile_scope(self.budget):
                self.nfa = build_nfa(grammar, self.budget.max_nfa_states)
                charge("building the automaton")
                # Work counted for this compile (the front end's too under api's scope): machine-free.
                self.compile_steps = steps_used()
        self.automaton = LazyAutomaton(
            self.nfa,
            AutomatonBudget(max_states=self.budget.max_automaton_states, max_stack_depth=self.budget.max_stack_depth),
        )
        self.trie = self.vocabulary_masks.trie
        self.masks = GrammarMasks(
            self.automaton, self.vocabulary_masks, recursive=self.nfa.recursive,
            nested=self.nfa.has_calls, cache_bytes=self.budget.max_mask_cache_bytes
        )
        self.mask_width = bitmask_width(vocab.vocab_size)
        self._token_next: dict[tuple[int, int], int] = {}
        self._distance: CompletionDistance | None = None
        self._after: ByteLRU[tuple[np.ndarray, np.ndarray]] = ByteLRU(8 << 20, lambda a: a[0].nbytes + a[1].nbytes)
        self._max_after: dict[int, int] = {}
        self._lock = threading.Lock()  # guards the lazily built completion distances
        self.eos_token_ids = frozenset(vocab.eos_token_ids)
        if self.budget.eager_mask_seconds > 0 and self.nfa.num_states <= EAGER_MAX_NFA_STATES:
            self.masks.precompute(time.monotonic() + self.budget.eager_mask_seconds)

    @property
    def initial_state(self) -> int:
        return self.automaton.initial_state

    @property
    def runs_python(self) -> bool:
        """Built before the grammar kernels were compiled: it runs their Python twins for as long
        as it lives (``kernel_tier``), so no cache keeps it past the switch."""
        return self.automaton.runs_python

    # ------------------------------------------------------------------ masks
    def token_mask(self, state: int) -> np.ndarray:
        """Packed int32 mask row of the tokens allowed in ``state`` (cached per state; shared,
        so callers copy it and never write to it)."""
        return self.masks.row(state)

    def budgeted_token_mask(self, state: int, remaining_tokens: int) -> np.ndarray:
        """Tokens after which a complete document still fits in ``remaining_tokens`` tokens in all
        (this one and the final EOS included), assuming any byte can be emitted as one token.
        Falls back to the plain mask when no token meets the budget, so a row is never empty.
        Budgets beyond ``BUDGET_HORIZON`` tokens are treated as unlimited."""
        if remaining_tokens > BUDGET_HORIZON:
            return self.token_mask(state)
        worst = self._max_after.get(state)
        if worst is not None and worst <= remaining_tokens - 2:
            return self.token_mask(state)
        ids, dists = self._distances_after_token(state)
        if len(dists) == 0 or int(dists.max()) <= remaining_tokens - 2:
            return self.token_mask(state)
        budgeted = np.zeros(self.vocab.vocab_size, dtype=bool)
        budgeted[ids[dists <= remaining_tokens - 2]] = True
        if self.automaton.accepting[state]:
            budgeted[self.trie.eos_ids] = True
        if not budgeted.any():
            return self.token_mask(state)
        return pack_bool_mask(budgeted)

    def _distances_after_token(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """Allowed token ids of ``state`` and the shortest completion (bytes) after each."""
        hit = self._after.get(state)
        if hit is None:
            ids, ends = self.masks.allowed_with_end_states(state)
            uniq, inverse = np.unique(ends, return_inverse=True)
            dists = np.minimum(self.distance.distances(uniq), np.iinfo(np.int32).max)[inverse]
            # One int per state answers most later budget checks; the arrays (one entry per
            # allowed token) are kept only for a few recent states.
            self._max_after[state] = int(dists.max()) if len(dists) else 0
            hit = self._after.put(state, (ids, dists.astype(np.int32)))
        return hit

    @property
    def distance(self) -> CompletionDistance:
        if self._distance is None:
            with self._lock:
                if self._distance is None:
                    self._distance = CompletionDistance(self.automaton)
        return self._distance

    # ------------------------------------------------------------------ transitions
    def next_state(self, state: int, token_id: int) -> int:
        """State after ``token_id`` (EOS excluded), or -1 if the token is not allowed."""
        key = (state, token_id)
        nxt = self._token_next.get(key)
        if nxt is None:
            if not 0 <= token_id < self.vocab.vocab_size or token_id in self.vocab.special_token_ids:
                return DEAD
            data = self.vocab.token_bytes[token_id]
            nxt = self.automaton.step_bytes(state, data) if data else DEAD
            self._token_next[key] = nxt
        return nxt

    def step_bytes(self, state: int, data: bytes) -> int:
        """State after the raw bytes ``data``, or -1."""
        return self.automaton.step_bytes(state, data)

    def is_accepting(self, state: int) -> bool:
        return self.automaton.is_accepting(state)

    def forced_bytes(self, state: int, limit: int = 4096) -> bytes:
        """The bytes the grammar admits as the only way forward from ``state`` (stops where
        there is a choice or where the input may end)."""
        automaton = self.automaton
        out = bytearray()
        while not automaton.accepting[state] and len(out) < limit:
            automaton.expand(state)
            row = automaton.table[state]
            live = np.flatnonzero(row >= 0)
            if len(live) != 1:
                break
            out.append(int(live[0]))
            state = int(row[live[0]])
        return bytes(out)

    def shortest_completion(self, state: int) -> bytes:
        """One shortest byte string that completes the match from ``state``."""
        return self.distance.shortest_completion(state)


def compile_grammar(
    grammar: ir.Grammar, vocab: TokenVocabulary, *, budget: CompileBudget | None = None, kind: str = "ir", source: str = ""
) -> CompiledGrammar:
    """Compile an IR grammar (uncached: IR objects are not a stable cache key; the cached
    front-end entry points are in ``api.py``)."""
    return CompiledGrammar(grammar, vocab, budget, kind=kind, source=source)
