"""The work ``jit_warmup`` runs in its child processes: ``python -m grammar.jit_tasks NAME``
runs one group of kernels once (``strings``: the JSON Schema front end's string and key-set
kernels; ``masks``: every mask route), so numba compiles them into its disk cache.

A module of its own because the tasks import the mask machinery (``token_masks``), which itself
asks ``jit_warmup`` for a warm cache: the warm-up names its tasks by module, not by import.
"""

from __future__ import annotations

import sys


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


def _masks() -> None:
    from .token_masks import VocabularyMasks, warm_up_masks
    from .token_trie import TokenTrie
    from .vocab import TokenVocabulary

    vocab = TokenVocabulary.byte_level()
    warm_up_masks(VocabularyMasks(vocab, TokenTrie.from_vocab(vocab)))  # every mask route once


if __name__ == "__main__":
    {"strings": _strings, "masks": _masks}[sys.argv[1]]()
