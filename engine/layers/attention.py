"""Attention over the paged KV cache, for rows of different lengths in one pass.

Each layer first writes the new tokens' K and V into the pool at ``out_cache_loc``, then every
row attends over its own tokens, read from the pool through ``req_to_token``. The per-step
layout work (which slots each row reads, which rows share a padded block) is done once in
``init_forward_metadata`` and reused by all layers.

* Decode rows (one new token) on the SDPA path share one ``scaled_dot_product_attention`` call
  per group of equal length (no padding: see batch invariance below). ``group_decode_rows``
  (``batch_invariant=False``) groups close lengths instead, a new group starting before the
  padding would exceed ``MAX_PADDING_SHARE`` of the group's real tokens.
* Extend rows (prefill, a suffix after a cached prefix, jump-forward tokens, speculative drafts)
  run one causal SDPA each, the mask aligned to the row's last key (queries sit at the end).

Batch invariance (what greedy speculation needs to be token-identical): a token's attention must
not depend on how many other tokens share its forward. A speculative verification scores k+1
positions of a row at once where plain decoding scores them one forward each; jump-forward
appends a few tokens at once where speculation verifies them among drafts. So every query of a
short extend row after a cached prefix (at most ``MAX_DECODE_LIKE_QUERIES`` tokens) is attended
as its own decode row (over the keys up to itself), through the same kernel as decode rows. On
the CPU the paged kernel computes each query alone, so those numbers are bit-identical to plain
decoding's (measured: bfloat16 SmolLM2 logits differed by up to 0.44 between a 5-token
verification and 5 decode steps through causal SDPA; now equal; float16 through the SDPA path,
equal once groups stopped padding). Prefill rows keep causal SDPA. The linear layers are row-
invariant while a forward multiplies at most ``cpu_linear.MAX_ROWS_F32`` rows (the compiled
loop); beyond that torch's GEMM may round a row differently, so bit-identity across forward
shapes holds for forwards of at most that many tokens (what the tests check).

Padding points at slot 0, which the pool keeps zeroed, and is masked out: a padded key never
contributes, and never reads a freed slot whose contents may be anything.

Decode rows can instead go through a kernel that reads each key and value once, straight from
the pool, without the gathered copy and the padding: on the CPU with a float32 cache the
compiled loop of ``cpu_decode_attention`` (numba), on CUDA the Triton kernel of
``kernels.paged_decode_attention``. The grouped SDPA path is the reference both are tested
against, and serves the remaining cases (a float16 cache on the CPU, no numba).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kernels import paged_decode_attention

from . import cpu_decode_attention

from ..model_executor.forward_batch import ForwardBatch

MAX_PADDING_SHARE = 0.3
MAX_DECODE_GROUPS = 8
# Extend rows after a cached prefix with at most this many tokens attend query by query, as
# decode rows do (see the module docstring: batch invariance).
MAX_DECODE_LIKE_QUERIES = 64


@dataclass
class DecodeGroup:
    token_index: torch.Tensor  # [b] positions of the rows' query tokens among the flat tokens
    kv_index: torch.Tensor  # [b * L] KV slots, row-major; 0 in the padding
    max_len: int
    mask: torch.Tensor | None  # [b, 1, 1, L] True where a key is real; None without padding


@dataclass
class ExtendRow:
    q_start: int
    q_len: int
    kv_index: torch.Tensor  # [S] the row's KV slots, prefix and new tokens
    mask: torch.Tensor | None  # [q_len, S] causal, aligned at the end; None when S == q_len


@dataclass
class PagedDecode:
    """Decode rows for a paged kernel: their slots flattened, no padding."""

    kernel: str  # "numba" (CPU) or "triton" (CUDA)
    token_index: torch.Tensor | None  # positions of the rows' query tokens; None = all tokens, in order
    kv_index: torch.Tensor  # int64, the rows' slots one after another
    kv_start: torch.Tensor  # int64 [rows]
    kv_len: torch.Tensor  # int64 [rows]
    max_len: int


@dataclass
class AttentionMetadata:
    decode_groups: list[DecodeGroup]
    extend_rows: list[ExtendRow]
    paged_decode: PagedDecode | None = None


def group_decode_rows(lengths: list[int]) -> list[list[int]]:
    """Rows (indices into ``lengths``) in groups of similar length, longest first."""
    order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    groups: list[list[int]] = []
    real = 0  # real tokens of the current (last) group
    for r in order:
        if groups:
            group = groups[-1]
            padded = lengths[group[0]] * (len(group) + 1)
            if padded <= (1 + MAX_PADDING_SHARE) * (real + lengths[r]) or len(groups) == MAX_DECODE_GROUPS:
                group.append(r)
                real += lengths[r]
                continue
        groups.append([r])
        real = lengths[r]
    return groups


def equal_length_groups(lengths: list[int]) -> list[list[int]]:
    """Rows (indices into ``lengths``) grouped by equal length: no padding."""
    groups: dict[int, list[int]] = {}
    for r, n in enumerate(lengths):
        groups.setdefault(n, []).append(r)
    return list(groups.values())


@dataclass
class DecodeQuery:
    """One query token attended like a decode row: over the first ``kv_len`` slots of its row."""

    token: int  # position among the flat tokens
    slot: int  # the row's req_to_token index
    kv_len: int


def _queries_decode_like(batch: ForwardBatch, r: int) -> bool:
    """Row ``r``'s queries are attended one by one, as decode rows: a decode row, or a short
    extend after a cached prefix (speculative verification, jump-forward's tokens)."""
    n = batch.extend_seq_lens_cpu[r]
    return n == 1 or (batch.extend_prefix_lens_cpu[r] > 0 and n <= MAX_DECODE_LIKE_QUERIES)


def decode_queries(batch: ForwardBatch) -> list[DecodeQuery]:
    """Every query token attended as a decode row, in flat-token order."""
    out = []
    for r in range(batch.batch_size):
        if not _queries_decode_like(batch, r):
            continue
        start, n, seq = batch.extend_start_loc_cpu[r], batch.extend_seq_lens_cpu[r], batch.seq_lens_cpu[r]
        slot = int(batch.req_pool_indices[r])
        out += [DecodeQuery(start + j, slot, seq - n + j + 1) for j in range(n)]
    return out


class TorchAttention:
    """The attention backend: SDPA over gathered K/V, and a paged decode kernel where one applies
    (``use_paged_kernel``; default: numba on a float32 CPU pool, Triton on CUDA)."""

    def __init__(self, use_paged_kernel: bool | None = None, batch_invariant: bool = True) -> None:
        self.use_paged_kernel = use_paged_kernel
        # SDPA over a padded block rounds differently from SDPA over the real keys (measured in
        # float16), so the invariant reference path groups only queries of equal length.
        self.batch_invariant = batch_invariant

    def _paged_kernel(self, batch: ForwardBatch) -> str | None:
        if self.use_paged_kernel is False:
            return None
        pool = batch.token_to_kv_pool
        if pool.device.type == "cuda":
            return "triton"
        if pool.device.type == "cpu" and pool.dtype in (torch.float32, torch.bfloat16) and cpu_decode_attention.available():
            return "numba"
        return None

    def init_forward_metadata(self, batch: ForwardBatch) -> AttentionMetadata:
        table = batch.req_to_token_pool.req_to_token
        queries = decode_queries(batch)
        kernel = self._paged_kernel(batch) if queries else None
        extend = self._extend_rows(batch, table)
        if kernel is not None:
            return AttentionMetadata([], extend, self._paged_decode(batch, table, queries, kernel))
        groups = []
        lengths = [q.kv_len for q in queries]
        for members in equal_length_groups(lengths) if self.batch_invariant else group_decode_rows(lengths):
            groups.append(self._decode_group(table, [queries[i] for i in members]))
        return AttentionMetadata(groups, extend)

    @staticmethod
    def _paged_decode(batch: ForwardBatch, table: torch.Tensor, queries: list[DecodeQuery], kernel: str) -> PagedDecode:
        device = table.device
        lens = [q.kv_len for q in queries]
        slots = torch.cat([table[q.slot, : q.kv_len] for q in queries])
        starts = [0] * len(queries)
        for i in range(1, len(queries)):
            starts[i] = starts[i - 1] + lens[i - 1]
        long = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
        all_tokens = len(queries) == batch.num_tokens
        token_index = None if all_tokens else long([q.token for q in queries])
        return PagedDecode(kernel, token_index, slots, long(starts), long(lens), max(lens))

    @staticmethod
    def _extend_rows(batch: ForwardBatch, table: torch.Tensor) -> list[ExtendRow]:
        extend = []
        for r in range(batch.batch_size):
            n = batch.extend_seq_lens_cpu[r]
            if _queries_decode_like(batch, r):
                continue
            seq = batch.seq_lens_cpu[r]
            slots = table[int(batch.req_pool_indices[r]), :seq]
            mask = None
            if seq != n:
                q_pos = torch.arange(seq - n, seq, device=table.device).unsqueeze(1)
                mask = torch.arange(seq, device=table.device).unsqueeze(0) <= q_pos
            extend.append(ExtendRow(batch.extend_start_loc_cpu[r], n, slots, mask))
        return extend

    @staticmethod
    def _decode_group(table: torch.Tensor, queries: list[DecodeQuery]) -> DecodeGroup:
        device = table.device
        lens = [q.kv_len for q in queries]
        longest = max(lens)
        token_index = torch.tensor([q.token for q in queries], dtype=torch.int64, device=device)
        slots = table[torch.tensor([q.slot for q in queries], dtype=torch.int64, device=device), :longest]
        mask = None
        if min(lens) != longest:
            real = torch.arange(longest, device=device).unsqueeze(0) < torch.tensor(lens, device=device).unsqueeze(1)
            slots = torch.where(real, slots, torch.zeros_like(slots))
            mask = real[:, None, None, :]
        return DecodeGroup(token_index, slots.reshape(-1), longest, mask)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """q [T, heads, d], k/v [T, kv_heads, d] of the new tokens -> attention output [T, heads, d]."""
        pool = batch.token_to_kv_pool
        pool.set_kv(layer, batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.k_buffer[layer], pool.v_buffer[layer]
        meta: AttentionMetadata = batch.attn_metadata
        out = torch.empty_like(q)
        heads, dim = q.shape[1], q.shape[2]
        if meta.paged_decode is not None:
            self._paged_decode_forward(q, k_buf, v_buf, meta.paged_decode, out)
        for g in meta.decode_groups:
            b = g.token_index.numel()
            qg = q.index_select(0, g.token_index).view(b, heads, 1, dim)
            kg = k_buf.index_select(0, g.kv_index).view(b, g.max_len, -1, dim).transpose(1, 2)
            vg = v_buf.index_select(0, g.kv_index).view(b, g.max_len, -1, dim).transpose(1, 2)
            og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, enable_gqa=True)
            out.index_copy_(0, g.token_index, og.view(b, heads, dim))
        for row in meta.extend_rows:
            qr = q[row.q_start : row.q_start + row.q_len].transpose(0, 1).unsqueeze(0)
            kr = k_buf.index_select(0, row.kv_index).transpose(0, 1).unsqueeze(0)
            vr = v_buf.index_select(0, row.kv_index).transpose(0, 1).unsqueeze(0)
            causal = row.mask is None
            orow = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=row.mask, is_causal=causal, enable_gqa=True)
            out[row.q_start : row.q_start + row.q_len] = orow[0].transpose(0, 1)
        return out

    @staticmethod
    def _paged_decode_forward(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, pd: PagedDecode, out: torch.Tensor) -> None:
        heads, dim, kv_heads = q.shape[1], q.shape[2], k_buf.shape[1]
        qd = (q if pd.token_index is None else q.index_select(0, pd.token_index)).contiguous()
        od = out if pd.token_index is None else torch.empty_like(qd)
        if pd.kernel == "triton":
            paged_decode_attention(qd, k_buf, v_buf, pd.kv_index, pd.kv_start, pd.kv_len, od, max_len=pd.max_len)
        else:
            bf16 = k_buf.dtype == torch.bfloat16
            rows = (lambda t: t.view(-1, dim).view(torch.uint16)) if bf16 else (lambda t: t.view(-1, dim))  # noqa: E731
            q32 = qd.float() if qd.dtype != torch.float32 else qd
            o32 = od if od.dtype == torch.float32 else torch.empty_like(q32)
            cpu_decode_attention.kernel_for(dim, heads // kv_heads, bf16)(
                q32.numpy(), rows(k_buf).numpy(), rows(v_buf).numpy(), pd.kv_index.numpy(),
                pd.kv_start.numpy(), pd.kv_len.numpy(), o32.numpy(), np.float32(dim**-0.5), kv_heads,
            )  # fmt: skip
            if o32 is not od:
                od.copy_(o32)
        if pd.token_index is not None:
            out.index_copy_(0, pd.token_index, od)
