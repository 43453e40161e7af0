"""Where a model runs: ``ForwardBatch`` (``engine/forward``) in, ``LogitsProcessorOutput`` out."""
