"""Model definitions in plain torch: the Llama family (Llama, SmolLM2, Qwen2, Mistral)."""
