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
as its own decode query (over the keys up to itself), through the same kernel as decode rows. On
the CPU the paged kernel computes each query alone, so those numbers are bit-identical to plain
decoding's (measured: bfloat16 SmolLM2 logits differed by up to 0.44 between a 5-token
verification and 5 decode steps through causal SDPA; now equal; float16 through the SDPA path,
equal once groups stopped padding). Prefill rows keep causal SDPA, except with a cache dtype in
``EVERY_QUERY_DECODE_LIKE`` (bfloat16) on the CPU's paged kernel: there every query, prefill
included, attends alone (consecutive queries of a row share one run of slots), so a prompt's
last rows computed after a cached prefix equal the same rows of a whole prefill (bfloat16 argmax
ties flip at the difference; float32 moves by ~1e-6 and keeps SDPA's speed). That costs about
twice the prefill time, so it is opt-in (``set_row_invariant_prefill``, the Engine's
``enable_deterministic_inference``). The linear layers of a model loaded for the CPU are
row-invariant at every row count (``panel_linear``: its matrices are packed at load); a plain
float tensor that reaches ``cpu_linear`` is so up to ``cpu_linear.MAX_ROWS_F32`` rows, and at
every row count for bfloat16 when that switch is on.

Quantized models (GGUF files, ``quantization=``; ``TorchAttention(every_query_alone=True)``)
attend every query alone on the CPU's paged kernel, prefill included, over a float32 pool too:
their activations are quantized to 8-bit blocks before each product, which turns SDPA's ~1e-7
difference from the kernel into other codes and greedy outputs that changed with batching, the
prefix cache and speculation. With ``ggml_quants``' loops at every row count, a quantized model's
rows are bit-identical whatever their forward (a 256-token SmolLM2 Q4_1 prefill: 0.6x the speed).

A layer may attend within a sliding window (``forward(..., window=w)``: a query at position p sees
the keys at p - w + 1 .. p, as transformers' sliding layers do), scale queries by other than
head_dim ** -0.5 and soft-cap its scores (Gemma 2: cap * tanh(s / cap); the CPU's paged kernel
caps in its loop, other paths spell the softmax out since SDPA and the Triton kernel cannot).
Every layer keeps every token's K and V in the pool, so the prefix cache and chunked prefill work
unchanged; a windowed layer only reads fewer of them. The metadata of each (window, soft-capped
on CUDA) variant is built once per forward, on first use, and shared by the layers.

float16 attention (``TorchAttention(f16=True)``, GGUF models with ``FORMCAST_GGML_NUMERICS=1``): llama.cpp's CPU backend keeps K and
V in float16 and converts Q and the softmax probabilities to float16 for its two products, which
moves a SmolLM2 layer's output by ~1% of its range, and through the activations' 8-bit blocks,
greedy tokens. So K, V and Q are rounded to float16 values (the pool stays float32) and the
probabilities too, normalized, before they weight V (a variant of the decode kernel, and the
spelled-out path instead of SDPA for extend rows).

Padding points at slot 0, which the pool keeps zeroed, and is masked out: a padded key never
contributes, and never reads a freed slot whose contents may be anything.

Decode rows can instead go through a kernel that reads each key and value once, straight from
the pool, without the gathered copy and the padding: on the CPU with a float32 cache the
compiled loop of ``cpu_decode_attention`` (numba), on CUDA the Triton kernel of
``formcast_kernels.paged_decode_attention``. The grouped SDPA path is the reference both are tested
against, and serves the remaining cases (a float16 cache on the CPU, no numba).

CUDA graphs (``model_executor.cuda_graph_runner``): metadata whose ``table_decode`` is set makes
every token a decode row read straight from ``req_to_token`` through static device tensors
(``TableDecode``; plain layers only), so a captured forward replays for any lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from formcast_kernels import PagedRows, paged_decode_attention

from . import cpu_decode_attention, cpu_linear

from ..forward.forward_batch import ForwardBatch

MAX_PADDING_SHARE = 0.3
MAX_DECODE_GROUPS = 8
# Extend rows after a cached prefix with at most this many tokens attend query by query, as
# decode rows do (see the module docstring: batch invariance).
MAX_DECODE_LIKE_QUERIES = 64
# Cache dtypes whose every query, prefill included, attends alone through the CPU's paged kernel
# (see the module docstring: row invariance of prefill).
EVERY_QUERY_DECODE_LIKE: tuple[torch.dtype, ...] = ()  # (torch.bfloat16,) with set_row_invariant_prefill


def set_row_invariant_prefill(enabled: bool) -> None:
    """bfloat16 prompt rows computed alone in attention and in the linear layers (the Engine's
    ``enable_deterministic_inference``): row invariance of prefill at about twice its time."""
    global EVERY_QUERY_DECODE_LIKE
    dtypes = (torch.bfloat16,) if enabled else ()
    EVERY_QUERY_DECODE_LIKE = dtypes
    cpu_linear.ROW_INVARIANT_DTYPES = dtypes


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
    # (window, soft-capped on CUDA) -> the metadata of that layer kind; (None, False) is this one.
    variants: dict[tuple[int | None, bool], AttentionMetadata] = field(default_factory=dict)
    # Set (by the CUDA graph runner) instead of everything above: see TableDecode.
    table_decode: TableDecode | None = None


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
    """One query token attended like a decode row: over the first ``kv_len`` slots of its row
    (the last ``window`` of them in a sliding-window layer)."""

    token: int  # position among the flat tokens
    slot: int  # the row's req_to_token index
    kv_len: int


def _queries_decode_like(batch: ForwardBatch, r: int, every_row: bool = False) -> bool:
    """Row ``r``'s queries are attended one by one, as decode rows: a decode row, or a short
    extend after a cached prefix (speculative verification, jump-forward's tokens), or any row
    with ``every_row``."""
    n = batch.extend_seq_lens_cpu[r]
    return every_row or n == 1 or (batch.extend_prefix_lens_cpu[r] > 0 and n <= MAX_DECODE_LIKE_QUERIES)


def decode_queries(batch: ForwardBatch, every_row: bool = False) -> list[DecodeQuery]:
    """Every query token attended as a decode row, in flat-token order."""
    out = []
    for r in range(batch.batch_size):
        if not _queries_decode_like(batch, r, every_row):
            continue
        start, n, seq = batch.extend_start_loc_cpu[r], batch.extend_seq_lens_cpu[r], batch.seq_lens_cpu[r]
        slot = int(batch.req_pool_indices[r])
        out += [DecodeQuery(start + j, slot, seq - n + j + 1) for j in range(n)]
    return out


class TorchAttention:
    """The attention backend: SDPA over gathered K/V, and a paged decode kernel where one applies
    (``use_paged_kernel``; default: numba on a float32 CPU pool, Triton on CUDA)."""

    def __init__(
        self, use_paged_kernel: bool | None = None, batch_invariant: bool = True, f16: bool = False, every_query_alone: bool = False
    ) -> None:  # fmt: skip
        self.use_paged_kernel = use_paged_kernel
        # Every query of every row through the CPU's paged kernel, whatever the pool's dtype: the
        # models with quantized weights (see "Quantized models" in the module docstring).
        self.every_query_alone = every_query_alone
        # llama.cpp's precision (GGUF models): see "float16 attention" in the module docstring.
        self.f16 = f16
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

    def init_forward_metadata(self, batch: ForwardBatch, window: int | None = None, softcap: bool = False) -> AttentionMetadata:
        """The layout of ``batch`` for layers attending within ``window`` keys (None: all);
        ``softcap``: for soft-capped layers, whose decode rows stay off the Triton kernel (it has
        no soft cap; the CPU's kernel has)."""
        table = batch.req_to_token_pool.req_to_token
        kernel = self._paged_kernel(batch)
        kernel = None if softcap and kernel == "triton" else kernel
        every_row = kernel == "numba" and (self.every_query_alone or batch.token_to_kv_pool.dtype in EVERY_QUERY_DECODE_LIKE)
        queries = decode_queries(batch, every_row)
        kernel = kernel if queries else None
        extend = self._extend_rows(batch, table, window, every_row)
        if kernel is not None:
            return AttentionMetadata([], extend, self._paged_decode(batch, table, queries, kernel, window))
        groups = []
        lengths = [_visible(q.kv_len, window)[1] for q in queries]
        for members in equal_length_groups(lengths) if self.batch_invariant else group_decode_rows(lengths):
            groups.append(self._decode_group(table, [queries[i] for i in members], window))
        return AttentionMetadata(groups, extend)

    def _metadata(self, batch: ForwardBatch, window: int | None, softcap: float | None) -> AttentionMetadata:
        meta: AttentionMetadata = batch.attn_metadata
        # A soft cap changes the layout only where it keeps decode rows off the Triton kernel.
        capped = softcap is not None and self._paged_kernel(batch) == "triton"
        if window is None and not capped:
            return meta
        key = (window, capped)
        found = meta.variants.get(key)
        if found is None:
            found = meta.variants[key] = self.init_forward_metadata(batch, window, softcap=capped)
        return found

    @staticmethod
    def _paged_decode(
        batch: ForwardBatch, table: torch.Tensor, queries: list[DecodeQuery], kernel: str, window: int | None = None
    ) -> PagedDecode:
        device = table.device
        spans = [_visible(q.kv_len, window) for q in queries]
        lens = [n for _, n in spans]
        # Consecutive queries of one row from the same first key share one run of slots (a
        # prefill's queries attend alone: one run, not a copy per query).
        pieces, starts, offset, i = [], [], 0, 0
        while i < len(queries):
            slot, lo = queries[i].slot, spans[i][0]
            j = i + 1
            while j < len(queries) and queries[j].slot == slot and spans[j][0] == lo:
                j += 1
            end = lo + max(lens[i:j])
            pieces.append(table[slot, lo:end])
            starts += [offset] * (j - i)
            offset += end - lo
            i = j
        slots = torch.cat(pieces)
        long = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
        all_tokens = len(queries) == batch.num_tokens
        token_index = None if all_tokens else long([q.token for q in queries])
        return PagedDecode(kernel, token_index, slots, long(starts), long(lens), max(lens))

    @staticmethod
    def _extend_rows(batch: ForwardBatch, table: torch.Tensor, window: int | None = None, every_row: bool = False) -> list[ExtendRow]:
        extend = []
        for r in range(batch.batch_size):
            n = batch.extend_seq_lens_cpu[r]
            if _queries_decode_like(batch, r, every_row):
                continue
            seq = batch.seq_lens_cpu[r]
            # keys from the first one the earliest query sees
            lo = 0 if window is None else max(0, seq - n - window + 1)
            slots = table[int(batch.req_pool_indices[r]), lo:seq]
            mask = None
            if seq - lo != n or (window is not None and n > window):
                q_pos = torch.arange(seq - n, seq, device=table.device).unsqueeze(1)
                k_pos = torch.arange(lo, seq, device=table.device).unsqueeze(0)
                mask = k_pos <= q_pos
                if window is not None:
                    mask &= k_pos > q_pos - window
            extend.append(ExtendRow(batch.extend_start_loc_cpu[r], n, slots, mask))
        return extend

    @staticmethod
    def _decode_group(table: torch.Tensor, queries: list[DecodeQuery], window: int | None = None) -> DecodeGroup:
        device = table.device
        spans = [_visible(q.kv_len, window) for q in queries]
        lens = [n for _, n in spans]
        longest = max(lens)
        token_index = torch.tensor([q.token for q in queries], dtype=torch.int64, device=device)
        rows = torch.tensor([q.slot for q in queries], dtype=torch.int64, device=device)
        if any(lo for lo, _ in spans):
            cols = torch.tensor([lo for lo, _ in spans], device=device).unsqueeze(1) + torch.arange(longest, device=device)
            cols = cols.clamp(max=table.shape[1] - 1)
            slots = table[rows.unsqueeze(1), cols]
        else:
            slots = table[rows, :longest]
        mask = None
        if min(lens) != longest:
            real = torch.arange(longest, device=device).unsqueeze(0) < torch.tensor(lens, device=device).unsqueeze(1)
            slots = torch.where(real, slots, torch.zeros_like(slots))
            mask = real[:, None, None, :]
        return DecodeGroup(token_index, slots.reshape(-1), longest, mask)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch,
        *, window: int | None = None, scale: float | None = None, softcap: float | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """q [T, heads, d], k/v [T, kv_heads, d] of the new tokens -> attention output [T, heads, d].
        ``window``: keys seen per query (None: all); ``scale``: of the scores (None: d ** -0.5);
        ``softcap``: scores become softcap * tanh(scores / softcap) before the softmax."""
        pool = batch.token_to_kv_pool
        if self.f16:
            q, k, v = _round_f16(q), _round_f16(k), _round_f16(v)
        pool.set_kv(layer, batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.k_buffer[layer], pool.v_buffer[layer]
        if batch.attn_metadata.table_decode is not None:
            assert window is None and softcap is None and not self.f16, "table decode: plain layers only"
            return table_decode_forward(q, k_buf, v_buf, batch.attn_metadata.table_decode, scale)
        meta = self._metadata(batch, window, softcap)
        out = torch.empty_like(q)
        heads, dim = q.shape[1], q.shape[2]
        if meta.paged_decode is not None:
            self._paged_decode_forward(q, k_buf, v_buf, meta.paged_decode, out, scale, self.f16, softcap)
        for g in meta.decode_groups:
            b = g.token_index.numel()
            qg = q.index_select(0, g.token_index).view(b, heads, 1, dim)
            kg = k_buf.index_select(0, g.kv_index).view(b, g.max_len, -1, dim).transpose(1, 2)
            vg = v_buf.index_select(0, g.kv_index).view(b, g.max_len, -1, dim).transpose(1, 2)
            og = _attend(qg, kg, vg, g.mask, False, scale, softcap, self.f16)
            out.index_copy_(0, g.token_index, og.view(b, heads, dim))
        for row in meta.extend_rows:
            qr = q[row.q_start : row.q_start + row.q_len].transpose(0, 1).unsqueeze(0)
            kr = k_buf.index_select(0, row.kv_index).transpose(0, 1).unsqueeze(0)
            vr = v_buf.index_select(0, row.kv_index).transpose(0, 1).unsqueeze(0)
            orow = _attend(qr, kr, vr, row.mask, row.mask is None, scale, softcap, self.f16)
            out[row.q_start : row.q_start + row.q_len] = orow[0].transpose(0, 1)
        return out

    @staticmethod
    def _paged_decode_forward(
        q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, pd: PagedDecode, out: torch.Tensor,
        scale: float | None = None, f16: bool = False, softcap: float | None = None,
    ) -> None:  # fmt: skip
        dim = q.shape[2]
        qd = (q if pd.token_index is None else q.index_select(0, pd.token_index)).contiguous()
        od = out if pd.token_index is None else torch.empty_like(qd)
        if pd.kernel == "triton":
            assert softcap is None, "soft-capped layers keep decode rows off the Triton kernel"
            if scale is not None:  # the kernel scales by dim ** -0.5: fold the difference into q
                qd = qd * (scale * dim**0.5)
            paged_decode_attention(qd, k_buf, v_buf, PagedRows(pd.kv_index, pd.kv_start, pd.kv_len, pd.max_len), od)
        else:
            pool = (lambda t: t.view(torch.uint16)) if k_buf.dtype == torch.bfloat16 else (lambda t: t)  # noqa: E731
            q32 = qd.float() if qd.dtype != torch.float32 else qd
            o32 = od if od.dtype == torch.float32 else torch.empty_like(q32)
            cpu_decode_attention.attend(
                q32.numpy(), pool(k_buf).numpy(), pool(v_buf).numpy(), pd.kv_index.numpy(),
                pd.kv_start.numpy(), pd.kv_len.numpy(), o32.numpy(), scale, f16, softcap,
            )  # fmt: skip
            if o32 is not od:
                od.copy_(o32)
        if pd.token_index is not None:
            out.index_copy_(0, pd.token_index, od)


# ------------------------------------------------------------------ CUDA graphs
# Decode metadata with no host data in it, for a forward captured in a CUDA graph and replayed
# (engine/model_executor/cuda_graph_runner.py). The layouts above are host lists whose sizes
# change every step; this one is the static buffers themselves.


@dataclass
class TableDecode:
    """Every token of the batch is a decode row that reads its keys straight from the request
    table: row ``b``'s are ``req_to_token[req_pool_indices[b], :seq_lens[b]]``. Plain layers only
    (no window, no soft cap, not ``f16``). ``num_splits``: the Triton kernel's context splits,
    fixed per batch-size bucket."""

    req_to_token: torch.Tensor  # [R, C]
    req_pool_indices: torch.Tensor  # [B]
    seq_lens: torch.Tensor  # [B]
    num_splits: int = 1
    # req_pool_indices * C: where each row starts in the flattened table, computed once per
    # forward (inside the graph) and shared by the layers; None off CUDA.
    row_start: torch.Tensor | None = None

    @classmethod
    def build(cls, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, num_splits: int) -> TableDecode:
        cuda = req_to_token.device.type == "cuda"
        start = req_pool_indices * req_to_token.shape[1] if cuda else None
        return cls(req_to_token, req_pool_indices, seq_lens, num_splits, start)


def table_decode_forward(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, td: TableDecode, scale: float | None = None
) -> torch.Tensor:
    """q [B, heads, d] (one token per row) -> attention output [B, heads, d], with fixed shapes
    whatever the lengths: the request-table Triton kernel on CUDA; elsewhere (the graph runner's
    logic run eagerly on the CPU) one masked SDPA over the table's full width."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if q.device.type == "cuda":
        from formcast_kernels import table_decode_attention

        out = torch.empty_like(q)
        table_decode_attention(q, k_buf, v_buf, td.req_to_token, td.req_pool_indices, td.seq_lens, out, scale,
                               td.num_splits, row_start=td.row_start)  # fmt: skip
        return out
    width = td.req_to_token.shape[1]
    real = torch.arange(width, device=q.device).unsqueeze(0) < td.seq_lens.unsqueeze(1)  # [B, C]
    # Past a row's end the table holds stale slots whose K/V may be anything (NaN would survive
    # the mask): read slot 0 there, which is finite, and masked out.
    slots = torch.where(real, td.req_to_token.index_select(0, td.req_pool_indices), 0)
    k = k_buf[slots].transpose(1, 2)  # [B, kv_heads, C, d]
    v = v_buf[slots].transpose(1, 2)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=real[:, None, None, :], scale=scale, enable_gqa=True)
    return o.squeeze(2)


def _visible(seq_len: int, window: int | None) -> tuple[int, int]:
    """(first key, number of keys) a query at position seq_len - 1 attends to."""
    if window is None or seq_len <= window:
        return 0, seq_len
    return seq_len - window, window


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
    scale: float | None, softcap: float | None, f16: bool = False,
) -> torch.Tensor:  # fmt: skip
    """SDPA over [b, heads, Lq, d] x [b, kv_heads, S, d]; with ``softcap`` or ``f16`` (the
    probabilities rounded to float16 before they weight V), the same math spelled out (a causal
    mask aligned so the last query sees every key)."""
    if softcap is None and not f16:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, scale=scale)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if causal:
        lq, s = q.shape[2], k.shape[2]
        mask = torch.arange(s, device=q.device).unsqueeze(0) <= torch.arange(s - lq, s, device=q.device).unsqueeze(1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1)
    probs = _round_f16(probs) if f16 else probs.to(q.dtype)
    return torch.matmul(probs, v)


def _round_f16(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to float16 values, kept in its dtype."""
    return x.to(torch.float16).to(x.dtype)
