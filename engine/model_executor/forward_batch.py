"""Moved to ``engine/forward/forward_batch.py`` (below the layers that read it); this name
still imports."""

from ..forward.forward_batch import CaptureHiddenMode, ForwardBatch, ForwardInput, ForwardMode

__all__ = ["CaptureHiddenMode", "ForwardBatch", "ForwardInput", "ForwardMode"]
