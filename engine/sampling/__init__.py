"""Token selection: batched sampling parameters, penalties, the sampler and its logprobs."""

from .sampler import Sampler, SamplerOutput
from .sampling_batch_info import SamplingBatchInfo

__all__ = ["Sampler", "SamplerOutput", "SamplingBatchInfo"]
