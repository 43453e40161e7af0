"""``CudaGraphRunner``: decode steps captured in CUDA graphs, one per batch-size bucket, and replayed.

    graphs = CudaGraphRunner(model_runner, max_batch_size=32)
    graphs.capture()                       # once, after the model and the pools exist
    if graphs.can_run(batch):              # a DECODE batch of at most max_batch_size rows, ...
        out = graphs.replay(batch)         # LogitsProcessorOutput of the batch's real rows

Why: a decode step of a small model is bound by launching its few hundred kernels from Python,
not by reading its weights (measured on an H200: 12.4 ms a step at batch 1 for a 1B Llama-shaped
model whose weights stream in well under a millisecond). A graph launches them all at once.

What is captured: ``model(batch) + compute_logits`` (not sampling) over static buffers
(``input_ids``, ``positions``, ``out_cache_loc``, ``req_pool_indices``, ``seq_lens``) of the
bucket's size. Attention reads each row's keys straight from ``req_to_token``
(``layers.attention.TableDecode``, the Triton kernel of
``formcast_kernels.table_decode_attention`` with a split count fixed per bucket), so nothing in
the captured work depends on host data. Buckets are 1, 2, 4, 8, then every multiple of 8 up to
``max_batch_size`` (itself always a bucket); a batch runs in the smallest bucket that holds it.

Padding: the bucket's rows past the batch's get token 0 at position 0, KV slot 0 and request row
0, length 1. They attend to whatever ``req_to_token[0, 0]`` names (a slot id in range; their
output is dropped) and write their K and V into slot 0, which the pool promises stays zero
(every padded or masked path reads it): the captured work ends by zeroing slot 0 again in every
layer. No real row reads slot 0 in between (slot 0 is never allocated, so it is in no row's keys).

Captured once per bucket, largest first, into one shared memory pool (graphs never run at the
same time, so their intermediates may share memory); each bucket first runs once eagerly, so
Triton compiles and cuBLAS picks its kernels before any capture. The graphs are bound to the
runner's pools: a batch on other pools runs eagerly.

Eligible models (checked once, ``graph_ineligibility``): every layer plain (no sliding window, no
attention soft cap; a logit soft cap is fine), no mixture of experts, no quantized weights, one
RoPE table whatever the lengths (LongRoPE with two tables picks per row from host lengths), no
float16-rounded attention. Eligible batches (``can_run``): DECODE, at most the largest bucket, on
the runner's pools, one logit per row, no hidden states, routed experts or prompt logprobs asked.

``graphs=False`` runs the same logic with the capture replaced by eager calls: ``replay`` copies
into the static buffers and runs the captured function on them. It runs on the CPU (the table
attention there is a masked SDPA) and is how the logic is tested without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..forward.forward_batch import CaptureHiddenMode, ForwardBatch, ForwardMode
from ..layers.attention import AttentionMetadata, TableDecode
from ..layers.ggml_quants import holds_quantized_weights
from ..layers.logits import LogitsProcessorOutput, compute_logits
from ..models.moe import SparseMoeBlock

if TYPE_CHECKING:
    from .model_runner import ModelRunner

# The first buckets; past the last, every multiple of BUCKET_STEP.
SMALL_BUCKETS = (1, 2, 4, 8)
BUCKET_STEP = 8


def batch_size_buckets(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, ... below ``max_batch_size``, then ``max_batch_size`` itself."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    steps = range(2 * BUCKET_STEP, max_batch_size, BUCKET_STEP)
    return [b for b in (*SMALL_BUCKETS, *steps) if b < max_batch_size] + [max_batch_size]


def graph_ineligibility(runner: ModelRunner) -> str | None:
    """Why the runner's model cannot run its decode steps in graphs; None when it can."""
    model, attn = runner.model, runner.attn_backend
    if holds_quantized_weights(model) or model.row_forward is not None:
        return "quantized weights"
    if attn.f16:
        return "float16-rounded attention (ggml numerics)"
    for layer in model.layers:
        if layer.self_attn.window is not None:
            return "a sliding-window layer"
        if layer.self_attn.softcap is not None:
            return "an attention soft cap"
        if isinstance(layer.mlp, SparseMoeBlock):
            return "a mixture of experts"
    if model.rotary is None or model.rotary.switch_at is not None:
        return "RoPE tables chosen per row from host lengths (LongRoPE)"
    if model.rotary_local is not None:
        return "a second RoPE table"
    return None


