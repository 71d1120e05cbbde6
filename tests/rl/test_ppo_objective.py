"""PPO's loss on one hand-built minibatch against the formulas restated in float64 NumPy (the PPO
paper's clipped surrogate, the clipped value loss, the entropy bonus: jaxscale/rl/ppo.py's
docstring), its gradient against the derivative of those formulas, and the advantage
normalisation of the training loop against (a - mean) / (std + 1e-8) over the global minibatch.

    L = -mean(min(r A, clip(r, 1-eps, 1+eps) A))
        + vf_coef * 0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2))
        - ent_coef * mean(H(pi))
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.rl import loop
from jaxscale.rl.config import RLConfig
from jaxscale.rl.ppo import policy_loss
from jaxscale.tolerances import ATOL, RL_GAE_ATOL, RTOL

EPS = 0.2
# ratios r = pi/pi_old and advantages: inside [0.8, 1.2] (rows 0, 1); past the clip in the
# advantage's favour, where the clipped term is the min and the gradient vanishes (2: r > 1.2,
# A > 0; 3: r < 0.8, A < 0; 6: r > 1.4, A > 0); past the clip against it, where the unclipped term
# is the min (4: r > 1.2, A < 0; 5, 7: r < 0.8, A > 0). With a clip of 1 +- 2 eps rows 2 and 3
# fall inside the range and row 6 is clipped at 1.4 instead: another loss.
RATIO = np.array([1.1, 0.9, 1.3, 0.7, 1.5, 0.5, 1.6, 0.75])
ADV = np.array([1.0, -2.0, 1.5, -1.0, -0.5, 2.0, 1.0, 0.5])
CLIPPED = np.array([False, False, True, True, False, False, True, False])
# min(r A, clip(r) A) per row, by hand
SURROGATE = np.array([1.1, -1.8, 1.2 * 1.5, -0.8, -0.75, 1.0, 1.2, 0.375])
# value head: new V, rollout V_old, return R; |V - V_old| > eps in rows 1, 2, 6, 7
VALUE = np.array([0.5, -0.3, 1.0, 0.0, 2.0, 0.1, -1.0, 0.4])
OLD_VALUE = np.array([0.4, 0.0, 0.5, 0.1, 2.1, 0.1, -0.5, 0.9])
RET = np.array([1.0, -1.0, 0.0, 0.5, 1.0, 0.3, -2.0, 1.5])
# the policy: 3 actions, rows of probabilities (logits = log p) and the action taken
PROBS = np.array(
    [
        [0.5, 0.3, 0.2],
        [0.1, 0.6, 0.3],
        [0.25, 0.25, 0.5],
        [0.7, 0.2, 0.1],
        [0.4, 0.4, 0.2],
        [0.05, 0.15, 0.8],
        [0.3, 0.3, 0.4],
        [0.6, 0.1, 0.3],
    ]
)
ACTION = np.array([0, 1, 2, 0, 1, 2, 0, 2])
N = len(RATIO)


def _inputs():
    """float32 inputs as the loop passes them: logits, value, the minibatch, advantages."""
    logits = jnp.asarray(np.log(PROBS), jnp.float32)
    new_logp = np.log(PROBS[np.arange(N), ACTION])
    mb = {
        "action": jnp.asarray(ACTION, jnp.int32),
        "logp": jnp.asarray(new_logp - np.log(RATIO), jnp.float32),  # pi_old = pi / r
        "value": jnp.asarray(OLD_VALUE, jnp.float32),
        "ret": jnp.asarray(RET, jnp.float32),
    }
    return logits, jnp.asarray(VALUE, jnp.float32), mb, jnp.asarray(ADV, jnp.float32)


def _reference(logits, value, mb, adv, eps, vf_coef, ent_coef, clip_value):
    """The docstring's formulas in float64 on the float32 inputs -> (loss, parts, d loss /
    d logp_new [N], d loss / d value [N])."""
    z = np.asarray(logits, np.float64)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    a = np.asarray(mb["action"])
    logp = logp_all[np.arange(N), a]
    r = np.exp(logp - np.asarray(mb["logp"], np.float64))
    A = np.asarray(adv, np.float64)
    unclipped, clipped = r * A, np.clip(r, 1 - eps, 1 + eps) * A
    pg = -np.minimum(unclipped, clipped).mean()
    # d/d logp of r A is r A; of clip(r) A it is zero where clipping is active
    clip_chosen = (clipped < unclipped) & (np.abs(r - 1) > eps)
    d_logp = np.where(clip_chosen, 0.0, -r * A / N)

    v, v_old, R = (np.asarray(x, np.float64) for x in (value, mb["value"], mb["ret"]))
    e_plain = (v - R) ** 2
    if clip_value:
        v_clip = v_old + np.clip(v - v_old, -eps, eps)
        e_clip = (v_clip - R) ** 2
        v_loss = 0.5 * np.maximum(e_plain, e_clip).mean()
        active = np.abs(v - v_old) > eps  # the clipped value does not move with V
        d_v = np.where(e_plain >= e_clip, v - R, np.where(active, 0.0, v_clip - R))
    else:
        v_loss = 0.5 * e_plain.mean()
        d_v = v - R
    ent = -(np.exp(logp_all) * logp_all).sum(-1).mean()
    loss = pg + vf_coef * v_loss - ent_coef * ent
    parts = {
        "policy_loss": pg,
        "value_loss": v_loss,
        "entropy": ent,
        "clip_frac": np.mean(np.abs(r - 1) > eps),
        "approx_kl": np.mean((r - 1) - np.log(r)),
    }
    return loss, parts, d_logp, vf_coef * d_v / N


def test_the_hand_built_batch_exercises_every_case():
    """The table above is what the comments say (so the tests below mean what they claim), and
    a clip of 1 +- 2 eps would change the surrogate by far more than the tolerance."""
    got = np.minimum(RATIO * ADV, np.clip(RATIO, 1 - EPS, 1 + EPS) * ADV)
    np.testing.assert_allclose(got, SURROGATE, rtol=1e-12)
    np.testing.assert_array_equal(np.clip(RATIO, 1 - EPS, 1 + EPS) * ADV < RATIO * ADV, CLIPPED)
    wide = np.minimum(RATIO * ADV, np.clip(RATIO, 1 - 2 * EPS, 1 + 2 * EPS) * ADV)
    assert abs(wide.mean() - SURROGATE.mean()) > 0.05
    assert np.abs(np.abs(VALUE - OLD_VALUE) - EPS).min() > 0.05  # no value on the clip's edge
    np.testing.assert_allclose(PROBS.sum(-1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("clip_value", [True, False])
def test_ppo_loss_equals_the_clipped_surrogate_formula(clip_value):
    """Catches a changed clip range (1 +- 2 eps, one side only, eps hard-coded), max for min, a
    lost minus sign, a value loss without its 0.5 or its clipping, and a wrong entropy sign or
    coefficient: the loss and each of its parts against the formula, and the surrogate against
    the hand-computed -mean(min(r A, clip(r) A)) = -2.125 / 8."""
    cfg = RLConfig(clip_eps=EPS, vf_coef=0.7, ent_coef=0.05, clip_value=clip_value)
    logits, value, mb, adv = _inputs()
    loss, stats = policy_loss(cfg, logits, value, mb, adv)
    want, parts, _, _ = _reference(logits, value, mb, adv, EPS, 0.7, 0.05, clip_value)
    np.testing.assert_allclose(float(loss), want, rtol=RTOL, atol=ATOL)
    for k, v in parts.items():
        np.testing.assert_allclose(float(stats[k]), v, rtol=RTOL, atol=ATOL, err_msg=k)
    np.testing.assert_allclose(float(stats["policy_loss"]), -SURROGATE.mean(), rtol=RTOL)
    assert SURROGATE.sum() == pytest.approx(2.125)
    assert float(stats["clip_frac"]) == 6 / 8


def test_ppo_loss_uses_the_configured_clip_range():
    """Catches an epsilon that is not cfg.clip_eps: eps 0.1 clips rows 0 and 1 as well."""
    eps = 0.1
    cfg = RLConfig(clip_eps=eps, vf_coef=0.5, ent_coef=0.01)
    logits, value, mb, adv = _inputs()
    loss, stats = policy_loss(cfg, logits, value, mb, adv)
    want, parts, _, _ = _reference(logits, value, mb, adv, eps, 0.5, 0.01, True)
    np.testing.assert_allclose(float(loss), want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(stats["policy_loss"]), parts["policy_loss"], rtol=RTOL)
    other, _, _, _ = _reference(logits, value, mb, adv, EPS, 0.5, 0.01, True)
    assert abs(other - want) > 0.01


def test_ppo_gradient_equals_the_derivative_of_the_formula():
    """Catches a gradient that flows where the clipped term is chosen (or is cut where it is
    not: a stop-gradient on the ratio inside the clip), and a wrong value-loss gradient.

    d L / d logp_i = -r_i A_i / N for a row whose unclipped term is the min, 0 where the clipped
    term is the min and clipping is active. logp_i = z_i[a_i] - logsumexp(z_i), so the gradient
    with respect to the logits is d L / d logp_i * (onehot(a_i) - p_i), plus the entropy bonus's
    -ent_coef / N * dH_i/dz_i = ent_coef / N * p_i * (log p_i + H_i)."""
    ent_coef, vf_coef = 0.05, 0.7
    logits, value, mb, adv = _inputs()
    _, _, d_logp, d_value = _reference(logits, value, mb, adv, EPS, vf_coef, ent_coef, True)
    np.testing.assert_array_equal(d_logp == 0.0, CLIPPED)

    def loss(cfg, lg, v):
        return policy_loss(cfg, lg, v, mb, adv)[0]

    # the policy term alone: recover d L / d logp_i from the taken action's logit
    cfg0 = RLConfig(clip_eps=EPS, vf_coef=vf_coef, ent_coef=0.0)
    g_logits, g_value = jax.grad(loss, argnums=(1, 2))(cfg0, logits, value)
    p = np.asarray(jnp.exp(jax.nn.log_softmax(logits)), np.float64)
    p_taken = p[np.arange(N), ACTION]
    got_d_logp = np.asarray(g_logits, np.float64)[np.arange(N), ACTION] / (1 - p_taken)
    np.testing.assert_allclose(got_d_logp, d_logp, rtol=RTOL, atol=ATOL)
    assert np.all(np.asarray(g_logits)[CLIPPED] == 0.0)  # exactly zero, not just small
    np.testing.assert_allclose(np.asarray(g_value), d_value, rtol=RTOL, atol=ATOL)

    # the whole gradient with respect to the logits, entropy bonus included
    cfg = RLConfig(clip_eps=EPS, vf_coef=vf_coef, ent_coef=ent_coef)
    g_logits = jax.grad(loss, argnums=1)(cfg, logits, value)
    logp_all = np.log(p)
    H = -(p * logp_all).sum(-1, keepdims=True)
    onehot = np.eye(3)[ACTION]
    want = d_logp[:, None] * (onehot - p) + ent_coef / N * p * (logp_all + H)
    np.testing.assert_allclose(np.asarray(g_logits), want, rtol=RTOL, atol=ATOL)


# --- advantage normalisation in the training loop ------------------------------------------

TINY = RLConfig(
    num_envs=4,
    num_steps=16,
    total_steps=64,  # one update
    eval_every=1,
    eval_episodes=0,
    epochs=2,
    minibatches=2,
    hidden=8,
)


def _spy_advantages(monkeypatch, cfg, groups):
    """Run one update with `groups` data shards and record, for every minibatch step of every
    shard, (shard, every shard's raw advantages of this step [groups, rows], this shard's raw
    advantages mb['adv'], the advantages its loss gets)."""
    calls = []

    def record(shard, everyone, raw, used):
        calls.append(
            (int(shard), np.asarray(everyone, np.float64), np.asarray(raw), np.asarray(used))
        )

    def spy(cfg_, logits, value, mb, adv):
        everyone = jax.lax.all_gather(mb["adv"], loop.AXIS)
        jax.debug.callback(record, jax.lax.axis_index(loop.AXIS), everyone, mb["adv"], adv)
        return policy_loss(cfg_, logits, value, mb, adv)

    monkeypatch.setattr(loop, "policy_loss", spy)
    keys = jax.vmap(jax.random.key)(np.arange(1, dtype=np.uint32))
    jax.block_until_ready(loop.run(cfg, keys, groups=groups))
    steps = cfg.n_updates * cfg.n_epochs * cfg.n_minibatches
    assert len(calls) == steps * groups
    return calls


def test_advantages_are_normalised_with_global_minibatch_statistics(monkeypatch):
    """Catches a loop that skips the normalisation, centres or scales only, uses another
    epsilon, or normalises each data shard with its own statistics instead of the all-reduced
    ones (the data-parallel equality test cannot see that: both of its runs share the code).

    With norm_adv on, the loss of each shard gets (a - mean) / (std + 1e-8), mean and
    (population) std taken over the whole minibatch, every shard's rows together; so those
    rows, put back together, have mean 0 and std 1."""
    groups = 2
    calls = _spy_advantages(monkeypatch, TINY, groups)
    by_step = {}
    for shard, everyone, raw, used in calls:
        np.testing.assert_array_equal(raw, everyone[shard])
        a = everyone.ravel()
        want = (everyone[shard] - a.mean()) / (a.std() + 1e-8)
        # float32 advantages against float64 statistics: GAE's own tolerance (absolute)
        np.testing.assert_allclose(used, want, rtol=0, atol=RL_GAE_ATOL)
        by_step.setdefault(everyone.tobytes(), {})[shard] = (a, used)
    assert len(by_step) == TINY.n_epochs * TINY.n_minibatches
    for shards in by_step.values():
        assert sorted(shards) == list(range(groups))
        raw = shards[0][0]
        used = np.concatenate([shards[s][1] for s in range(groups)]).astype(np.float64)
        assert abs(used.mean()) < RL_GAE_ATOL and abs(used.std() - 1.0) < RL_GAE_ATOL
        # the raw advantages are far from normalised, and each shard's own statistics differ
        # from the global ones: skipping the normalisation, or doing it per shard, would fail
        assert abs(raw.mean()) > 0.1 or abs(raw.std() - 1.0) > 0.1
        halves = raw.reshape(groups, -1)
        assert np.abs(halves.mean(1) - raw.mean()).max() > 1e-3


def test_advantages_are_left_alone_without_norm_adv(monkeypatch):
    """Catches a normalisation that ignores --no-norm-adv: the loss gets the GAE advantages."""
    calls = _spy_advantages(monkeypatch, TINY.replace(norm_adv=False), 1)
    for _, _, raw, used in calls:
        np.testing.assert_array_equal(used, raw)
