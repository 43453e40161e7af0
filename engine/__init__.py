"""formcast.engine: composes grammar and kernels into generation."""

from .sampling_params import SamplingParams, to_sampling_params

__all__ = ["SamplingParams", "to_sampling_params"]