@dataclass
class _StaticInputs:
    """The buffers a graph reads: the largest bucket's size; a bucket uses their first rows."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor

    @classmethod
    def zeros(cls, size: int, device: torch.device) -> _StaticInputs:
        z = lambda: torch.zeros(size, dtype=torch.int64, device=device)  # noqa: E731
        out = cls(z(), z(), z(), z(), z())
        out.seq_lens.fill_(1)
        return out


@dataclass
class CudaGraphRunner:
    """See the module docstring. ``graphs=False``: no capture, ``replay`` runs the function eagerly."""

    model_runner: ModelRunner
    max_batch_size: int
    graphs: bool = True
    buckets: list[int] = field(init=False)
    enabled: bool = True  # False: ``can_run`` refuses every batch (eager comparisons, benchmarks)
    replays: int = 0  # batches run through the static buffers: what the tests count
    _inputs: _StaticInputs = field(init=False, repr=False)
    _graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict, init=False, repr=False)
    _outputs: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)
    _batches: dict[int, ForwardBatch] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        runner = self.model_runner
        reason = graph_ineligibility(runner)
        if reason is not None:
            raise ValueError(f"this model cannot run in CUDA graphs: {reason}")
        if self.graphs and runner.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device (graphs=False runs the same logic eagerly)")
        cap = min(self.max_batch_size, runner.req_to_token_pool.size)
        self.buckets = batch_size_buckets(cap)
        with torch.inference_mode():  # the buffers are written only under it (replay)
            self._inputs = _StaticInputs.zeros(self.buckets[-1], runner.device)
            for bs in self.buckets:
                self._batches[bs] = self._static_batch(bs)

    def _static_batch(self, bs: int) -> ForwardBatch:
        """The bucket's batch over the static buffers. Its host lists are placeholders (a decode
        row at length 1): an eligible model reads none of them (graph_ineligibility), and the
        real lengths live in ``seq_lens`` on the device."""
        runner, s = self.model_runner, self._inputs
        ones = [1] * bs
        ext = torch.ones(bs, dtype=torch.int64, device=runner.device)
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=s.input_ids[:bs], positions=s.positions[:bs],
            seq_lens=s.seq_lens[:bs], extend_prefix_lens=s.positions[:bs], extend_seq_lens=ext,
            req_pool_indices=s.req_pool_indices[:bs], out_cache_loc=s.out_cache_loc[:bs],
            req_to_token_pool=runner.req_to_token_pool, token_to_kv_pool=runner.token_to_kv_pool,
            seq_lens_cpu=ones, extend_prefix_lens_cpu=[0] * bs, extend_seq_lens_cpu=ones,
            extend_start_loc_cpu=list(range(bs)), num_logits_cpu=ones,
        )  # fmt: skip

    def _splits(self, bs: int) -> int:
        if self.model_runner.device.type != "cuda":
            return 1  # the CPU's table attention has no splits
        from formcast_kernels import table_splits

        cfg = self.model_runner.model_config
        return table_splits(bs, cfg.num_kv_heads, self.model_runner.req_to_token_pool.context_len)

    def _run(self, bs: int) -> torch.Tensor:
        """What a graph holds: the bucket's forward and logits [bs, V], then slot 0 zeroed again."""
        runner, batch = self.model_runner, self._batches[bs]
        table = runner.req_to_token_pool.req_to_token
        decode = TableDecode.build(table, batch.req_pool_indices, batch.seq_lens, self._splits(bs))
        batch.attn_metadata = AttentionMetadata([], [], table_decode=decode)
        hidden = runner.model(batch, runner.attn_backend)
        logits = compute_logits(hidden, runner.model.lm_head, batch, runner.model_config.final_softcap).next_token_logits
        pool = runner.token_to_kv_pool
        pool.k_buffer[:, 0].zero_()  # the padded rows wrote there; the pool's promise is zeros
        pool.v_buffer[:, 0].zero_()
        return logits

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm every bucket up eagerly, then capture them, largest first, into one memory pool
        (``graphs=False``: the warm-up only)."""
        if not self.graphs:
            for bs in self.buckets:
                self._run(bs)
            return
        device = self.model_runner.device
        # Warm up on a side stream, as capture runs on one: lazy initializations (cuBLAS
        # workspaces, Triton compiles) happen here rather than inside a capture.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for bs in self.buckets:
                self._run(bs)
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):  # the largest first: the smaller ones fit in its memory
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA work during the capture (a draft runner's, a
            # mask copy) is neither captured nor an error.
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self._outputs[bs] = self._run(bs)
            self._graphs[bs] = graph
        torch.cuda.synchronize(device)

    def bucket_for(self, batch_size: int) -> int:
        return next(b for b in self.buckets if b >= batch_size)

    def can_run(self, batch: ForwardBatch) -> bool:
        runner = self.model_runner
        return (
            self.enabled
            and batch.forward_mode == ForwardMode.DECODE
            and batch.batch_size <= self.buckets[-1]
            and batch.num_tokens == batch.batch_size
            and batch.token_to_kv_pool is runner.token_to_kv_pool
            and batch.req_to_token_pool is runner.req_to_token_pool
            and (not self.graphs or batch.input_ids.device.type == "cuda")
            and batch.capture_hidden_mode == CaptureHiddenMode.NULL
            and not batch.capture_routed_experts
            and not any(batch.return_input_logprob)
            and all(n == 1 for n in batch.num_logits_cpu)
        )

    @torch.inference_mode()
    def replay(self, batch: ForwardBatch) -> LogitsProcessorOutput:
        """The batch's logits through its bucket's graph (``can_run(batch)`` must hold). The
        returned tensors are the real rows, copied: the next replay overwrites the graph's."""
        bs = batch.batch_size
        bucket = self.bucket_for(bs)
        s = self._inputs
        s.input_ids[:bs].copy_(batch.input_ids)
        s.positions[:bs].copy_(batch.positions)
        s.out_cache_loc[:bs].copy_(batch.out_cache_loc)
        s.req_pool_indices[:bs].copy_(batch.req_pool_indices)
        s.seq_lens[:bs].copy_(batch.seq_lens)
        if bucket > bs:  # an earlier, larger batch left its rows there
            for buf in (s.input_ids, s.positions, s.out_cache_loc, s.req_pool_indices):
                buf[bs:bucket].zero_()
            s.seq_lens[bs:bucket].fill_(1)
        if self.graphs:
            self._graphs[bucket].replay()
            logits = self._outputs[bucket]
        else:
            logits = self._run(bucket)
        self.replays += 1
        return LogitsProcessorOutput(logits[:bs].clone())
