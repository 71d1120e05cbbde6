"""The one config of every policy-gradient run (`jaxscale rl ALGO`); imports no jax, so the CLI
can build its flags without loading it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

ALGOS = ("ppo", "actor-critic", "reinforce-baseline", "reinforce")
ENV_NAMES = ("cartpole", "seed-cartpole")  # rl/env.py ENVS


def _f(default, help: str, flag: str | None = None):
    meta = {"help": help} | ({"flag": flag} if flag else {})
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class RLConfig:
    algo: str = _f("ppo", "ppo, actor-critic, reinforce-baseline or reinforce")
    env: str = field(
        default="cartpole",
        metadata={
            "help": "cartpole (gymnasium's CartPole-v1 physics) or seed-cartpole (the seed's "
            "SimulatedCartPole)",
            "choices": ("cartpole", "seed-cartpole"),
        },
    )
    num_envs: int = _f(16, "environments stepped together (split over the data axis)")
    num_steps: int = _f(64, "steps per environment per rollout")
    total_steps: int = _f(262_144, "environment-step budget (rounded up to whole evaluations)")
    epochs: int = _f(4, "passes over each rollout (PPO; the others use 1)")
    minibatches: int = _f(4, "minibatches per epoch (PPO; the others use the whole rollout)")
    lr: float = _f(2.5e-3, "Adam learning rate")
    anneal_lr: bool = _f(True, "decay the learning rate linearly to 0 over the budget")
    gamma: float = _f(0.99, "discount")
    lam: float = _f(0.95, "GAE lambda (PPO, actor-critic)")
    clip_eps: float = _f(0.2, "PPO clip epsilon")
    clip_value: bool = _f(True, "clip the value update like the policy (PPO)")
    vf_coef: float = _f(0.5, "value-loss weight")
    ent_coef: float = _f(0.01, "entropy-bonus weight")
    max_grad_norm: float = _f(0.5, "global gradient-norm clip")
    norm_adv: bool = _f(True, "normalise advantages per minibatch (global mean and std)")
    hidden: int = _f(64, "hidden units of each MLP layer")
    eval_every: int = _f(16, "updates between evaluations")
    eval_episodes: int = _f(32, "episodes per evaluation (full episodes, sampled actions; 0: none)")

    @property
    def batch(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def n_chunks(self) -> int:
        per_chunk = self.batch * self.eval_every
        return max(1, -(-self.total_steps // per_chunk))

    @property
    def n_updates(self) -> int:
        return self.n_chunks * self.eval_every

    @property
    def env_steps(self) -> int:
        return self.n_updates * self.batch

    @property
    def n_epochs(self) -> int:
        return self.epochs if self.algo == "ppo" else 1

    @property
    def n_minibatches(self) -> int:
        return self.minibatches if self.algo == "ppo" else 1

    def replace(self, **kw) -> RLConfig:
        return dataclasses.replace(self, **kw)

    def check(self, data_ways: int = 1) -> RLConfig:
        """Every impossible setting, as one error naming its flag."""
        if self.algo not in ALGOS:
            raise ValueError(f"--algo {self.algo!r}: choose from {', '.join(ALGOS)}")
        if self.env not in ENV_NAMES:
            raise ValueError(f"--env {self.env!r}: choose from {', '.join(ENV_NAMES)}")
        for name in (
            "num_envs",
            "num_steps",
            "total_steps",
            "epochs",
            "minibatches",
            "hidden",
            "eval_every",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.eval_episodes < 0:
            raise ValueError("--eval-episodes must be non-negative (0: no evaluation)")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"--{name} must be in [0, 1]")
        for name in ("lr", "clip_eps", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        for name in ("vf_coef", "ent_coef"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be non-negative")
        if self.num_envs % data_ways or self.eval_episodes % data_ways:
            raise ValueError(
                f"--num-envs {self.num_envs} and --eval-episodes "
                f"{self.eval_episodes} must divide by the data axis ({data_ways})"
            )
        local = self.batch // data_ways
        if local % self.n_minibatches:
            raise ValueError(
                f"--minibatches {self.n_minibatches} must divide the rows per device "
                f"(num_envs x num_steps / data axis = {local})"
            )
        return self
