"""Strategies: compose.py turns a mesh plus a choice per mesh axis into one step; one module per
axis (zero.py for the data axes, tp.py + tp_vocab.py for tensor) with explicit collectives inside
jax.shard_map; collectives.py builds the collectives themselves from ppermute."""
