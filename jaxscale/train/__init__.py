"""Training: data, steps (auto and manual), loop, checkpoints."""
