"""formcast.engine: composes grammar and kernels into generation."""
