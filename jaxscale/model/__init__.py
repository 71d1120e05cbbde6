"""Model: Flax NNX decoder-only transformer with logical axis names."""
