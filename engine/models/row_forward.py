"""The decoder layers of a quantized model on the CPU, run on numpy arrays between compiled loops.

A quantized model's layer is nothing but compiled loops (``row_ops``' norms, rotary and SwiGLU,
``ggml_quants``' products, the pool's cache write, ``cpu_decode_attention``'s kernel), all of which
read and write numpy arrays. Run through torch, every step between two of them crossed the
torch/numpy boundary several times (``.float()``, ``.contiguous()``, ``.numpy()``,
``torch.from_numpy``, a ``Parameter``'s ``__torch_function__``), about 2 µs a crossing: on a
SmolLM2 Q4_1 decode step that glue took as long as the layer's products. Here the residual stream
stays a numpy array from the embedding to the final norm, the norms' weights are read once, and
each residual add is fused with the norm that follows it (``row_ops.add_rms_norm``).

Every value is computed by the very loops the torch path calls, on the same inputs, and the
additions are IEEE additions either way, so the logits are bit-identical to the torch path's
(``tests/test_row_forward.py`` pins it). A layer this path does not cover (a mixture of experts,
Gemma's sandwich norms, an activation other than SiLU, a q/k norm over the whole projection) runs
its torch forward on views of the same arrays; so do a partial rotary and a matrix outside the
block formats within a covered layer, and attention when the batch's layout is not one paged run
over every token of a float32 pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from ..layers import cpu_decode_attention, row_ops
from ..layers.cpu_linear import linear
from ..layers.ggml_quants import QuantizedWeight

if TYPE_CHECKING:
    from ..forward.forward_batch import ForwardBatch
    from ..layers.attention import PagedDecode, TorchAttention
    from .llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


def covers(layer: LlamaDecoderLayer) -> bool:
    """Whether ``layer`` runs here rather than through its torch forward."""
    from .llama import LlamaMLP

    attn, mlp = layer.self_attn, layer.mlp
    return (
        not layer.sandwich and isinstance(mlp, LlamaMLP) and mlp.act == "silu"
        and attn.qk_norm in (None, "head") and layer.input_layernorm.weight.dtype == torch.float32
    )  # fmt: skip


def _product(weight: object, x: np.ndarray, bias: torch.Tensor | None) -> np.ndarray:
    """x @ weight.T (+ bias) of float32 rows, as ``cpu_linear.linear`` computes it."""
    if not isinstance(weight, QuantizedWeight):
        return linear(torch.from_numpy(x), weight, bias).numpy()  # type: ignore[arg-type]
    out = weight.matmul_rows(x)
    if bias is not None:
        out += bias.numpy()
    return out


class RowForward:
    """The numpy forward of one loaded model (``LlamaForCausalLM.use_row_kernels`` builds it)."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model
        self.covered = [covers(layer) for layer in model.layers]
        # A Parameter's every torch call goes through __torch_function__: read each norm once.
        self.norm_weights = [
            (layer.input_layernorm.weight.detach().numpy(), layer.post_attention_layernorm.weight.detach().numpy())
            for layer in model.layers
        ]
        self.final_norm = model.norm.weight.detach().numpy()
        self.qk_norm_weights = [
            (layer.self_attn.q_norm.weight.detach().numpy(), layer.self_attn.k_norm.weight.detach().numpy())
            if layer.self_attn.qk_norm == "head" else None
            for layer in model.layers
        ]  # fmt: skip

    def forward(self, batch: ForwardBatch, attn: TorchAttention, hidden: torch.Tensor, tables: list) -> torch.Tensor:  # type: ignore[type-arg]
        """Final-normed hidden states of the embedded tokens ``hidden`` [T, hidden] float32;
        ``tables[i]``: layer i's (cos, sin, rotary)."""
        model = self.model
        eps = np.float64(model.norm.eps)
        residual = np.ascontiguousarray(hidden.numpy())
        pending: np.ndarray | None = None  # the last layer's output, not yet added to the residual
        pool_rows: dict = {}  # type: ignore[type-arg]
        arrays: dict = {}  # type: ignore[type-arg]  # id of a cos / sin table -> its [T, dim] array
        for i, layer in enumerate(model.layers):
            cos, sin, rotary = tables[i]
            if id(cos) not in arrays:
                arrays[id(cos)], arrays[id(sin)] = _table(cos), _table(sin)
            if not self.covered[i]:
                if pending is not None:
                    residual = residual + pending
                    pending = None
                residual = layer.forward(torch.from_numpy(residual), cos, sin, rotary, attn, batch).numpy()
                continue
            w_in, w_post = self.norm_weights[i]
            if pending is None:
                normed = row_ops.rms_norm_rows(residual, w_in, eps)
            else:
                residual, normed = row_ops.add_rms_norm_rows(residual, pending, w_in, eps)
            attn_out = self._attention(layer.self_attn, normed, (cos, sin, arrays[id(cos)], arrays[id(sin)]), rotary, attn, batch, pool_rows)
            residual, normed = row_ops.add_rms_norm_rows(residual, attn_out, w_post, eps)
            mlp = layer.mlp
            gate_up = _product(mlp.gate_up_proj, normed, mlp.gate_up_bias)
            pending = _product(mlp.down_proj, row_ops.silu_and_mul_rows(gate_up), mlp.down_bias)
        if pending is None:
            return torch.from_numpy(row_ops.rms_norm_rows(residual, self.final_norm, eps))
        return torch.from_numpy(row_ops.add_rms_norm_rows(residual, pending, self.final_norm, eps)[1])

    def _attention(
        self, module: LlamaAttention, x: np.ndarray, table: tuple, rotary: object,  # type: ignore[type-arg]
        attn: TorchAttention, batch: ForwardBatch, pool_rows: dict,  # type: ignore[type-arg]
    ) -> np.ndarray:  # fmt: skip
        """``table``: (cos, sin) as torch [T, 1, dim] and as numpy [T, dim]."""
        cos, sin, cos_rows, sin_rows = table
        tokens = x.shape[0]
        heads, kv_heads, dim = module.num_heads, module.num_kv_heads, module.head_dim
        q_size, kv_size = module.q_size, module.kv_size
        qkv = _product(module.qkv_proj, x, module.qkv_bias)
        if module.qk_norm is None:
            qk = np.ascontiguousarray(qkv[:, : q_size + kv_size]).reshape(tokens, heads + kv_heads, dim)
        else:  # "head": each q and k head normed alone, by the norms' own loop
            eps = np.float64(module.q_norm.eps)
            w_q, w_k = self.qk_norm_weights[module.layer_id]  # type: ignore[misc]
            q = row_ops.rms_norm_rows(np.ascontiguousarray(qkv[:, :q_size]).reshape(-1, dim), w_q, eps)
            k = row_ops.rms_norm_rows(np.ascontiguousarray(qkv[:, q_size : q_size + kv_size]).reshape(-1, dim), w_k, eps)
            qk = np.concatenate([q.reshape(tokens, heads, dim), k.reshape(tokens, kv_heads, dim)], axis=1)
        if rotary.dim != dim:  # type: ignore[attr-defined]  # partial rotary: the torch path's
            qk = rotary.apply(torch.from_numpy(qk), cos, sin).numpy()  # type: ignore[attr-defined]
        else:
            qk = row_ops.rotary_rows(qk, cos_rows, sin_rows)
        v = np.ascontiguousarray(qkv[:, q_size + kv_size :]).reshape(tokens, kv_heads, dim)
        q, k = qk[:, :heads], qk[:, heads:]
        layout = _paged_layout(attn, batch, module)
        if layout is None:
            out = attn.forward(torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(np.ascontiguousarray(k)), torch.from_numpy(v),
                               module.layer_id, batch, **_options(module)).numpy()  # fmt: skip
        else:
            out = _paged_attention(module, attn, batch, layout, np.ascontiguousarray(q), np.ascontiguousarray(k), v, pool_rows)
        return _product(module.o_proj, out.reshape(tokens, q_size), module.o_bias)


