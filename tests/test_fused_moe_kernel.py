"""``formcast_kernels.fused_moe``: the Triton grouped GEMM (run by Triton's interpreter on the CPU, in a
subprocess since the flag is read at import) against the torch reference, on tiny shapes that are
not multiples of the tiles, SiLU and GELU-tanh, an expert with more tokens than one block, experts
nobody chose, and a single token; the grouping of pairs by expert on its own; the reference
against the engine's MoE block and its CPU grouped loops (``engine.layers.cpu_moe``); on a GPU, the
compiled kernel against the reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from formcast_kernels.fused_moe import fused_moe, fused_moe_reference

ROOT = Path(__file__).resolve().parents[1]
# tokens, hidden, intermediate, experts, top_k, activation, all tokens on expert 0
CASES = [[5, 48, 40, 6, 2, "silu", False], [1, 32, 16, 4, 1, "gelu_tanh", False], [21, 40, 24, 3, 1, "silu", True],
         [9, 24, 72, 8, 3, "gelu_tanh", False]]  # fmt: skip


def make_case(tokens, hidden, inter, experts, top_k, one_expert, seed, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5
    down = torch.randn(experts, hidden, inter, generator=g) * inter**-0.5
    if one_expert:
        ids = torch.zeros(tokens, top_k, dtype=torch.int64)
    else:  # distinct experts per token, some experts left unused when experts > tokens * top_k
        ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    return [t.to(device) if t.dtype == torch.int64 else t.to(device, dtype) for t in (x, gate_up, down, ids, weights)]


_SCRIPT = """
import json, os, sys
sys.path.insert(0, os.environ["FORMCAST_ROOT"]); sys.path.insert(0, os.environ["FORMCAST_ROOT"] + "/tests")
import torch
from formcast_kernels.fused_moe_triton import fused_moe_triton
from formcast_kernels.fused_moe import fused_moe_reference
from test_fused_moe_kernel import make_case
errs = []
for i, (t, h, n, e, k, act, one) in enumerate(json.loads(sys.argv[1])):
    x, gu, d, ids, w = make_case(t, h, n, e, k, one, seed=i)
    ref = fused_moe_reference(x, gu, d, ids, w, act)
    got = fused_moe_triton(x, gu, d, ids, w, act, block_n=32, block_k=16)
    errs.append(float((got - ref).abs().max()))
print(json.dumps(errs))
"""


def test_triton_kernel_matches_reference_under_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", FORMCAST_ROOT=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(CASES)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(errs) == len(CASES) and max(errs) < 1e-5, errs


def test_pairs_are_grouped_by_expert_in_whole_blocks() -> None:
    pytest.importorskip("triton")
    from formcast_kernels.fused_moe_triton import group_pairs

    for i, (t, _, _, e, k, _, one) in enumerate(CASES):
        ids = make_case(t, 8, 8, e, k, one, seed=i)[3]
        rows, block_expert = group_pairs(ids, e, block_m=4)
        pairs = ids.numel()
        assert sorted(rows[rows < pairs].tolist()) == list(range(pairs))  # each pair once
        for b, expert in enumerate(block_expert.tolist()):
            block = rows[4 * b : 4 * b + 4]
            live = block[block < pairs]
            if expert < 0:
                assert live.numel() == 0
            else:
                assert bool((ids.reshape(-1)[live] == expert).all())
        assert set(block_expert[block_expert >= 0].tolist()) == set(ids.reshape(-1).tolist())


def test_reference_matches_the_engine_moe_block() -> None:
    """The reference equals formcast's CPU expert path (cpu_linear loop) on the same routing."""
    from engine.models.moe import SparseMoeBlock

    x, gu, d, ids, w = make_case(7, 32, 24, 5, 2, False, seed=7)
    block = SparseMoeBlock.__new__(SparseMoeBlock)
    torch.nn.Module.__init__(block)
    block.num_experts, block.top_k, block.intermediate, block.act = 5, 2, 24, "silu"
    block.gate_up_proj, block.down_proj = torch.nn.Parameter(gu, requires_grad=False), torch.nn.Parameter(d, requires_grad=False)
    assert torch.allclose(SparseMoeBlock.experts_on_cpu(block, x, ids, w), fused_moe_reference(x, gu, d, ids, w), atol=1e-5)
    assert torch.equal(fused_moe(x, gu, d, ids, w), fused_moe_reference(x, gu, d, ids, w))  # the CPU dispatch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_on_gpu(dtype) -> None:
    from formcast_kernels.fused_moe_triton import fused_moe_triton

    for i, (t, h, n, e, k, act, one) in enumerate(CASES + [[300, 256, 512, 16, 4, "silu", False]]):
        x, gu, d, ids, w = make_case(t, h, n, e, k, one, seed=i, device="cuda", dtype=dtype)
        ref = fused_moe_reference(x.float(), gu.float(), d.float(), ids, w.float(), act)
        got = fused_moe_triton(x, gu, d, ids, w, act)
        assert torch.allclose(got.float(), ref, atol=1e-4 if dtype == torch.float32 else 5e-2), (i, float((got.float() - ref).abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_grouped_loops_match_reference(dtype) -> None:
    """``engine.layers.cpu_moe`` (the CPU decode path of the MoE block) against the reference on
    the same weights, float32 and bfloat16 experts."""
    from engine.layers import cpu_moe

    for i, (t, h, n, e, k, act, one) in enumerate(CASES):
        x, gu, d, ids, w = make_case(t, h, n, e, k, one, seed=i)
        gu, d = gu.to(dtype), d.to(dtype)
        with torch.inference_mode():  # as a forward runs
            assert cpu_moe.available(x, gu)
            got = cpu_moe.moe_experts(x, gu, d, ids, w, act)
        assert torch.allclose(got, fused_moe_reference(x, gu.float(), d.float(), ids, w, act), atol=1e-5), i
