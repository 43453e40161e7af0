"""IR -> token-level automaton: :class:`CompiledGrammar`, and the cached ``compile_*`` entry points.

A ``CompiledGrammar`` is immutable from the caller's point of view and shared by every request
using the same constraint: the lazy byte automaton, the vocabulary trie and the per-state mask
cache only grow. Per-request state lives in ``GrammarMatcher``.

Compilation does only parsing and NFA construction; determinization and masks happen on demand,
so time to first mask is parse + NFA + the first state's trie walk.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from . import ir
from .automaton import DEAD, AutomatonBudget, LazyAutomaton
from .bitmask import BITMASK_DTYPE, bitmask_width, pack_bool_mask
from .completion import CompletionDistance
from .fsm import build_nfa
from .token_masks import mask_computer_for, precompute_masks
from .vocab import TokenVocabulary


# In recursive grammars, states deeper than this share the mask of their top KEEP_TOP_FRAMES
# frames, unless more than MAX_UNCERTAIN_SHARE of the vocabulary could pop below them.
# (Non-recursive grammars have finitely many states and keep the string-region shortcuts.)
TRUNCATE_ABOVE_DEPTH = 3
KEEP_TOP_FRAMES = 2
MAX_UNCERTAIN_SHARE = 0.1
# Grammars whose NFA has at most this many states have their masks computed eagerly.
EAGER_MAX_NFA_STATES = 1500
# Budget-aware masks look this many tokens ahead; a larger remaining budget counts as unlimited.
BUDGET_HORIZON = 512


@dataclass(frozen=True)
class CompileBudget:
    """Limits that hostile constraints hit instead of the machine's memory or a caller's patience."""

    max_nfa_states: int = 2_000_000
    max_compile_seconds: float = 20.0
    # Time spent at compile time computing masks of the states nearest the start (0: all lazy).
    eager_mask_seconds: float = 0.2
    max_automaton_states: int = 250_000
    max_stack_depth: int = 50_000
    max_mask_cache_bytes: int = 64 << 20


class CompiledGrammar:
    """A constraint compiled against one vocabulary."""

    def __init__(
        self,
        grammar: ir.Grammar,
        vocab: TokenVocabulary,
        budget: CompileBudget | None = None,
        *,
        kind: str = "ir",
        source: str = "",
    ) -> None:
        self.budget = budget or CompileBudget()
        self.grammar = grammar
        self.vocab = vocab
        self.kind = kind
        self.source = source
        self.nfa = build_nfa(grammar, self.budget.max_nfa_states, self.budget.max_compile_seconds)
        self.automaton = LazyAutomaton(
            self.nfa,
            AutomatonBudget(max_states=self.budget.max_automaton_states, max_stack_depth=self.budget.max_stack_depth),
        )
        self.masks = mask_computer_for(vocab)
        self.trie = self.masks.trie
        self.mask_width = bitmask_width(vocab.vocab_size)
        self._max_cached_masks = max(16, self.budget.max_mask_cache_bytes // (4 * self.mask_width))
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._token_next: dict[tuple[int, int], int] = {}
        self._distance: CompletionDistance | None = None
        self._after: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._max_after: dict[int, int] = {}
        self._truncated: OrderedDict[int, tuple[np.ndarray, np.ndarray] | bool] = OrderedDict()
        self._truncation_useful = True
        self._truncation_misses = 0
        self._lock = threading.RLock()
        self.eos_token_ids = frozenset(vocab.eos_token_ids)
        # Small automata (most regexes) get all their masks up front; big ones stay lazy.
        if self.budget.eager_mask_seconds > 0 and self.nfa.num_states <= EAGER_MAX_NFA_STATES:
            self._precompute(self.budget.eager_mask_seconds)

    def _precompute(self, seconds: float) -> None:
        """Fill the mask cache for the states nearest the start, within ``seconds``."""
        import time

        rows = precompute_masks(self.masks, self.automaton, time.monotonic() + seconds)
        eos_words = [(int(e) // 32, np.int32(np.uint32(1 << (int(e) % 32)).view(np.int32))) for e in self.trie.eos_ids]
        for state, row in rows.items():
            if self.automaton.accepting[state]:
                for word, bit in eos_words:
                    row[word] |= bit
            self._masks[state] = row

    @property
    def initial_state(self) -> int:
        return self.automaton.initial_state

    # ------------------------------------------------------------------ masks
    def token_mask(self, state: int) -> np.ndarray:
        """Packed int32 mask row of the tokens allowed in ``state`` (cached per state)."""
        with self._lock:
            row = self._masks.get(state)
            if row is not None:
                self._masks.move_to_end(state)
                return row
            row = None
            if (
                self._truncation_useful
                and self.nfa.recursive
                and self.automaton.max_depth(state) > TRUNCATE_ABOVE_DEPTH
                and self.masks._region_of(self.automaton, state) is None  # string-like: own shortcut
            ):
                row = self._truncated_mask(state)
            if row is None:
                allowed, _ = self.masks.allowed(self.automaton, state)
                if self.automaton.accepting[state]:
                    allowed[self.trie.eos_ids] = True
                row = pack_bool_mask(allowed)
            self._masks[state] = row
            if len(self._masks) > self._max_cached_masks:
                self._masks.popitem(last=False)
            return row

    def _truncated_mask(self, state: int) -> np.ndarray | None:
        """The mask of a deeply nested state from the shared mask of its top frames (see
        ``LazyAutomaton.truncate``): tokens that would pop below them are checked against the
        real stack, token-major. None when too many tokens would need that check."""
        top = self.automaton.truncate(state, KEEP_TOP_FRAMES)
        entry = self._truncated.get(top)
        if entry is None:
            allowed, uncertain = self.masks.walk_truncated(self.automaton, top)
            if len(uncertain) > MAX_UNCERTAIN_SHARE * len(self.trie.sorted_ids):
                entry = False
                # Adaptive: a grammar whose truncated states keep leaking (JSON schemas whose
                # only recursion is "any JSON value") stops paying for the attempt.
                self._truncation_misses += 1
                hits = len(self._truncated) - self._truncation_misses
                if self._truncation_misses >= 4 and self._truncation_misses > hits:
                    self._truncation_useful = False
            else:
                uncertain = uncertain[~allowed[self.trie.sorted_ids[uncertain]]]
                entry = (pack_bool_mask(allowed), uncertain)
            self._truncated[top] = entry
            if len(self._truncated) > 1024:
                self._truncated.popitem(last=False)
        if entry is False:
            return None
        packed, uncertain = entry
        row = packed.copy()
        ids: list[int] = []
        if len(uncertain):
            ok = self.masks._simulate(self.automaton, uncertain, np.full(len(uncertain), state, dtype=np.int32), 0)
            ids = self.trie.sorted_ids[uncertain[ok]].tolist()
        if self.automaton.accepting[state]:
            ids += self.trie.eos_ids.tolist()
        if len(self.trie.dup_src) and ids:
            extra = np.isin(self.trie.dup_src, ids)
            ids += self.trie.dup_dst[extra].tolist()
        if ids:
            arr = np.array(ids, dtype=np.int64)
            bits = (np.uint32(1) << (arr & 31).astype(np.uint32)).view(np.int32)
            np.bitwise_or.at(row, arr >> 5, bits)
        return row

    def budgeted_token_mask(self, state: int, remaining_tokens: int) -> np.ndarray:
        """Tokens after which a complete document still fits in ``remaining_tokens`` tokens in all
        (this one and the final EOS included), assuming any byte can be emitted as one token.
        Falls back to the plain mask when no token meets the budget, so a row is never empty.
        Budgets beyond ``BUDGET_HORIZON`` tokens are treated as unlimited."""
        if remaining_tokens > BUDGET_HORIZON:
            return self.token_mask(state)
        with self._lock:
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
            allowed, end_state = self.masks.allowed(self.automaton, state, want_states=True)
            ids = np.flatnonzero(allowed)
            ends = end_state[ids]
            uniq, inverse = np.unique(ends, return_inverse=True)
            dists = np.minimum(self.distance.distances(uniq), np.iinfo(np.int32).max)[inverse]
            hit = (ids.astype(np.int32), dists.astype(np.int32))
            # One int per state answers most later budget checks; the arrays (one entry per
            # allowed token) are kept only for the few most recent states.
            self._max_after[state] = int(dists.max()) if len(dists) else 0
            self._after[state] = hit
            if len(self._after) > 8:
                self._after.popitem(last=False)
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
            with self._lock:
                nxt = self.automaton.step_bytes(state, data) if data else DEAD
            self._token_next[key] = nxt
        return nxt

    def is_accepting(self, state: int) -> bool:
        return self.automaton.is_accepting(state)


def compile_grammar(
    grammar: ir.Grammar, vocab: TokenVocabulary, *, budget: CompileBudget | None = None, kind: str = "ir", source: str = ""
) -> CompiledGrammar:
    """Compile an IR grammar (uncached: IR objects are not a stable cache key; the cached
    front-end entry points are in ``api.py``)."""
    return CompiledGrammar(grammar, vocab, budget, kind=kind, source=source)
