"""The data handed to a forward pass, below every layer that reads it.

``ForwardBatch`` (the tensors of one forward, ``forward_batch.py``) and ``RowLayout`` (which
logits rows each batch row owns and which sample, ``row_layout.py``) are read by the attention
and logits layers, the models, the ``ModelRunner``, the scheduler's batches, the bitmask filler
and the draft verifier. They import nothing of the engine at run time, so every one of those
can import them without a cycle.
"""

from .forward_batch import CaptureHiddenMode, ForwardBatch, ForwardInput, ForwardMode
from .row_layout import RowLayout, SamplingSpan

__all__ = ["CaptureHiddenMode", "ForwardBatch", "ForwardInput", "ForwardMode", "RowLayout", "SamplingSpan"]
