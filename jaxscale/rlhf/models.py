"""The four RLHF models on the lab's transformer pieces (seed 002 ch13, "The Four Models of RLHF").

    actor      the language model (LM head): generates, and is trained
    critic     a value per token: a separate transformer with a scalar head ("separate"), or a
               scalar head on the actor's own backbone ("shared"; the seed's "Common Questions")
    reward     a transformer with a scalar head read at the last valid token, trained from
               pairwise comparisons (Bradley-Terry) and frozen during RLHF
    reference  the initial actor's parameters, frozen: no optimizer state, no gradient

A scalar head is {"w_D", "b"} on the final-normed hidden state, so every model is the same
`pieces` forward with a different last matrix. Parameters are plain dicts; the trained pair is
one tree {"actor", "critic"?, "value_head"} so one optimizer and one sharding table serve both.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxscale.config import ModelConfig
from jaxscale.model import pieces
from jaxscale.model import state as ms

CRITICS = ("separate", "shared")


def hidden(params, tokens_BT, cfg: ModelConfig, pc: pieces.Pieces = pieces.DENSE):
    """The final-normed residual stream [B, T, D] (what the LM head and a scalar head read)."""
    top, x_BTD, _, _ = pieces.trunk(params, tokens_BT, jnp.arange(tokens_BT.shape[1]), cfg, pc)
    return pieces.rms_norm(x_BTD, top["final_norm_D"], cfg.norm_eps)


def lm_logits(params, h_BTD, cfg: ModelConfig, pc: pieces.Pieces = pieces.DENSE):
    """Logits [B, T, V] float32 from `hidden` (the LM head without its norm, already applied)."""
    unembed_DV = pieces.unembed_matrix(params, cfg).astype(h_BTD.dtype)
    logits_BTV = jnp.einsum("btd,dv->btv", h_BTD, unembed_DV)
    return pc.constrain(logits_BTV, ("batch", "seq", "act_vocab")).astype(jnp.float32)


def scalar(head, h_BTD):
    """A scalar per position [B, T] float32."""
    return jnp.einsum("btd,d->bt", h_BTD.astype(jnp.float32), head["w_D"]) + head["b"]


def init_head(cfg: ModelConfig):
    # zeros: a fresh critic predicts 0 and a fresh reward model scores every response alike
    return {"w_D": jnp.zeros((cfg.d_model,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


HEAD_AXES = {"w_D": ("norm",), "b": ()}  # small: replicated under every rule


def response_logits_logp(params, seq_BS, P: int, cfg, pc=pieces.DENSE):
    """(log-probs [B, N] of the N = S - P response tokens, entropies [B, N], hidden [B, S, D]):
    logits at positions P-1 .. S-2 predict tokens P .. S-1."""
    h_BSD = hidden(params, seq_BS, cfg, pc)
    logp_BNV = jax.nn.log_softmax(lm_logits(params, h_BSD[:, P - 1 : -1], cfg, pc), axis=-1)
    logp_BN = jnp.take_along_axis(logp_BNV, seq_BS[:, P:, None], -1)[..., 0]
    ent_BN = -jnp.sum(jnp.exp(logp_BNV) * logp_BNV, -1)
    return logp_BN, ent_BN, h_BSD


def policy_init(actor_params, cfg: ModelConfig, critic: str, critic_params=None):
    """The trained tree: actor, the value head, and (separate critic) the critic's backbone;
    GRPO passes critic=None (no critic at all)."""
    if critic not in (*CRITICS, None):
        raise ValueError(f"critic must be one of {', '.join(CRITICS)}, got {critic!r}")
    tree = {"actor": actor_params}
    if critic is not None:
        tree["value_head"] = init_head(cfg)
    if critic == "separate":
        tree["critic"] = actor_params if critic_params is None else critic_params
    return tree


def reward_forward(rm, seq_BS, last_B, cfg, pc=pieces.DENSE):
    """The reward model's score [B] at each row's last valid position."""
    s_BS = scalar(rm["head"], hidden(rm["backbone"], seq_BS, cfg, pc))
    return jnp.take_along_axis(s_BS, last_B[:, None], 1)[:, 0]


def reward_model_init(params, cfg: ModelConfig):
    """The reward model: the transformer without its LM head (unused), and a scalar head."""
    return {
        "backbone": {k: v for k, v in params.items() if k != "unembed_DV"},
        "head": init_head(cfg),
    }


def logical_axes(tree, cfg: ModelConfig):
    """Logical axes of a tree of transformers ({"actor", "critic", "backbone"}) and heads."""
    out = {}
    for k, sub in tree.items():
        axes = HEAD_AXES if k in ("value_head", "head") else ms.logical_axes(cfg)
        out[k] = {name: axes[name] for name in sub}
    return out
