"""The work ``jit_warmup`` runs in its child processes: ``python -m grammar.jit_tasks NAME...``
runs groups of kernels once, in order, so numba compiles them into its disk cache:

- ``core``: the token trie and the determinizer's core (a new automaton, its first
  configuration, whole rows and single cells): what every mask-time kernel calls;
- ``masks``: every mask route (regions, trie walks, token checks) over the byte-level vocabulary;
- ``strings``: the JSON Schema front end's string and key-set kernels (char-DFA products);
- ``tails``: the determinizer's kernels for deep configurations (truncation, splits, siblings,
  live bytes), after waiting for ``core`` to be on disk so that they load it, not compile it again.

``jit_warmup`` runs two lanes, ``core masks`` and ``strings tails``, one process each, so both
cores compile and each kernel compiles once (a kernel's callees are compiled into its own code:
two processes reaching one callee at once would both compile it).

A module of its own because the tasks import the mask machinery (``token_masks``), which itself
asks ``jit_warmup`` for a warm cache: the warm-up names its tasks (``jit_warmup.LANES``) by
module and task name, never by import.
"""

from __future__ import annotations

import sys
import time

CORE_WAIT_SECONDS = 600.0  # past this, ``tails`` compiles what it needs itself


def _strings() -> None:
    from . import char_dfa
    from .json_schema import json_schema_to_grammar

    char_dfa.load_kernels()
    # The JSON schema front end's other kernel uses (string sets, key regions, formats).
    json_schema_to_grammar(
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                                          "b": {"type": "string", "format": "date-time"}},
         "patternProperties": {"^x": {"type": "integer"}}, "propertyNames": {"maxLength": 8}}
    )


def _automaton():  # -> LazyAutomaton
    from .automaton import LazyAutomaton
    from .token_masks import warm_up_nfa

    return LazyAutomaton(warm_up_nfa())


def _core() -> None:
    from .token_trie import TokenTrie
    from .vocab import TokenVocabulary

    TokenTrie.from_vocab(TokenVocabulary.byte_level())
    automaton = _automaton()
    automaton.expand(automaton.initial_state)
    automaton.step_bytes(automaton.initial_state, b'[["')


def _masks() -> None:
    from .token_masks import VocabularyMasks, warm_up_masks
    from .token_trie import TokenTrie
    from .vocab import TokenVocabulary

    vocab = TokenVocabulary.byte_level()
    warm_up_masks(VocabularyMasks(vocab, TokenTrie.from_vocab(vocab)))  # every mask route once


def _core_on_disk() -> bool:
    """Whether numba's cache holds the core's last kernel (``core`` compiles it last)."""
    from . import determinizer as det

    try:
        return bool(det.step_bytes._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - numba internals moved: do not wait
        return True


def _tails() -> None:
    from .token_masks import MIN_SIBLING_LIVE_BYTES, SIBLING_AGREE_DEPTH

    deadline = time.monotonic() + CORE_WAIT_SECONDS
    while not _core_on_disk() and time.monotonic() < deadline:
        time.sleep(0.25)
    automaton = _automaton()
    state = automaton.step_bytes(automaton.initial_state, b'[[[[["')
    automaton.max_depth(state)
    automaton.live_bytes(state)
    automaton.config_size(state)
    automaton.truncate(state, 2)
    automaton.split(state)
    automaton.sibling_of(state, MIN_SIBLING_LIVE_BYTES, SIBLING_AGREE_DEPTH)
    automaton.differing_bytes(automaton.initial_state, automaton.step_bytes(automaton.initial_state, b"["), 2)


TASKS = {"strings": _strings, "core": _core, "masks": _masks, "tails": _tails}

if __name__ == "__main__":
    for name in sys.argv[1:]:
        TASKS[name]()
    # This lane is on disk: with every lane's mark present the cache counts as warm, even when the
    # process that started the lanes has exited meanwhile (a CLI answered from the Python tier).
    from .jit_warmup import mark_lane_done

    mark_lane_done(sys.argv[1:])
