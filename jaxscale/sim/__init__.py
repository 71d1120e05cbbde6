"""Pure-Python simulators (no jax import): schedules, batching, speculative decoding, p2p."""
