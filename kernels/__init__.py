"""formcast.kernels: torch/triton kernels (imports only torch and triton)."""
