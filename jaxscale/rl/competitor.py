"""rejax's PPO (gymnax's CartPole-v1) configured like a jaxscale run, for `jaxscale bench rl`.

Optional: `pip install -e '.[rl-compare]'` (rejax and a gymnax it works with; `make bench-rl`
installs it). Matched: environments, rollout length, epochs, minibatches, learning rate and its
linear decay, clip, value-loss and entropy weights, gradient clip, gamma, lambda, two tanh hidden
layers of the same width, and the evaluation: every `eval_every` updates the same evaluator
(`loop.evaluate`, jaxscale's CartPole) plays the same number of full episodes with rejax's policy.
Not matched (rejax's own design): separate actor and critic optimizers, each clipped on its own
gradient norm, default (LeCun) initialisation, and truncation treated as termination in its GAE.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxscale.rl import env as envs
from jaxscale.rl.config import RLConfig


def unavailable_reason() -> str | None:
    try:
        import rejax  # noqa: F401
    except ImportError as e:
        return f"rejax is not installed ({e}); pip install -e '.[rl-compare]' or make bench-rl"
    return None


def version() -> str:
    from importlib.metadata import version

    return f"rejax {version('rejax')}, gymnax {version('gymnax')}"


def make_train(cfg: RLConfig):
    """-> jitted fn(keys [S]) -> (eval returns [S, n_chunks], final actor parameters); the
    parameters are returned so that a run without evaluations is not optimised away."""
    import optax
    from rejax import PPO

    from jaxscale.rl import loop

    steps = cfg.n_updates * cfg.n_epochs * cfg.n_minibatches
    lr = optax.linear_schedule(cfg.lr, 0.0, steps) if cfg.anneal_lr else cfg.lr
    env = envs.check_env(cfg.env)
    algo = PPO.create(
        env="CartPole-v1",
        num_envs=cfg.num_envs,
        num_steps=cfg.num_steps,
        num_epochs=cfg.epochs,
        num_minibatches=cfg.minibatches,
        learning_rate=lr,
        max_grad_norm=cfg.max_grad_norm,
        gamma=cfg.gamma,
        gae_lambda=cfg.lam,
        clip_eps=cfg.clip_eps,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
        total_timesteps=cfg.env_steps,
        eval_freq=cfg.batch * cfg.eval_every,
        skip_initial_evaluation=True,
        agent_kwargs={"activation": "tanh", "hidden_layer_sizes": (cfg.hidden, cfg.hidden)},
    )

    def eval_callback(algo, ts, rng):
        if cfg.eval_episodes == 0:
            return jnp.float32(jnp.nan)
        act1 = algo.make_act(ts)

        def act(obs, key):
            return jax.vmap(act1)(obs, jax.random.split(key, obs.shape[0]))

        return loop.evaluate(act, rng, env, cfg.eval_episodes).mean()

    algo = algo.replace(eval_callback=eval_callback)

    def train(key):
        ts, evals = algo.train(key)
        return evals, ts.actor_ts.params

    return jax.jit(jax.vmap(train))
