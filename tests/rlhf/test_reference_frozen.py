"""RLHF's reference is the initial actor, frozen: what scoring reads as the reference's
log-probs is, at every iteration, the log-probs of the actor's starting parameters (a plain
forward over a copy kept before the run), while the trained actor's have moved away from them.
A tiny random model on one device, two iterations (the second scores after an update)."""

import jax
import numpy as np

from jaxscale.config import ModelConfig
from jaxscale.model import pieces
from jaxscale.model import state as ms
from jaxscale.rlhf import models, run
from jaxscale.rlhf import task as tk
from jaxscale.rlhf.config import RLHFConfig
from jaxscale.tolerances import ATOL, RTOL

CFG = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq=32)
TASK = tk.TaskConfig(prompt_len=8, max_new=8, min_new=0, max_lines=400)
RC = RLHFConfig(iterations=2, responses=8, epochs=1, minibatches=1, lr=1e-2, kl_target=1.0)


def _random_models(seed=0):
    """(actor, reward model) of random weights drawn by NumPy (quicker than init's)."""
    rng = np.random.default_rng(seed)

    def draw():
        return jax.tree.map(
            lambda a: rng.normal(0, 0.3, a.shape).astype(a.dtype), ms.abstract_params(CFG)
        )

    rm = models.reward_model_init(draw(), CFG)
    rm["head"] = {"w_D": rng.normal(0, 1, CFG.d_model).astype(np.float32), "b": np.float32(0.1)}
    return draw(), rm


_logits = jax.jit(pieces.logits, static_argnums=2)


def _response_logp(params, seq_BS):
    """log p(token s | tokens < s) for the response tokens s >= P, from the whole model's
    logits (NumPy log-softmax)."""
    logits_BSV = np.asarray(_logits(params, seq_BS, CFG), np.float64)
    z_BSV = logits_BSV - logits_BSV.max(-1, keepdims=True)
    logp_BSV = z_BSV - np.log(np.exp(z_BSV).sum(-1, keepdims=True))
    P = TASK.prompt_len
    return np.take_along_axis(logp_BSV[:, P - 1 : -1], seq_BS[:, P:, None], -1)[..., 0]


def test_scoring_reads_the_initial_actor_not_the_trained_one():
    from jaxscale.train.data import load_stdlib_corpus

    actor, rm = _random_models()
    initial = jax.tree.map(np.array, actor)  # a copy, before anything is placed or trained
    train, held = tk.split(tk.prompt_lines(load_stdlib_corpus(100_000), TASK))
    lab = run.build(RC, CFG, actor, rm, "dp=1", TASK, devices=jax.devices()[:1])
    generate, score, update = lab.phases
    scored = []

    def recording_score(tree, ref, rm, seq, valid, logp, beta):
        batch, metrics = score(tree, ref, rm, seq, valid, logp, beta)
        actor_now = jax.tree.map(np.array, tree["actor"])  # before the update donates it
        scored.append((np.asarray(seq), np.asarray(batch["ref_logp"]), actor_now))
        return batch, metrics

    lab.phases = (generate, recording_score, update)
    run.iterate(lab, train, held[:8], TASK)
    assert len(scored) == 2
    for seq_BS, ref_logp_BN, _ in scored:
        want_BN = _response_logp(initial, seq_BS)
        np.testing.assert_allclose(ref_logp_BN, want_BN, rtol=RTOL, atol=ATOL)
    seq_BS, _, actor_now = scored[-1]
    moved = np.abs(_response_logp(actor_now, seq_BS) - _response_logp(initial, seq_BS)).mean()
    assert moved > 1e-3  # the trained actor is not the reference: the check above has teeth
