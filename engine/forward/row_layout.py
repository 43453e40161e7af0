"""``RowLayout``: where each row of a batch sits in the forward's logits, and which rows sample.

A row that feeds ``k`` speculative drafts after its own tokens is scored at its last ``k + 1``
positions; every other row at its last one. The scored positions of all rows, in row order, are
the rows of ``LogitsProcessorOutput.next_token_logits``. A row *samples* when what it feeds
reaches the end of its tokens (a row mid-prefill does not). Each sampling row owns ``k + 1``
*virtual rows*, one per scored position, in order: the rows of the batch's ``SamplingBatchInfo``
and of its grammar bitmask. ``spans()`` is that arithmetic written once; the sampling-info
builder, the bitmask filler, the sampler's row selection and the draft verifier all walk it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class SamplingSpan:
    """One sampling row's share of the virtual rows."""

    index: int  # position among the sampling rows (results and mask errors are keyed by it)
    row: int  # the batch row
    start: int  # its first virtual row
    drafts: int  # k: it owns virtual rows start .. start + k (one per draft, then the bonus token)

    @property
    def stop(self) -> int:
        return self.start + self.drafts + 1


@dataclass(frozen=True)
class RowLayout:
    drafts: tuple[int, ...]  # per batch row: drafts fed after its own tokens
    sampling_rows: tuple[int, ...]  # the batch rows that sample, in order

    def num_logits(self, row: int) -> int:
        """Scored positions of batch row ``row``."""
        return self.drafts[row] + 1

    def logit_starts(self) -> list[int]:
        """Index of each batch row's first scored position in the forward's logits."""
        starts, total = [], 0
        for k in self.drafts:
            starts.append(total)
            total += k + 1
        return starts

    @cached_property
    def spans(self) -> tuple[SamplingSpan, ...]:
        out, start = [], 0
        for i, row in enumerate(self.sampling_rows):
            out.append(SamplingSpan(i, row, start, self.drafts[row]))
            start += self.drafts[row] + 1
        return tuple(out)

    @property
    def num_virtual_rows(self) -> int:
        return self.spans[-1].stop if self.spans else 0

    def sampling_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The virtual rows' logits out of the forward's scored positions (all rows' logits)."""
        starts = self.logit_starts()
        rows = [starts[s.row] + j for s in self.spans for j in range(s.drafts + 1)]
        if len(rows) == logits.shape[0]:
            return logits
        return logits.index_select(0, torch.tensor(rows, dtype=torch.int64, device=logits.device))
