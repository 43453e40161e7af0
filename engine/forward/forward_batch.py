"""``ForwardBatch``: the tensors of one forward pass, and nothing of the scheduler.

Rows are requests; tokens of all rows are flattened into ``input_ids`` [T] (a decode row
contributes one token, an extend row the tokens it adds after its cached prefix). Row ``r`` owns
tokens ``extend_start_loc[r] .. + extend_seq_lens[r]``; its KV cache afterwards holds
``seq_lens[r] = extend_prefix_lens[r] + extend_seq_lens[r]`` tokens, listed in
``req_to_token_pool.req_to_token[req_pool_indices[r], :seq_lens[r]]``.

Modes (SGLang's names): ``EXTEND`` (prefill, possibly of a suffix after a cached prefix),
``DECODE`` (one token per row), ``MIXED`` (both kinds of rows in one pass), ``TARGET_VERIFY``
(every position of every row is scored) and ``DRAFT_EXTEND`` (the draft model catching up). The
attention backend reads only the per-row lengths, so any mode may mix row shapes. Which positions
get logits is per row (``ForwardInput.num_logits``): the last token of a prefill or decode row,
the drafts + 1 of a speculative row verified inside an ordinary mixed batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from ..sampling.sampling_batch_info import SamplingBatchInfo
    from .row_layout import RowLayout


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    TARGET_VERIFY = auto()
    DRAFT_EXTEND = auto()

    def scores_every_position(self) -> bool:
        """Logits at every input position (verification), not only at each row's last one."""
        return self == ForwardMode.TARGET_VERIFY


class CaptureHiddenMode(IntEnum):
    NULL = 0  # no hidden states
    LAST = 1  # the final-normed hidden state at each row's last position
    FULL = 2  # at every position


@dataclass
class ForwardInput:
    """One request's share of a forward pass, as the scheduler hands it over."""

    req_pool_index: int
    prefix_len: int  # tokens of this request already in the KV cache
    input_ids: Sequence[int]  # tokens to add (one for a decode row)
    out_cache_loc: torch.Tensor  # KV slots for them, allocated by the caller
    return_input_logprob: bool = False
    num_logits: int = 1  # trailing positions to score (a speculative row: its drafts + 1)


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    seq_lens: torch.Tensor  # [B] int64
    extend_prefix_lens: torch.Tensor  # [B]
    extend_seq_lens: torch.Tensor  # [B]
    req_pool_indices: torch.Tensor  # [B]
    out_cache_loc: torch.Tensor  # [T]
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: TokenToKVPool
    sampling_info: SamplingBatchInfo | None = None  # one row per virtual row of ``row_layout``
    row_layout: RowLayout | None = None  # None: every row samples at one position
    return_logprob: bool = False  # some row reports logprobs of its sampled token
    return_input_logprob: list[bool] = field(default_factory=list)  # rows that want prompt logprobs
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
    # Host copies of the lengths, so Python-side loops never wait on a device.
    seq_lens_cpu: list[int] = field(default_factory=list)
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_seq_lens_cpu: list[int] = field(default_factory=list)
    extend_start_loc_cpu: list[int] = field(default_factory=list)
    num_logits_cpu: list[int] = field(default_factory=list)  # scored positions per row
    attn_metadata: Any = None  # filled by the attention backend before the layers run
    # Mixture-of-experts models: when set, the forward leaves each token's routing here,
    # (expert ids [T, moe_layers, top_k] int64, their weights [T, moe_layers, top_k] float32).
    capture_routed_experts: bool = False
    routed_experts: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @classmethod
    def init_new(
        cls,
        inputs: Sequence[ForwardInput],
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: TokenToKVPool,
        *,
        forward_mode: ForwardMode | None = None,
        sampling_info: SamplingBatchInfo | None = None,
        row_layout: RowLayout | None = None,
        return_logprob: bool = False,
        capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL,
    ) -> ForwardBatch:
        """Flatten ``inputs`` into tensors and record each row's new KV slots in ``req_to_token``."""
        assert inputs, "a forward batch needs at least one row"
        device = token_to_kv_pool.device
        prefix = [int(x.prefix_len) for x in inputs]
        ext = [len(x.input_ids) for x in inputs]
        assert all(n > 0 for n in ext), "every row adds at least one token"
        starts, total = [], 0
        for n in ext:
            starts.append(total)
            total += n
        seq = [p + n for p, n in zip(prefix, ext)]
        if forward_mode is None:
            decode_rows = sum(1 for p, n in zip(prefix, ext) if n == 1 and p > 0)
            forward_mode = (
                ForwardMode.DECODE if decode_rows == len(inputs) else ForwardMode.EXTEND if decode_rows == 0 else ForwardMode.MIXED
            )
        ids = [t for x in inputs for t in x.input_ids]
        positions = [p + i for p, n in zip(prefix, ext) for i in range(n)]
        out_loc = inputs[0].out_cache_loc if len(inputs) == 1 else torch.cat([x.out_cache_loc for x in inputs])
        long = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
        batch = cls(
            forward_mode=forward_mode,
            batch_size=len(inputs),
            input_ids=long(ids),
            positions=long(positions),
            seq_lens=long(seq),
            extend_prefix_lens=long(prefix),
            extend_seq_lens=long(ext),
            req_pool_indices=long([x.req_pool_index for x in inputs]),
            out_cache_loc=out_loc.to(device, torch.int64),
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            sampling_info=sampling_info,
            row_layout=row_layout,
            return_logprob=return_logprob,
            return_input_logprob=[x.return_input_logprob for x in inputs],
            capture_hidden_mode=capture_hidden_mode,
            seq_lens_cpu=seq,
            extend_prefix_lens_cpu=prefix,
            extend_seq_lens_cpu=ext,
            extend_start_loc_cpu=starts,
            num_logits_cpu=[min(x.num_logits, n) for x, n in zip(inputs, ext)],
        )
        batch._record_slots()
        return batch

    def _record_slots(self) -> None:
        table = self.req_to_token_pool.req_to_token
        if all(n == 1 for n in self.extend_seq_lens_cpu):
            table[self.req_pool_indices, self.seq_lens - 1] = self.out_cache_loc
            return
        for r in range(self.batch_size):
            start, n = self.extend_start_loc_cpu[r], self.extend_seq_lens_cpu[r]
            slot, prefix = int(self.req_pool_indices[r]), self.extend_prefix_lens_cpu[r]
            table[slot, prefix : prefix + n] = self.out_cache_loc[start : start + n]

    def logit_indices(self) -> torch.Tensor | None:
        """Flat token indices whose logits are computed: each row's last ``num_logits`` tokens
        (every token under ``TARGET_VERIFY``); None when that is every token."""
        if self.forward_mode.scores_every_position() or sum(self.num_logits_cpu) == self.num_tokens:
            return None
        idx = [s + n - k + i for s, n, k in zip(self.extend_start_loc_cpu, self.extend_seq_lens_cpu, self.num_logits_cpu) for i in range(k)]
        return torch.tensor(idx, dtype=torch.int64, device=self.input_ids.device)
