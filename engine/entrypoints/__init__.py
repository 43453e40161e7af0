"""What users call: ``Engine`` (Python API), the OpenAI-compatible server and the CLI."""
