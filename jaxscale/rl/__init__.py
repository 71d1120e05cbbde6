"""RL fundamentals in pure JAX (seed 002 ch. 12): CartPole, GAE, REINFORCE, actor-critic and PPO,
each training run one `jax.jit` in purejaxrl's `make_train(config) -> train(keys)` shape, with the
environments split over the mesh's `data` axis."""
