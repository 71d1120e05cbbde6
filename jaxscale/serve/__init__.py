"""Serving on the real model: sampling and generation with the KV cache."""
