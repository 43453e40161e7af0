"""Decode steps in CUDA graphs (engine/model_executor/cuda_graph_runner.py) and the capture-safe
decode attention under them (formcast_kernels/decode_attention_table_triton.py).

Without a GPU: the request-table Triton kernel against the torch reference under Triton's
interpreter (a subprocess: the flag is read at import), on scattered slots, rows of different
lengths, empty splits, and NaN in every slot no row owns (a read past a row's end shows); the
CPU's table attention against the same reference; the runner's logic with the capture replaced by
eager calls (``graphs=False``) on a tiny random Llama in float32: padded buckets give the eager
forward's logits, write the real rows' K and V where the batch says and nowhere else, and leave
KV slot 0 zero; ``can_run`` and the model check refuse what a graph cannot run. With a GPU (tests
named ``gpu``): the real capture, replayed logits against eager ones over several steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.forward.forward_batch import CaptureHiddenMode, ForwardBatch, ForwardInput, ForwardMode
from engine.layers.attention import TableDecode, table_decode_forward
from engine.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from engine.model_executor.cuda_graph_runner import CudaGraphRunner, batch_size_buckets, graph_ineligibility
from engine.model_executor.model_runner import ModelRunner
from engine.models.moe import SparseMoeBlock
from formcast_kernels import PagedRows
from formcast_kernels.decode_attention import paged_decode_attention_reference

from model_loop import write_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
# (heads, kv_heads, dim, table width, rows' lengths, their request rows)
KERNEL_CASES = [[4, 2, 16, 96, [1, 37, 90], [2, 0, 3]], [6, 3, 24, 64, [64, 5], [1, 4]]]


def make_table_case(heads: int, kv_heads: int, dim: int, width: int, lens: list[int], rows: list[int], seed: int, device: str = "cpu"):
    """A pool whose rows' slots are scattered, and whose every other slot holds NaN; a table whose
    entries past each row's length (and in the rows no batch row uses) name those NaN slots."""
    g = torch.Generator().manual_seed(seed)
    slots = sum(lens) + 40
    k = torch.randn(slots, kv_heads, dim, generator=g)
    v = torch.randn(slots, kv_heads, dim, generator=g)
    order = torch.randperm(slots - 1, generator=g) + 1
    used, spare = order[: sum(lens)], order[sum(lens) :]
    k[spare], v[spare] = float("nan"), float("nan")
    k[0], v[0] = 0.0, 0.0
    table = spare[torch.randint(0, spare.numel(), (max(rows) + 2, width), generator=g)]
    at = 0
    for r, n in zip(rows, lens):
        table[r, :n] = used[at : at + n]
        at += n
    q = torch.randn(len(lens), heads, dim, generator=g)
    to = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    return to(q, k, v, table, torch.tensor(rows), torch.tensor(lens), used, torch.tensor([0] + lens[:-1]).cumsum(0))


def table_reference(q, k, v, table, rows, lens, used, starts) -> torch.Tensor:
    ref = torch.empty_like(q)
    paged_decode_attention_reference(q, k, v, PagedRows(used, starts, lens), ref, q.shape[-1] ** -0.5)
    return ref


_KERNEL_SCRIPT = """
import json, os, sys
sys.path.insert(0, os.environ["FORMCAST_ROOT"]); sys.path.insert(0, os.environ["FORMCAST_ROOT"] + "/tests")
import torch
from formcast_kernels.decode_attention_table_triton import table_decode_attention
from test_cuda_graph_runner import make_table_case, table_reference
ok = []
for i, (heads, kv_heads, dim, width, lens, rows) in enumerate(json.loads(sys.argv[1])):
    q, k, v, table, idx, n, used, starts = make_table_case(heads, kv_heads, dim, width, lens, rows, seed=i)
    ref = table_reference(q, k, v, table, idx, n, used, starts)
    for splits, dot in ((1, False), (3, False), (2, True)):  # one split / empty splits / tl.dot
        out = torch.empty_like(q)
        table_decode_attention(q, k, v, table, idx, n, out, dim ** -0.5, splits, use_dot=dot)
        ok.append(bool(torch.allclose(out, ref, atol=1e-5)))
print(json.dumps(ok))
"""


def test_table_kernel_matches_reference_under_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", FORMCAST_ROOT=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _KERNEL_SCRIPT, json.dumps(KERNEL_CASES)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True] * (3 * len(KERNEL_CASES))


