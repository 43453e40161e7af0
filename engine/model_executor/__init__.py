"""Where a model runs: ``ForwardBatch`` (tensors only) in, ``LogitsProcessorOutput`` out."""
