"""formcast.kernels: torch/triton kernels (imports only torch and triton)."""

from .decode_attention import paged_decode_attention
from .token_bitmask import apply_token_bitmask_inplace

__all__ = ["apply_token_bitmask_inplace", "paged_decode_attention"]
