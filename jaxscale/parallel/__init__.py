"""Manual parallel strategies in jax.shard_map, one file per strategy."""
