"""formcast_kernels (the brief's kernels layer; `kernels` is Hugging Face's import name): torch/triton kernels (imports only torch and triton)."""

from .decode_attention import paged_decode_attention
from .fused_moe import fused_moe
from .paged_rows import PagedRows
from .token_bitmask import apply_token_bitmask_inplace

__all__ = ["PagedRows", "apply_token_bitmask_inplace", "fused_moe", "paged_decode_attention"]
