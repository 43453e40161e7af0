"""Building blocks of the models: RMSNorm, rotary embedding, attention over the paged KV cache,
and the logits head."""
