"""Filling the grammar bitmask rows of one step, on a worker thread beside the forward.

Each constrained sampling row gets its allowed tokens; the tokens these depend on were sampled
last step, so the fill overlaps the model's forward. A row with speculative drafts is verified
at several positions: it fills one mask per position, pushing its drafts into the matcher as it
goes (``advanced``: how many; the output step rolls them back and re-accepts what was kept).
A grammar error (e.g. a budget) is reported for its row alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from grammar import GrammarError

if TYPE_CHECKING:
    from ..managers.schedule_batch import ScheduleBatch
    from ..forward.forward_batch import ForwardBatch


def fill_grammar_masks(batch: ScheduleBatch, forward: ForwardBatch) -> tuple[dict[int, str], dict[int, int]]:
    """(errors by sampling row, drafts pushed into each sampling row's matcher): one mask per
    virtual row of ``forward.row_layout`` into ``forward.sampling_info``'s bitmask."""
    info, layout = forward.sampling_info, forward.row_layout
    assert info is not None and layout is not None
    bitmask = info.vocab_mask_numpy()
    errors: dict[int, str] = {}
    advanced: dict[int, int] = {}
    for span in layout.spans:
        v = span.start
        if not info.grammar_rows[v]:
            continue
        req, drafts, forced = batch.reqs[span.row], batch.drafts[span.row].tokens, batch.drafts[span.row].forced
        done = 0
        try:
            for j in range(span.drafts + 1):
                if forced and j < len(drafts) and forced[j]:
                    # Accepted whatever the mask says (jump-forward's token): no mask to compute.
                    bitmask[v + j] = 0
                    bitmask[v + j, drafts[j] >> 5] = np.int32(np.uint32(1 << (drafts[j] & 31)).view(np.int32))
                else:
                    req.grammar.fill_next_token_bitmask(bitmask, v + j, remaining_tokens=max(1, req.remaining_tokens - j))
                if j < len(drafts):
                    if not req.grammar.accept_token(drafts[j]):
                        break
                    done += 1
        except GrammarError as exc:
            errors[span.index] = str(exc)
            bitmask[v : span.stop] = -1
        advanced[span.index] = done
    return errors, advanced
