"""RLHF's three phases as jitted programs (seed 002 ch13, "The RLHF Training Loop"):

    generate  the actor samples responses with the KV cache (`serve.generate.generate_batch`: one
              prefill, `lax.scan` over new tokens, EOS masking) and its log-probs (temperature 1,
              so they are the behaviour policy's)
    score     the frozen reference's log-probs, the reward model's score at the last valid token,
              the critic's values; per-token KL, shaped rewards, GAE (gamma, lambda over the
              response mask) or GRPO's group-relative advantages
    train     epochs x minibatches (`Train`: one compiled `update` per minibatch) of the clipped
              policy loss (+ c1 x value loss - c2 x entropy;
              GRPO: + beta x k3 KL to the reference in the loss) on the actor (and critic)

Sharding is the auto path: each phase's arrays carry NamedShardings from the one rules table and
GSPMD places the collectives (FSDP: all-gather weights, reduce-scatter gradients; TP: all-reduce
activations). Rows split over the data axes. Minibatch m takes rows m, m+M, ... so every device's
rows split evenly without moving data. Arrays are [B, N] over the N response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import optax

from jaxscale.config import ModelConfig
from jaxscale.parallel.auto import auto_pieces
from jaxscale.rl import gae as gae_lib
from jaxscale.rlhf import models
from jaxscale.rlhf import rewards as rw
from jaxscale.rlhf.config import RLHFConfig
from jaxscale.serve import generate as gen
from jaxscale.sharding import Sharder


@dataclass(frozen=True)
class Shapes:
    P: int  # prompt tokens
    N: int  # response budget
    eos: int


def rollout(params, prompts_BP, seeds_B, cfg: ModelConfig, sh: Shapes, sharder=None):
    """(tokens [B, N], valid [B, N], log-probs [B, N]) sampled at temperature 1."""
    B = prompts_BP.shape[0]
    settings = {
        "temperature": jnp.ones((B,), jnp.float32),
        "top_k": jnp.zeros((B,), jnp.int32),
        "top_p": jnp.ones((B,), jnp.float32),
        "seed": seeds_B,
    }
    lengths_B = jnp.full((B,), sh.P, jnp.int32)
    budget_B = jnp.full((B,), sh.N, jnp.int32)
    return gen.generate_batch(
        params, prompts_BP, lengths_B, settings, budget_B, cfg, sh.N, sh.eos, sharder
    )


def values(tree, seq_BS, P, cfg, pc):
    backbone = tree.get("critic", tree["actor"])
    return models.scalar(
        tree["value_head"], models.hidden(backbone, seq_BS, cfg, pc)[:, P - 1 : -1]
    )


def advantages(rc: RLHFConfig, rew_BN, v_BN, mask_BN):
    """GAE over response tokens (time-major for `gae`): the value after the last real token is 0
    (the response ended), and padding after it neither counts nor flows back."""
    m_BN = mask_BN.astype(jnp.float32)
    next_m_BN = jnp.pad(m_BN[:, 1:], ((0, 0), (0, 1)))
    next_v_BN = jnp.pad(v_BN[:, 1:], ((0, 0), (0, 1))) * next_m_BN
    end_BN = 1.0 - next_m_BN
    adv_NB, ret_NB = gae_lib.gae(
        rew_BN.T, (v_BN * m_BN).T, next_v_BN.T, end_BN.T, end_BN.T, rc.gamma, rc.lam, m_BN.T
    )
    return adv_NB.T, ret_NB.T


def score(
    tree, ref, rm, seq_BS, valid_BN, logp_BN, beta, rc: RLHFConfig, cfg, sh: Shapes, sharder=None
):
    """-> (the training batch, metrics). The reward model reads the last valid token P + n - 1."""
    pc = auto_pieces(sharder)
    m_BN = valid_BN.astype(jnp.float32)
    ref_logp_BN = jax.lax.stop_gradient(models.response_logits_logp(ref, seq_BS, sh.P, cfg, pc)[0])
    rm_B = models.reward_forward(rm, seq_BS, sh.P + rw.last_index(valid_BN), cfg, pc)
    k1_BN = (logp_BN - ref_logp_BN) * m_BN
    kl_BN = rw.kl_per_token(logp_BN, ref_logp_BN, rc.kl_estimator) * m_BN
    batch = {"seq": seq_BS, "mask": m_BN, "old_logp": logp_BN, "ref_logp": ref_logp_BN}
    if rc.algo == "ppo":
        v_BN = values(tree, seq_BS, sh.P, cfg, pc) * m_BN
        rew_BN = rw.shaped_rewards(rm_B, kl_BN, m_BN, beta, rc.reward_mode)
        adv_BN, ret_BN = advantages(rc, rew_BN, v_BN, m_BN)
        batch |= {"adv": rw.whiten(adv_BN, m_BN, rc.whiten), "ret": ret_BN, "old_v": v_BN}
        extra = {"value": rw.masked_mean(v_BN, m_BN), "return": rw.masked_mean(ret_BN, m_BN)}
    else:  # GRPO: the score is the whole reward; the KL enters the loss
        batch |= {"adv": rw.group_advantages(rm_B, rc.group)[:, None] * m_BN}
        extra = {}
    return batch, {
        "rm_score": rm_B.mean(),
        "kl": k1_BN.sum(-1).mean(),  # k1 summed over a response: the sequence KL estimate
        "kl_estimate": kl_BN.sum(-1).mean(),
        "length": m_BN.sum(-1).mean(),
        **extra,
    }


def loss(tree, mb, beta, rc: RLHFConfig, cfg, sh: Shapes, pc):
    m_BN = mb["mask"]
    logp_BN, ent_BN, h_BSD = models.response_logits_logp(tree["actor"], mb["seq"], sh.P, cfg, pc)
    log_ratio_BN = logp_BN - mb["old_logp"]
    ratio_BN = jnp.exp(log_ratio_BN)
    clipped_BN = jnp.clip(ratio_BN, 1.0 - rc.clip_eps, 1.0 + rc.clip_eps)
    pg = rw.masked_mean(-jnp.minimum(ratio_BN * mb["adv"], clipped_BN * mb["adv"]), m_BN)
    ent = rw.masked_mean(ent_BN, m_BN)
    out = {
        "policy_loss": pg,
        "entropy": ent,
        "clip_frac": rw.masked_mean((jnp.abs(ratio_BN - 1.0) > rc.clip_eps), m_BN),
        "approx_kl": rw.masked_mean(jnp.expm1(-log_ratio_BN) + log_ratio_BN, m_BN),
    }
    total = pg - rc.ent_coef * ent
    if rc.algo == "ppo":
        if "critic" in tree:
            h_BSD = models.hidden(tree["critic"], mb["seq"], cfg, pc)
        v_BN = models.scalar(tree["value_head"], h_BSD[:, sh.P - 1 : -1])
        # the target is the GAE return (values + advantages), not the raw reward (seed pseudo-code)
        v_loss = 0.5 * rw.masked_mean(jnp.square(v_BN - mb["ret"]), m_BN)
        total += rc.vf_coef * v_loss
        out["value_loss"] = v_loss
    else:
        kl = rw.masked_mean(rw.kl_per_token(logp_BN, mb["ref_logp"], "k3"), m_BN)
        total += beta * kl
        out["kl_loss"] = kl
    return total, out


def optimizer(rc: RLHFConfig):
    return optax.chain(optax.clip_by_global_norm(rc.max_grad_norm), optax.adam(rc.lr, eps=1e-5))


def update(tree, opt_state, batch, m, beta, rc: RLHFConfig, cfg, sh: Shapes, sharder=None):
    """One Adam step on minibatch m (rows m, m+M, ...) of the rollout batch."""
    pc = auto_pieces(sharder)
    M = rc.minibatches
    mb = jax.tree.map(lambda x: x.reshape(x.shape[0] // M, M, *x.shape[1:])[:, m], batch)
    (_, aux), grads = jax.value_and_grad(loss, has_aux=True)(tree, mb, beta, rc, cfg, sh, pc)
    updates, opt_state = optimizer(rc).update(grads, opt_state, tree)
    aux["grad_norm"] = optax.tree_utils.tree_norm(grads)  # pre-clip
    return optax.apply_updates(tree, updates), opt_state, aux


@dataclass(frozen=True)
class Train:
    """Epochs x minibatches of `update`, one compiled step dispatched from the host: no loop in
    the program, so no collective inside a loop body can meet one outside it in another order
    on another device (XLA:CPU's in-process collectives can deadlock on that with few cores)."""

    step: object  # the jitted `update`
    rc: RLHFConfig

    def __call__(self, tree, opt_state, batch, beta):
        """-> (tree, opt_state, metrics averaged over every minibatch step)."""
        auxs = []
        for _ in range(self.rc.epochs):
            for m in range(self.rc.minibatches):
                tree, opt_state, aux = self.step(tree, opt_state, batch, jnp.int32(m), beta)
                auxs.append(aux)
        return tree, opt_state, jax.tree.map(lambda *x: jnp.mean(jnp.stack(x)), *auxs)


def jitted(
    cfg: ModelConfig,
    rc: RLHFConfig,
    sh: Shapes,
    train_sharder: Sharder | None,
    gen_sharder: Sharder | None,
    tree_shardings=None,
    opt_shardings=None,
):
    """The three phases, compiled for these meshes (the state keeps its sharding through
    `train`: out_shardings, and its buffers are donated)."""
    g = jax.jit(partial(rollout, cfg=cfg, sh=sh, sharder=gen_sharder))
    s = jax.jit(partial(score, rc=rc, cfg=cfg, sh=sh, sharder=train_sharder))
    out = None if tree_shardings is None else (tree_shardings, opt_shardings, None)
    u = jax.jit(
        partial(update, rc=rc, cfg=cfg, sh=sh, sharder=train_sharder),
        out_shardings=out,
        donate_argnums=(0, 1),
    )
    return g, s, Train(u, rc)
