"""The bitmask contract's helpers (``grammar/bitmask.py``) against each other and plain bool arrays."""

from __future__ import annotations

import numpy as np

from grammar.bitmask import allowed_token_ids, pack_bool_mask, tokens_allowed, unpack_bitmask


def test_pack_unpack_and_the_id_lookup_agree_on_every_bit() -> None:
    rng = np.random.default_rng(0)
    for vocab in (1, 31, 32, 33, 1000):
        allowed = rng.random(vocab) < 0.5
        allowed[-1] = True  # the top id of a word (bit 31 is the int32 sign bit when vocab % 32 == 0)
        row = pack_bool_mask(allowed[None])[0]
        assert np.array_equal(unpack_bitmask(row, vocab), allowed)
        assert np.array_equal(allowed_token_ids(row, vocab), np.flatnonzero(allowed))
        ids = rng.integers(0, vocab, size=50).astype(np.int64)
        assert np.array_equal(tokens_allowed(row, ids), allowed[ids])
    everything = np.full(2, -1, dtype=np.int32)
    assert tokens_allowed(everything, np.array([0, 31, 32, 63], np.int64)).all()