def _table(t: torch.Tensor) -> np.ndarray:
    """A [T, 1, dim] cos / sin table as the rotary loop reads it."""
    return np.ascontiguousarray(t[:, 0].float().numpy())


def _options(module: LlamaAttention) -> dict:  # type: ignore[type-arg]
    if module.window is None and module.scale is None and module.softcap is None:
        return {}
    return {"window": module.window, "scale": module.scale, "softcap": module.softcap}


def _paged_layout(attn: TorchAttention, batch: ForwardBatch, module: LlamaAttention) -> PagedDecode | None:
    """The layer's paged-kernel layout when it is one run over every token of a float32 pool."""
    meta = attn._metadata(batch, module.window, module.softcap)
    pd = meta.paged_decode
    if pd is None or pd.kernel != "numba" or pd.token_index is not None or meta.decode_groups or meta.extend_rows:
        return None
    if batch.token_to_kv_pool.dtype != torch.float32:
        return None
    return pd


def _paged_attention(
    module: LlamaAttention, attn: TorchAttention, batch: ForwardBatch, pd: PagedDecode,
    q: np.ndarray, k: np.ndarray, v: np.ndarray, pool_rows: dict,  # type: ignore[type-arg]
) -> np.ndarray:  # fmt: skip
    """``TorchAttention.forward`` of a paged layout, on numpy arrays: the cache write, then the
    decode kernel (llama.cpp's float16 rounding of q, k, v first where the backend asks)."""
    if attn.f16:
        q, k, v = (a.astype(np.float16).astype(np.float32) for a in (q, k, v))
    pool = batch.token_to_kv_pool
    layer = module.layer_id
    pool.set_kv_arrays(layer, batch.out_cache_loc.numpy(), k, v)
    k_pool, v_pool = pool.layer_arrays(layer)
    key = id(pd)
    index = pool_rows.get(key)
    if index is None:
        index = pool_rows[key] = (pd.kv_index.numpy(), pd.kv_start.numpy(), pd.kv_len.numpy())
    out = np.empty_like(q)
    cpu_decode_attention.attend(q, k_pool, v_pool, *index, out, module.scale, attn.f16, module.softcap)
    return out
