"""formcast_kernels (the brief's kernels layer; `kernels` is Hugging Face's import name): torch/triton kernels (imports only torch and triton)."""

from .decode_attention import paged_decode_attention
from .fused_moe import fused_moe
from .ggml_blocks import BlockMatrix
from .paged_rows import PagedRows
from .token_bitmask import apply_token_bitmask_inplace

__all__ = [
    "BlockMatrix", "PagedRows", "apply_token_bitmask_inplace", "fused_moe", "paged_decode_attention", "table_decode_attention",
    "table_splits",
]  # fmt: skip

# The request-table decode kernel (CUDA graphs) is Triton only: loaded on first use, so CPU-only
# use never imports Triton (and tests can import it under TRITON_INTERPRET=1 in a subprocess).
_LAZY_TRITON = {"table_decode_attention", "table_splits"}


def __getattr__(name: str) -> object:
    if name in _LAZY_TRITON:
        from . import decode_attention_table_triton

        return getattr(decode_attention_table_triton, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
