"""The one config of an RLHF run (`jaxscale rlhf`); imports no jax, so the CLI builds its flags
from it without loading jax. Defaults run in minutes on two CPU cores."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

ALGOS = ("ppo", "grpo")
PLACEMENTS = ("colocated", "disaggregated")
GEN_LAYOUTS = ("replicated", "train")


def _f(default, help: str, choices=None):
    meta = {"help": help} | ({"choices": choices} if choices else {})
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class RLHFConfig:
    algo: str = _f("ppo", "ppo (actor + critic, GAE) or grpo (group-relative, no critic)", ALGOS)
    iterations: int = _f(80, "RLHF iterations (generate, score, train)")
    responses: int = _f(32, "responses per iteration (GRPO: responses / group prompts)")
    group: int = _f(4, "GRPO: responses per prompt (PPO samples one per prompt)")
    epochs: int = _f(4, "passes over each rollout batch")
    minibatches: int = _f(2, "minibatches per epoch")
    lr: float = _f(3e-4, "Adam learning rate of the actor (and critic)")
    max_grad_norm: float = _f(1.0, "global gradient-norm clip")
    beta: float = _f(0.5, "initial KL coefficient")
    kl_target: float = _f(3.0, "adaptive-KL target in nats per response; 0: beta stays fixed")
    kl_horizon: int = _f(64, "adaptive-KL horizon in responses (Ziegler et al.)")
    kl_estimator: str = _f(
        "k1", "per-token KL: k1 (log-ratio, the seed's) or k3 (>= 0)", ("k1", "k3")
    )
    reward_mode: str = _f(
        "response", "the RM score at the last token, or spread over tokens", ("response", "token")
    )
    whiten: str = _f(
        "batch",
        "advantage whitening: batch, response (the seed's) or none",
        ("batch", "response", "none"),
    )
    gamma: float = _f(1.0, "discount over response tokens")
    lam: float = _f(0.95, "GAE lambda")
    clip_eps: float = _f(0.2, "PPO clip epsilon (ratio clamped to [1-eps, 1+eps])")
    vf_coef: float = _f(0.5, "c1, the value-loss weight")
    ent_coef: float = _f(0.0, "c2, the entropy-bonus weight")
    critic: str = _f(
        "separate",
        "critic: a separate transformer, or a value head on the actor's backbone",
        ("separate", "shared"),
    )
    placement: str = _f(
        "colocated",
        "one mesh for everything, or training and generation on separate devices",
        PLACEMENTS,
    )
    gen_layout: str = _f(
        "replicated",
        "co-located generation layout: replicated (data-parallel "
        "decode, one reshard per iteration) or train (the training layout: "
        "zero-copy)",
        GEN_LAYOUTS,
    )
    gen_devices: int = _f(0, "disaggregated: devices for generation (0: half)")
    stale: bool = _f(
        False,
        "disaggregated: generate batch k+1 while training on batch k (one-step-stale rollouts)",
    )
    seed: int = _f(0, "seed of rollouts, minibatches and prompts")

    def replace(self, **kw) -> RLHFConfig:
        return dataclasses.replace(self, **kw)

    @property
    def rows(self) -> int:
        """Responses per iteration."""
        return self.responses

    @property
    def prompts(self) -> int:
        """Prompts per iteration."""
        return self.responses // (self.group if self.algo == "grpo" else 1)

    def check(self) -> RLHFConfig:
        """Every impossible setting, as one error naming its flag."""
        for name, allowed in (
            ("algo", ALGOS),
            ("placement", PLACEMENTS),
            ("gen_layout", GEN_LAYOUTS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"--{name.replace('_', '-')} {getattr(self, name)!r}: choose "
                    f"from {', '.join(allowed)}"
                )
        for name in ("iterations", "responses", "group", "epochs", "minibatches", "kl_horizon"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.algo == "grpo" and (self.group < 2 or self.responses % self.group):
            raise ValueError(
                f"--group {self.group}: grpo needs at least 2 responses per prompt "
                f"(advantages are relative), dividing --responses {self.responses}"
            )
        for name in ("lr", "clip_eps", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        for name in ("beta", "kl_target", "vf_coef", "ent_coef", "gen_devices", "seed"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be non-negative")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"--{name} must be in [0, 1]")
        if self.rows % self.minibatches:
            raise ValueError(
                f"--minibatches {self.minibatches} must divide the responses per "
                f"iteration ({self.rows})"
            )
        if self.stale and self.placement != "disaggregated":
            raise ValueError(
                "--stale needs --placement disaggregated (generation on its own "
                "devices is what overlaps with training)"
            )
        return self
