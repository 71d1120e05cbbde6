"""`make_train(cfg) -> train(keys)`: a whole run (rollouts, GAE, updates, evaluations) in one jit.

The body is written for one shard of the environments under a mesh axis named `data`:

    run(cfg, keys, mesh)      shard_map over the mesh's data axis: each device steps num_envs/D
                              environments; gradients and advantage statistics are averaged with
                              `pmean` over `data` (one all-reduce per minibatch, one per statistic)
    run(cfg, keys, groups=D)  the same body under `vmap(axis_name='data')` on one device: the
                              single-device run the sharded one must equal
    run(cfg, keys)            one device, one group

`keys` is a batch of seeds; `vmap` over it runs independent seeds at once. Parameters are created
from the seed's key alone (identical on every shard); environments and action sampling fold in the
shard index. Every loss is a local mean, so the pmean of local gradients is the global gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxscale.rl import env as envs
from jaxscale.rl import policy
from jaxscale.rl.config import RLConfig
from jaxscale.rl.gae import discounted_returns, gae
from jaxscale.rl.ppo import policy_loss

AXIS = "data"


class Runner(NamedTuple):
    params: dict
    opt_state: tuple
    env_state: envs.EnvState
    obs: jax.Array
    key: jax.Array


def optimizer(cfg: RLConfig):
    steps = cfg.n_updates * cfg.n_epochs * cfg.n_minibatches
    lr = optax.linear_schedule(cfg.lr, 0.0, steps) if cfg.anneal_lr else cfg.lr
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(lr, eps=1e-5))


def evaluate(act, key, env: envs.Physics, n_episodes: int):
    """Mean return of `n_episodes` full episodes of `act(obs [E, O], key) -> actions [E]`, each
    run to its end (a fixed-length scan of max_steps + 1 steps; finished episodes stop counting)."""
    k_reset, k_run = jax.random.split(key)
    obs, state = envs.reset_batch(k_reset, n_episodes, env)

    def tick(carry, _):
        obs, state, alive, total, key = carry
        key, k_act, k_step = jax.random.split(key, 3)
        st = envs.step_batch(k_step, state, act(obs, k_act), env)
        total = total + jnp.where(alive, st.reward, 0.0)
        alive = alive & ~(st.terminated | st.truncated)
        return (st.obs, st.state, alive, total, key), None

    init = (obs, state, jnp.ones(n_episodes, bool), jnp.zeros(n_episodes), k_run)
    (_, _, _, total, _), _ = jax.lax.scan(tick, init, None, env.max_steps + 1)
    return total


def _skipped(shape):
    """What a chunk skipped after a stop reports: NaN, or -1 for counts (never negative)."""
    fill = jnp.nan if jnp.issubdtype(shape.dtype, jnp.floating) else -1
    return jnp.full(shape.shape, fill, shape.dtype)


def make_train(cfg: RLConfig, data_ways: int = 1, progress=None, stop=None):
    """-> train(key, params=None) -> (params, metrics {name: [n_updates]}, eval_returns
    [n_chunks]), to be run under an axis named 'data' of size `data_ways` (see `run`).
    `params`, when given, must be `init_params(cfg, key)`. `progress(update, shard)` is called
    from the loop (a host callback) when given."""
    cfg.check(data_ways)
    env = envs.check_env(cfg.env)
    init, apply, critic = policy.functional(env.obs_dim, env.n_actions, cfg.hidden)
    tx = optimizer(cfg)
    E, T = cfg.num_envs // data_ways, cfg.num_steps
    rows = E * T

    def act(params, obs, key):
        return jax.random.categorical(key, apply(params, obs)[0])

    def rollout(r: Runner):
        def tick(carry, _):
            params, state, obs, key = carry
            key, k_act, k_step = jax.random.split(key, 3)
            logits, value = apply(params, obs)
            action = jax.random.categorical(k_act, logits)
            st = envs.step_batch(k_step, state, action, env)
            row = dict(
                obs=obs,
                action=action,
                logp=policy.log_prob(logits, action),
                value=value,
                reward=st.reward,
                terminated=st.terminated,
                done=st.terminated | st.truncated,
                final_obs=st.final_obs,
                ep_return=st.ep_return,
            )
            return (params, st.state, st.obs, key), row

        (_, state, obs, key), traj = jax.lax.scan(
            tick, (r.params, r.env_state, r.obs, r.key), None, T
        )
        return r._replace(env_state=state, obs=obs, key=key), traj

    def advantages(params, traj):
        if cfg.algo == "reinforce":
            g = discounted_returns(traj["reward"], traj["done"], cfg.gamma)
            return g, g
        # V of the state each step really reached (the pre-reset one at an episode's end)
        next_v = critic(params, traj["final_obs"])
        lam = 1.0 if cfg.algo == "reinforce-baseline" else cfg.lam
        if cfg.algo == "reinforce-baseline":  # G_t - V(s_t): no bootstrapping inside the window
            g = discounted_returns(traj["reward"], traj["done"], cfg.gamma)
            return g - traj["value"], g
        return gae(
            traj["reward"], traj["value"], next_v, traj["terminated"], traj["done"], cfg.gamma, lam
        )

    def gmean(x):
        return jax.lax.pmean(jnp.mean(x), AXIS)

    def minibatch_step(params, opt_state, mb):
        adv = mb["adv"]
        if cfg.norm_adv and cfg.algo != "reinforce":
            mean = gmean(adv)  # all-reduce: global advantage statistics
            std = jnp.sqrt(jnp.maximum(gmean(jnp.square(adv)) - mean**2, 0.0))
            adv = (adv - mean) / (std + 1e-8)

        def loss_fn(p):
            logits, value = apply(p, mb["obs"])
            return policy_loss(cfg, logits, value, mb, adv)

        (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        grads = jax.lax.pmean(grads, AXIS)  # all-reduce: the data-parallel gradient
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, stats

    def update(r: Runner, i):
        r, traj = rollout(r)
        adv, ret = advantages(r.params, traj)
        flat = {
            k: traj[k].reshape(rows, *traj[k].shape[2:]) for k in ("obs", "action", "logp", "value")
        }
        flat |= dict(adv=adv.reshape(rows), ret=ret.reshape(rows))

        def epoch(carry, key):
            params, opt_state = carry
            perm = jax.random.permutation(key, rows)
            mbs = jax.tree.map(lambda x: x[perm].reshape(cfg.n_minibatches, -1, *x.shape[1:]), flat)

            def one(c, mb):
                p, o, stats = minibatch_step(*c, mb)
                return (p, o), stats

            return jax.lax.scan(one, (params, opt_state), mbs)

        key, k_epochs = jax.random.split(r.key)
        (params, opt_state), stats = jax.lax.scan(
            epoch, (r.params, r.opt_state), jax.random.split(k_epochs, cfg.n_epochs)
        )
        done = traj["done"]
        n_done = jax.lax.psum(done.sum(), AXIS)  # all-reduce: episodes finished on every shard
        ret_sum = jax.lax.psum(traj["ep_return"].sum(), AXIS)
        resid = ret - traj["value"]
        ev = 1.0 - (gmean(resid**2) - gmean(resid) ** 2) / (gmean(ret**2) - gmean(ret) ** 2 + 1e-8)
        metrics = {k: jax.lax.pmean(v.mean(), AXIS) for k, v in stats.items()}
        # NaN where no episode ended in this update (long episodes outlast a short rollout)
        metrics |= dict(
            episode_return=jnp.where(n_done > 0, ret_sum / jnp.maximum(n_done, 1), jnp.nan),
            episodes=n_done,
            explained_variance=ev,
        )
        if progress is not None:
            jax.debug.callback(progress, i, jax.lax.axis_index(AXIS))
        return Runner(params, opt_state, r.env_state, r.obs, key), metrics

    def train(key, params=None):
        shard = jax.lax.axis_index(AXIS)
        k_init, k_env, k_run, k_eval = jax.random.split(key, 4)
        params = init(k_init) if params is None else params
        obs, state = envs.reset_batch(jax.random.fold_in(k_env, shard), E, env)
        r = Runner(params, tx.init(params), state, obs, jax.random.fold_in(k_run, shard))
        n_eval = cfg.eval_episodes // data_ways

        def run_chunk(r, j):
            r, metrics = jax.lax.scan(update, r, j * cfg.eval_every + jnp.arange(cfg.eval_every))
            if n_eval == 0:
                return r, (metrics, jnp.float32(jnp.nan))
            k = jax.random.fold_in(jax.random.fold_in(k_eval, j), shard)
            returns = evaluate(lambda o, k: act(r.params, o, k), k, env, n_eval)
            return r, (metrics, jax.lax.psum(returns.sum(), AXIS) / cfg.eval_episodes)

        def chunk(r, j):
            if stop is None:
                return run_chunk(r, j)
            # the host says whether to stop (Ctrl-C); every shard asks, and they agree (all-reduce:
            # max) so that all run the chunk's collectives or none does
            asked = jax.pure_callback(stop, jax.ShapeDtypeStruct((), jnp.int32), j)
            halt = jax.lax.pmax(asked, AXIS) > 0
            skipped = jax.tree.map(_skipped, jax.eval_shape(run_chunk, r, j)[1])
            r, (metrics, ev) = jax.lax.cond(
                halt, lambda r: (r, skipped), lambda r: run_chunk(r, j), r
            )
            metrics["ran"] = jnp.broadcast_to(~halt, (cfg.eval_every,))
            return r, (metrics, ev)

        r, (metrics, evals) = jax.lax.scan(chunk, r, jnp.arange(cfg.n_chunks))
        metrics = jax.tree.map(lambda x: x.reshape(cfg.n_updates), metrics)
        return r.params, metrics, evals

    return train


def init_params(cfg: RLConfig, key):
    """The parameters `train(key)` starts from."""
    env = envs.check_env(cfg.env)
    return policy.functional(env.obs_dim, env.n_actions, cfg.hidden)[0](jax.random.split(key, 4)[0])


def make_run(cfg: RLConfig, mesh=None, groups: int = 1, progress=None, stop=None):
    """-> jitted fn(keys [S]) -> (params, metrics, evals), each with a leading seed axis.
    `stop`: a host function (chunk index -> nonzero to stop) asked before each chunk of
    `eval_every` updates; the chunks after a stop are skipped, and metrics["ran"] says which
    updates ran."""
    if mesh is None and groups == 1:  # one device: a 1-device mesh, so no batch axis of size 1
        from jaxscale.mesh import build_mesh

        mesh = build_mesh("dp=1", jax.devices()[:1])
    ways = groups if mesh is None else mesh.shape[AXIS]
    body = jax.vmap(make_train(cfg, ways, progress, stop))

    def fn(keys):
        # Seeds' parameters one after another (lax.map), not batched: jaxlib's batched QR (the
        # orthogonal initializer) can deadlock XLA:CPU's intra-op thread pool.
        params = jax.lax.map(lambda k: init_params(cfg, k), keys)
        if mesh is not None:
            from jax.sharding import PartitionSpec as P

            # check_vma=False: the body pmeans its gradients itself, the same code as under vmap
            return jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)(
                keys, params
            )
        out = jax.vmap(body, in_axes=None, axis_name=AXIS, axis_size=groups)(keys, params)
        return jax.tree.map(lambda x: x[0], out)  # every group holds the same replicated result

    return jax.jit(fn)


def run(cfg: RLConfig, keys, mesh=None, groups: int = 1, progress=None):
    """Train one run per key in `keys` (typed keys [S]); see the module docstring."""
    return make_run(cfg, mesh, groups, progress)(keys)
