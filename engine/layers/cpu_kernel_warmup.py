"""The engine's CPU kernels run once, on tiny arrays of the very types a forward passes them,
before the engine reports ready (issue 25).

On a fresh install numba's cache is empty, and the first forward would compile the linear loop
(``cpu_linear``, first token) and the paged decode attention (``cpu_decode_attention``, second
token) inside a request: measured 7 s and 17 s of wall time on a loaded 2-core machine. The
engine calls these functions while the grammar kernels compile in their child processes, so the
compiles overlap; on a warm cache it only loads them (milliseconds). A type that differed from a
forward's (another dtype, layout or int width) would compile a second version on first use:
``tests/test_engine.py`` checks that a generation adds none. Nothing here changes a result.
"""

from __future__ import annotations

import numpy as np
import torch

from . import cpu_decode_attention, cpu_linear, cpu_moe, cpu_threads, panel_linear, row_ops
from .ggml_quants import holds_quantized_weights, quantized_weights, runs_threaded


def dense_matrix_dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    """The dtypes of the dense (float) matrices ``model``'s modules hold, as parameters, buffers
    or plain attributes: the linear loop's weights. A GGUF model whose matrices are all kept in
    block formats has none, and its start compiles no float loop."""
    dtypes: set[torch.dtype] = set()
    for module in model.modules():
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False), *vars(module).values()]
        dtypes.update(t.dtype for t in tensors if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.dtype in cpu_linear.LOOP_DTYPES)
    return dtypes


def warm_up_linear(model: torch.nn.Module) -> None:
    """Run the linear loop for each dtype of ``model``'s dense matrices."""
    if cpu_linear.njit is not None:
        for dtype in dense_matrix_dtypes(model):
            cpu_linear.rows_agree(dtype)  # runs the loop on forward-typed arrays


def warm_up_attention(
    head_dim: int, heads: int, kv_heads: int, kv_dtype: torch.dtype, f16_probs: bool = False, softcap: float | None = None
) -> None:  # fmt: skip
    """Run the decode attention for the model's head geometry over a ``kv_dtype`` cache, with the
    options its layers pass (``f16_probs``: llama.cpp's precision; ``softcap``: Gemma 2's capped
    scores), where a forward would use it. On a cold cache a child process compiles it and this
    thread mostly waits: the caller runs it beside the in-process compiles."""
    if cpu_decode_attention.available() and kv_dtype in (torch.float32, torch.bfloat16) and heads % kv_heads == 0:
        bf16 = kv_dtype == torch.bfloat16
        q = np.zeros((1, heads, head_dim), np.float32)
        rows = np.zeros((2 * kv_heads, head_dim), np.uint16 if bf16 else np.float32)
        one = np.ones(1, np.int64)
        cpu_decode_attention.kernel_for(head_dim, heads // kv_heads, bf16)(
            q, rows, rows, np.zeros(1, np.int64), np.zeros(1, np.int64), one, np.empty_like(q), np.float32(head_dim**-0.5), kv_heads,
            np.float32(0.0 if softcap is None else softcap), f16_probs,
        )


def warm_up_quantized(model: torch.nn.Module, prompt_rows: int = 512) -> None:
    """The block-format kernels of every encoding ``model`` holds (GGUF files, ``quantization=``):
    two rows of one of its matrices multiply one activation row and five (a group of four and a
    row alone), on this thread and across threads where some product of a forward of 1 to
    ``prompt_rows`` rows would run so (``ggml_quants.runs_threaded``; each variant is a compile of
    seconds on a fresh install), and serve an embedding lookup, so the arrays have the forward's
    dtypes and layouts; and ``row_ops``' loops (norms, rotary, activation)."""
    if holds_quantized_weights(model):
        row_ops.warm_up()
    count = cpu_threads.threads()
    variants: dict[str, set[bool]] = {}
    for w in quantized_weights(model):
        n_out, n_in = w.shape
        variants.setdefault(w.type_name, set()).update(runs_threaded(w.split_units, rows * n_out * n_in, count) for rows in (1, prompt_rows))
    seen: set[str] = set()
    for w in quantized_weights(model):
        if w.type_name not in seen:
            seen.add(w.type_name)
            rows = w.take_rows(np.arange(min(2, w.shape[0])))
            for m_rows in (1, 5):
                for split in sorted(variants[w.type_name]):
                    rows.matmul(torch.zeros(m_rows, w.shape[1]), split=split)
            rows.embedding(torch.zeros(1, dtype=torch.int64))


def warm_up_panels(model: torch.nn.Module) -> None:
    """The panel product (``panel_linear``) for each dtype of the packed matrices ``model`` holds."""
    for dtype in {w.dtype for w in panel_linear.panel_weights(model)}:
        panel_linear.warm_up(dtype)


def warm_up_moe(model: torch.nn.Module) -> None:
    """The grouped expert loops (``cpu_moe``) for the dtype of a mixture of experts' stacked
    experts, when ``model`` has any."""
    for module in model.modules():
        weight = getattr(module, "gate_up_proj", None)
        if getattr(module, "top_k", None) is not None and isinstance(weight, torch.Tensor) and weight.dim() == 3:
            cpu_moe.warm_up(weight.dtype)
            return