def test_table_splits_come_from_the_bucket_and_the_context_only() -> None:
    pytest.importorskip("triton")
    from formcast_kernels import table_splits

    assert table_splits(1, 8, 4096) == 16  # 64 programs wanted per (row, head): 256-token splits
    assert table_splits(32, 8, 4096) == 2
    assert table_splits(64, 8, 4096) == 1
    assert table_splits(1, 8, 100) == 1


@pytest.mark.parametrize("case", range(len(KERNEL_CASES)))
def test_cpu_table_attention_matches_reference(case: int) -> None:
    """The fixed-shape torch path the runner's eager mode takes on the CPU, NaN slots included."""
    heads, kv_heads, dim, width, lens, rows = KERNEL_CASES[case]
    q, k, v, table, idx, n, used, starts = make_table_case(heads, kv_heads, dim, width, lens, rows, seed=case)
    got = table_decode_forward(q, k, v, TableDecode.build(table, idx, n, 1))
    assert torch.allclose(got, table_reference(q, k, v, table, idx, n, used, starts), atol=1e-5)


def test_buckets() -> None:
    assert batch_size_buckets(1) == [1]
    assert batch_size_buckets(5) == [1, 2, 4, 5]
    assert batch_size_buckets(8) == [1, 2, 4, 8]
    assert batch_size_buckets(33) == [1, 2, 4, 8, 16, 24, 32, 33]
    assert batch_size_buckets(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    with pytest.raises(ValueError):
        batch_size_buckets(0)


# ------------------------------------------------------------------ the runner's logic on the CPU


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-graphs"), max_position_embeddings=256)


@pytest.fixture(scope="module")
def runner(folder) -> ModelRunner:
    # 12 request rows: a 9-row batch exists to be refused by 8-row graphs.
    return ModelRunner(folder, dtype="float32", max_total_tokens=2048, max_running_requests=12, cuda_graph_max_bs=8)


class Rows:
    """Requests held in the runner's pools, prefilled eagerly, then decoded one step at a time."""

    def __init__(self, runner: ModelRunner, prompt_lens: list[int]) -> None:
        self.runner = runner
        self.slots = runner.req_to_token_pool.alloc(len(prompt_lens))
        assert self.slots is not None
        self.lens = list(prompt_lens)
        self.held: list[torch.Tensor] = []
        inputs = [ForwardInput(s, 0, [(7 * i + n) % 300 + 3 for i in range(n)], self._alloc(n)) for s, n in zip(self.slots, prompt_lens)]
        out = runner.forward(ForwardBatch.init_new(inputs, *self.pools))
        self.next = out.next_token_logits.argmax(-1).tolist()

    @property
    def pools(self) -> tuple[ReqToTokenPool, TokenToKVPool]:
        return self.runner.req_to_token_pool, self.runner.token_to_kv_pool

    def _alloc(self, n: int) -> torch.Tensor:
        locs = self.runner.token_to_kv_pool.alloc(n)
        assert locs is not None
        self.held.append(locs)
        return locs

    def decode_batch(self, rows: list[int], **options) -> ForwardBatch:  # type: ignore[no-untyped-def]
        inputs = [ForwardInput(self.slots[r], self.lens[r], [self.next[r]], self._alloc(1)) for r in rows]
        return ForwardBatch.init_new(inputs, *self.pools, **options)

    def advance(self, rows: list[int], logits: torch.Tensor) -> None:
        for r, tok in zip(rows, logits.argmax(-1).tolist()):
            self.lens[r] += 1
            self.next[r] = tok

    def release(self) -> None:
        for locs in self.held:
            self.runner.token_to_kv_pool.free(locs)
        self.runner.req_to_token_pool.free(self.slots)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit: slots never written hold whatever torch.empty left, NaN included."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_cpu_runner_has_no_graphs(runner) -> None:
    assert runner.cuda_graph_runner is None  # cuda_graph_max_bs is ignored off CUDA


def test_eager_mode_pads_buckets_and_matches_the_forward(runner) -> None:
    graphs = CudaGraphRunner(runner, 8, graphs=False)
    assert graphs.buckets == [1, 2, 4, 8]
    graphs.capture()
    pool = runner.token_to_kv_pool
    assert not pool.k_buffer[:, 0].any() and not pool.v_buffer[:, 0].any(), "the warm-up re-zeroes slot 0"
    rows = Rows(runner, [5, 40, 17, 90, 3, 61, 12, 33])
    # 3 -> bucket 4, 5 -> 8 (after 8 rows filled every row of the buffers), 1, 8: no padding
    schedule = [list(range(8)), [0, 1, 2], list(range(3, 8)), [4], list(range(8)), [7, 2, 5]]
    for step, members in enumerate(schedule):
        batch = rows.decode_batch(members)
        assert graphs.can_run(batch)
        eager = runner.forward(batch).next_token_logits
        locs = batch.out_cache_loc
        k_eager, v_eager = pool.k_buffer[:, locs].clone(), pool.v_buffer[:, locs].clone()
        pool.k_buffer[:, locs] = 0.0
        pool.v_buffer[:, locs] = 0.0
        k_before, v_before = pool.k_buffer.clone(), pool.v_buffer.clone()
        replays = graphs.replays
        out = graphs.replay(batch)
        assert graphs.replays == replays + 1
        got = out.next_token_logits
        assert got.shape == eager.shape == (len(members), runner.vocab_size)
        assert torch.allclose(got, eager, atol=1e-5, rtol=0), (step, (got - eager).abs().max())
        # the real rows' K and V where the batch put them, equal to the eager forward's ...
        assert torch.allclose(pool.k_buffer[:, locs], k_eager, atol=1e-5) and torch.allclose(pool.v_buffer[:, locs], v_eager, atol=1e-5)
        # ... and nothing else written (the padded rows' slot 0 zeroed again)
        k_before[:, locs], v_before[:, locs] = pool.k_buffer[:, locs], pool.v_buffer[:, locs]
        assert _same_bits(pool.k_buffer, k_before) and _same_bits(pool.v_buffer, v_before), step
        assert not pool.k_buffer[:, 0].any() and not pool.v_buffer[:, 0].any(), step
        # the output is a copy: another replay does not change what the sampler still reads
        kept = got.clone()
        graphs.replay(batch)
        assert torch.equal(got, kept)
        rows.advance(members, eager)
    rows.release()


def test_can_run_refuses_what_a_graph_cannot_run(runner) -> None:
    graphs = CudaGraphRunner(runner, 8, graphs=False)
    rows = Rows(runner, [4] * 9)
    assert graphs.can_run(rows.decode_batch([0, 1]))
    assert not graphs.can_run(rows.decode_batch(list(range(9)))), "larger than the largest bucket"
    assert not graphs.can_run(rows.decode_batch([0], capture_hidden_mode=CaptureHiddenMode.LAST))
    assert not graphs.can_run(rows.decode_batch([0], forward_mode=ForwardMode.TARGET_VERIFY))
    routed = rows.decode_batch([0])
    routed.capture_routed_experts = True
    assert not graphs.can_run(routed)
    logprob = rows.decode_batch([0])
    logprob.return_input_logprob = [True]
    assert not graphs.can_run(logprob)
    scored = rows.decode_batch([0])
    scored.num_logits_cpu = [2]
    assert not graphs.can_run(scored)
    # an extend row (a prompt) and a MIXED batch
    extend = ForwardBatch.init_new([ForwardInput(rows.slots[0], rows.lens[0], [1, 2], rows._alloc(2))], *rows.pools)
    assert extend.forward_mode == ForwardMode.EXTEND and not graphs.can_run(extend)
    mixed = ForwardBatch.init_new([ForwardInput(rows.slots[1], rows.lens[1], [1], rows._alloc(1)),
                                   ForwardInput(rows.slots[2], rows.lens[2], [1, 2], rows._alloc(2))], *rows.pools)  # fmt: skip
    assert mixed.forward_mode == ForwardMode.MIXED and not graphs.can_run(mixed)
    # the graphs are bound to the runner's pools
    cfg = runner.model_config
    other = TokenToKVPool(64, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    foreign = ForwardBatch.init_new([ForwardInput(0, 3, [1], other.alloc(1))], ReqToTokenPool(2, 64), other)
    assert foreign.forward_mode == ForwardMode.DECODE and not graphs.can_run(foreign)
    graphs.enabled = False
    assert not graphs.can_run(rows.decode_batch([0, 1]))
    rows.release()
    with pytest.raises(ValueError, match="CUDA device"):
        CudaGraphRunner(runner, 8)


class _FakeMoe(SparseMoeBlock):
    def __init__(self) -> None:
        nn.Module.__init__(self)


def test_ineligible_models_are_refused(runner) -> None:
    assert graph_ineligibility(runner) is None
    model = runner.model
    attn = model.layers[1].self_attn
    patches = [
        (attn, "window", 16, "sliding-window"),
        (attn, "softcap", 30.0, "soft cap"),
        (model.layers[2], "mlp", _FakeMoe(), "mixture of experts"),
        (model.rotary, "switch_at", 64, "LongRoPE"),
        (model, "row_forward", object(), "quantized"),
        (runner.attn_backend, "f16", True, "float16"),
    ]
    # (not monkeypatch: its undo deletes what it did not find in __dict__, a submodule among them)
    for owner, name, value, reason in patches:
        old = getattr(owner, name)
        setattr(owner, name, value)
        try:
            assert reason in (graph_ineligibility(runner) or ""), name
            with pytest.raises(ValueError, match="cannot run in CUDA graphs"):
                CudaGraphRunner(runner, 8, graphs=False)
        finally:
            setattr(owner, name, old)
    assert graph_ineligibility(runner) is None


def test_options() -> None:
    from engine.entrypoints.engine_args import EngineArgs

    assert EngineArgs.from_options(cuda_graph_max_bs=0).cuda_graph_max_bs == 0
    assert EngineArgs.from_options(disable_cuda_graph=True).disable_cuda_graph
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        EngineArgs.from_options(cuda_graph_max_bs=-1)
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        ModelRunner(model=None, max_total_tokens=8, cuda_graph_max_bs=-2)


# ------------------------------------------------------------------ on a GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_table_kernel_matches_reference(dtype) -> None:
    from formcast_kernels import table_decode_attention, table_splits

    for i, (heads, kv_heads, dim, width, lens, rows) in enumerate(KERNEL_CASES):
        q, k, v, table, idx, n, used, starts = make_table_case(heads, kv_heads, dim, width, lens, rows, seed=i)
        ref = table_reference(q, k, v, table, idx, n, used, starts)
        cuda = [t.cuda() for t in (q, k, v, table, idx, n)]
        q_, k_, v_ = (t.to(dtype) for t in cuda[:3])
        for splits in (1, 3, table_splits(len(lens), kv_heads, width)):
            out = torch.empty_like(q_)
            table_decode_attention(q_, k_, v_, cuda[3], cuda[4], cuda[5], out, dim**-0.5, splits)
            assert torch.allclose(out.float().cpu(), ref, atol=1e-5 if dtype == torch.float32 else 3e-2), (dtype, splits)


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_graphs_replay_what_the_eager_forward_computes(folder, dtype) -> None:
    runner = ModelRunner(folder, dtype=dtype, device="cuda", max_total_tokens=4096, max_running_requests=12, cuda_graph_max_bs=8)
    graphs = runner.cuda_graph_runner
    assert graphs is not None and graphs.graphs and graphs.buckets == [1, 2, 4, 8]
    pool = runner.token_to_kv_pool
    tol = 1e-4 if dtype == "float32" else 5e-2
    rows = Rows(runner, [5, 40, 17, 90, 3, 61, 12, 33])
    for members in ([4], [0, 1, 2], list(range(8)), [7, 2, 5], [6]):  # buckets 1, 4 (padded), 8, 4, 1
        for _ in range(3):
            batch = rows.decode_batch(members)
            assert graphs.can_run(batch)
            graphs.enabled = False
            eager = runner.forward(batch).next_token_logits
            graphs.enabled = True
            replays = graphs.replays
            got = runner.forward(batch).next_token_logits
            assert graphs.replays == replays + 1, "the forward replayed a graph"
            assert got.shape == eager.shape == (len(members), runner.vocab_size)
            assert torch.allclose(got, eager, atol=tol, rtol=0), (members, (got - eager).abs().max().item())
            assert not pool.k_buffer[:, 0].any() and not pool.v_buffer[:, 0].any()
            rows.advance(members, eager)
    # a batch no graph holds runs eagerly
    replays = graphs.replays
    runner.forward(rows.decode_batch([0], capture_hidden_mode=CaptureHiddenMode.LAST))
    assert graphs.replays == replays
    rows.release()
