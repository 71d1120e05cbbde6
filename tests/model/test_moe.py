"""The mixture-of-experts layer (jaxscale/model/moe.py) against independent references: the
per-token oracle, a Python loop that assigns slots and drops, the balance loss's known values,
and the parameter / FLOP counts against eval_shape and cost_analysis. Expert parallelism's
sharded layer drops exactly the reference's tokens, and two planted bugs in its all-to-alls are
caught by the equivalence check."""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale import verify
from jaxscale.calc.scaling_laws import MoEConfig
from jaxscale.config import ModelConfig
from jaxscale.mesh import build_mesh
from jaxscale.model import counts, moe, pieces
from jaxscale.model import state as ms
from jaxscale.parallel import ep
from jaxscale.parallel.compose import Strategy, build
from jaxscale.parallel.pp import execute
from jaxscale.tolerances import ATOL, RTOL

CFG = ModelConfig(n_experts=8, top_k=2, capacity_factor=2.0)


def _layer(cfg, seed=0):
    return {k: v[0] for k, v in ms.init_params(cfg, seed)["blocks"].items()}


def _h(B=4, T=32, D=64, seed=1):
    return jax.random.normal(jax.random.key(seed), (B, T, D))


def _loop_slots(expert_BTX, capacity):
    """Slots and drops by the rule stated in moe.py, as a plain loop: first choices of every
    token in order, then second choices; an expert's (C+1)-th assignment is dropped."""
    expert_BTX = np.asarray(expert_BTX)
    B, T, X = expert_BTX.shape
    slot = np.zeros((B, T, X), int)
    for b in range(B):
        used: dict = {}
        for x in range(X):
            for t in range(T):
                e = int(expert_BTX[b, t, x])
                slot[b, t, x] = used.get(e, 0)
                used[e] = used.get(e, 0) + 1
    return slot, slot >= capacity


@pytest.mark.parametrize(
    "cf, T, k, E, mode, want",
    [  # C = ceil(cf * T * k / E) (seed 002 ch. 7); dropless: T, the worst case
        (1.25, 64, 2, 8, "capacity", 20),
        (2.0, 32, 2, 8, "capacity", 16),
        (0.5, 32, 2, 8, "capacity", 4),
        (1.0, 10, 1, 4, "capacity", 3),  # 2.5 rounds up
        (8.0, 32, 2, 8, "capacity", 32),  # never more than the tokens
        (1.0, 32, 2, 8, "dropless", 32),
    ],
)
def test_capacity_is_the_seeds_formula(cf, T, k, E, mode, want):
    cfg = ModelConfig(n_experts=E, top_k=k, capacity_factor=cf, moe_mode=mode)
    assert cfg.capacity(T) == want


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(n_experts=4, top_k=5), "exceeds n_experts"),
        (dict(n_experts=4, n_layers=3, moe_every=2), "does not divide n_layers"),
        (dict(n_experts=4, capacity_factor=0.0), "capacity_factor must be > 0"),
        (dict(n_experts=4, moe_mode="ragged"), "moe_mode"),
        (dict(n_experts=-1), "n_experts must be"),
        (dict(n_experts=4, aux_loss_weight=-1.0), "aux_loss_weight"),
    ],
)
def test_impossible_moe_configs_rejected(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    "text, mesh, cfg, fragment",
    [
        ("manual:dp+ep", "ep=4,dp=2", ModelConfig(), "needs a mixture-of-experts model"),
        ("auto", "ep=4,dp=2", ModelConfig(n_experts=6), "not divisible by the expert-parallel"),
        ("manual:tp_gather", "tp=8", CFG, "tp_gather is seed 004's dense-MLP"),
        (
            "manual:dp+1f1b",
            "pp=4,dp=2",
            CFG.replace(n_layers=4, moe_every=2),
            "does not hold whole groups",
        ),
    ],
)
def test_impossible_moe_strategies_rejected(text, mesh, cfg, fragment):
    with pytest.raises(ValueError, match=fragment):
        build(Strategy.parse(text, mesh, microbatches=4), cfg, verify.TCFG)


def test_slots_follow_the_stated_priority():
    _, _, _, expert_BTX = moe.route(_h(), _layer(CFG)["w_router_DE"], CFG)
    want, _ = _loop_slots(expert_BTX, 0)
    np.testing.assert_array_equal(np.asarray(moe.slots(expert_BTX, CFG.n_experts)), want)


@pytest.mark.parametrize(
    "cfg",
    [
        CFG.replace(moe_mode="dropless"),
        CFG.replace(capacity_factor=4.0),
        CFG.replace(top_k=1, moe_mode="dropless"),
        pytest.param(
            CFG.replace(mlp="gelu", moe_mode="dropless"),
            marks=[pytest.mark.slow, pytest.mark.first_line],
        ),
    ],
    ids=["dropless", "cf4", "top1", "gelu"],
)
def test_moe_layer_without_drops_equals_the_per_token_oracle(cfg):
    p, h = _layer(cfg), _h()
    y, stats = moe.moe_mlp(h, p, cfg, pieces.DENSE)
    assert float(stats["drop"]) == 0.0
    np.testing.assert_allclose(y, moe.reference_mlp(h, p, cfg), rtol=RTOL, atol=ATOL)


def test_small_capacity_drops_the_loops_assignments_and_only_those():
    cfg = CFG.replace(capacity_factor=0.5)  # C = 4 of a sequence's 64 assignments
    p, h = _layer(cfg), _h()
    _, _, _, expert_BTX = moe.route(h, p["w_router_DE"], cfg)
    _, dropped = _loop_slots(expert_BTX, cfg.capacity(h.shape[1]))
    assert 0.3 < dropped.mean() < 0.9  # a real test of dropping
    y, stats = moe.moe_mlp(h, p, cfg, pieces.DENSE)
    np.testing.assert_allclose(float(stats["drop"]), dropped.mean(), rtol=1e-6)
    want = moe.reference_mlp(h, p, cfg, dropped_BTX=jnp.asarray(dropped))
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mesh_text", ["ep=8", "ep=4,dp=2"])
def test_expert_parallel_layer_drops_exactly_the_reference_tokens(mesh_text):
    """The layer under shard_map with its two all-to-alls, rows split over the batch axes: the
    output is the oracle with the single-device drop mask removed (another mask would differ)."""
    cfg = CFG.replace(capacity_factor=0.5)
    mesh = build_mesh(mesh_text)
    batch_axes = tuple(a for a in ("data", "expert") if a in mesh.shape)
    p, h = _layer(cfg), _h(B=8)
    _, _, _, expert_BTX = moe.route(h, p["w_router_DE"], cfg)
    _, dropped = _loop_slots(expert_BTX, cfg.capacity(h.shape[1]))
    specs = {k: jax.P("expert") if k in moe.EXPERT_KEYS else jax.P() for k in p}
    pc = ep.expert_pieces(pieces.DENSE)

    def layer(h_local, p_local):
        y, stats = moe.moe_mlp(h_local, p_local, cfg, pc)
        return y, jax.lax.pmean(stats["drop"], batch_axes)

    f = jax.jit(
        jax.shard_map(
            layer,
            mesh=mesh,
            in_specs=(jax.P(batch_axes), specs),
            out_specs=(jax.P(batch_axes), jax.P()),
        )
    )
    y, drop = f(h, p)
    np.testing.assert_allclose(float(drop), dropped.mean(), rtol=1e-6)
    want = moe.reference_mlp(h, p, cfg, dropped_BTX=jnp.asarray(dropped))
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)


def test_balance_loss_is_one_when_balanced_and_e_over_k_when_collapsed():
    """Switch's E * sum_e f_e P_e: uniform router probabilities give 1 whatever the counts;
    every token sending its k choices to the same k experts with probability ~1/k each gives
    E * k * (1/k)(1/k) = E / k."""
    E, k, B, T = 8, 2, 2, 16
    expert_BTX = jnp.broadcast_to(jnp.arange(k), (B, T, k))
    kept = jnp.ones((B, T, k), bool)
    uniform = jnp.full((B, T, E), 1 / E)
    zeros = jnp.zeros((B, T, E))
    assert float(moe.stats(zeros, uniform, expert_BTX, kept, E)["aux"]) == pytest.approx(1.0)
    collapsed = jnp.zeros((B, T, E)).at[..., :k].set(1 / k)
    got = float(moe.stats(zeros, collapsed, expert_BTX, kept, E)["aux"])
    assert got == pytest.approx(E / k)


def test_z_loss_and_load_match_numpy():
    cfg = CFG
    p, h = _layer(cfg), _h()
    logits, probs, _, expert_BTX = moe.route(h, p["w_router_DE"], cfg)
    stats = moe.stats(logits, probs, expert_BTX, jnp.ones(expert_BTX.shape, bool), 8)
    lg = np.asarray(logits, np.float64)
    lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
    np.testing.assert_allclose(float(stats["z"]), np.mean(lse**2), rtol=1e-5)
    counts_E = np.bincount(np.asarray(expert_BTX).ravel(), minlength=8)
    np.testing.assert_allclose(stats["load"], counts_E / counts_E.sum(), rtol=1e-6)


@pytest.mark.parametrize("cfg", [CFG, CFG.replace(n_layers=4, moe_every=2, top_k=1)])
def test_total_and_active_parameters_equal_eval_shape_and_calc_moe(cfg):
    shapes = ms.abstract_params(cfg)
    names = jax.tree.leaves(ms.logical_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    sizes = [math.prod(s.shape) for s in jax.tree.leaves(shapes)]
    total = sum(sizes)
    expert = sum(n for n, nm in zip(sizes, names, strict=True) if "expert" in nm)
    active = total - expert + expert * cfg.top_k // cfg.n_experts
    assert counts.param_count(cfg) == total
    assert counts.param_count(cfg, experts_per_token=cfg.top_k) == active
    shared, one_expert = counts.moe_split(cfg)
    calc = MoEConfig(shared, cfg.n_experts, one_expert, cfg.top_k)
    assert (calc.total_params, calc.active_params) == (total, active)


def _buggy_rows(buf_EBCD, p, cfg, *, axis=ep.AXIS):
    """Combine with the wrong inverse permutation: the experts' outputs go back to the
    sources in reversed order (each source receives another source's rows)."""
    mine = jax.lax.all_to_all(buf_EBCD, axis, split_axis=0, concat_axis=1, tiled=True)
    out = moe.local_experts(mine, p, cfg)
    n = jax.lax.axis_size(axis)
    out = out.reshape(out.shape[0], n, -1, *out.shape[2:])[:, ::-1].reshape(out.shape)
    return jax.lax.all_to_all(out, axis, split_axis=1, concat_axis=0, tiled=True)


def _missing_all_to_all(buf_EBCD, p, cfg, *, axis=ep.AXIS):
    """No all-to-all: each device runs its experts on its own rows' slots only."""
    n_local = p["we_up_EDF"].shape[0]
    start = jax.lax.axis_index(axis) * n_local
    mine = jax.lax.dynamic_slice_in_dim(buf_EBCD, start, n_local, axis=0)
    out = moe.local_experts(mine, p, cfg)
    full = jnp.zeros(buf_EBCD.shape, out.dtype)
    return jax.lax.dynamic_update_slice_in_dim(full, out, start, axis=0)


@pytest.mark.slow  # each runs a 10-step verify case
@pytest.mark.first_line
@pytest.mark.parametrize("bug", [_buggy_rows, _missing_all_to_all], ids=["rows", "no-a2a"])
def test_a_planted_all_to_all_bug_is_caught(monkeypatch, bug):
    case = next(
        c
        for c in verify.CASES
        if c.model
        and c.mesh == "ep=4,dp=2"
        and c.strategy.path == "manual"
        and c.label.endswith("cf=2")
    )
    ref = verify.reference_for(case, {})
    monkeypatch.setattr(ep, "dispatch_experts", bug)
    result = verify.check(case, ref)
    assert result.error is None, result.error
    assert not result.loss_ok and not result.passed


@pytest.mark.parametrize("text", ["manual:dp+ep", "auto"])
@pytest.mark.parametrize("cf, drops", [(2.0, False), (0.5, True)], ids=["cf2", "cf0.5"])
def test_sharded_routing_terms_equal_the_reference(text, cf, drops):
    """The loss's terms (cross-entropy, balance and z losses, drop fraction, per-expert load) of
    a step's batch, sharded over ep=4,dp=2, equal the single-device ones: with cf 2 the verify
    cases drop nothing, with cf 0.5 both drop the same share."""
    case = verify.Case(
        Strategy.parse(text, "ep=4,dp=2"), model=(*verify.MOE, ("capacity_factor", cf))
    )
    cfg, tcfg = case.configs(verify.CFG, verify.TCFG)
    params = ms.init_params(cfg, tcfg.seed)
    batch = verify.batches(tcfg, 1)[0]
    want = jax.jit(lambda p, b: pieces.loss_terms(p, b, cfg)[1])(params, batch)
    built = build(case.strategy, cfg, tcfg)
    with jax.set_mesh(built.mesh):
        got = built.terms(jax.device_put(params, built.state_shardings["params"]), built.put(batch))
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=ATOL, err_msg=key)
    assert (float(want["drop_fraction"]) > 0.05) == drops


def _numpy_route(h_BTD, w_router_DE, k):
    """The router from moe.py's docstring, float64: softmax(h W_router), the k largest
    probabilities, renormalised to sum to 1 when k > 1 (k = 1 keeps the raw probability)."""
    logits_BTE = np.asarray(h_BTD, np.float64) @ np.asarray(w_router_DE, np.float64)
    e_BTE = np.exp(logits_BTE - logits_BTE.max(-1, keepdims=True))
    probs_BTE = e_BTE / e_BTE.sum(-1, keepdims=True)
    expert_BTX = np.argsort(-probs_BTE, axis=-1, kind="stable")[..., :k]
    top_BTX = np.take_along_axis(probs_BTE, expert_BTX, -1)
    gates_BTX = top_BTX / top_BTX.sum(-1, keepdims=True) if k > 1 else top_BTX
    return probs_BTE, gates_BTX, expert_BTX


def _numpy_moe_layer(h_BTD, p, k):
    """The dropless SwiGLU MoE MLP from its equation, float64, a loop over tokens: y = the sum
    over the token's k experts of gate * W_down (silu(h W_gate) * h W_up)."""
    w = {key: np.asarray(p[key], np.float64) for key in moe.MOE_KEYS}
    h_BTD = np.asarray(h_BTD, np.float64)
    _, gates_BTX, expert_BTX = _numpy_route(h_BTD, w["w_router_DE"], k)
    y_BTD = np.zeros_like(h_BTD)
    for b, t, x in np.ndindex(*gates_BTX.shape):
        e, h_D = expert_BTX[b, t, x], h_BTD[b, t]
        gate_F, up_F = h_D @ w["we_gate_EDF"][e], h_D @ w["we_up_EDF"][e]
        act_F = gate_F / (1 + np.exp(-gate_F)) * up_F
        y_BTD[b, t] += gates_BTX[b, t, x] * (act_F @ w["we_down_EFD"][e])
    return y_BTD


@pytest.mark.parametrize("k", [1, 2, 3])
def test_router_gates_are_the_chosen_probabilities_renormalised(k):
    """The router against its stated rule in NumPy. Catches gates left unnormalised for k > 1
    (their sum would be the chosen experts' share of the probability, about 0.55 here, not 1), a
    k = 1 gate renormalised to 1, and a wrong choice or order of experts. reference_mlp calls
    `route` itself, so the layer-vs-oracle tests above cannot see a bug in the gates."""
    cfg = CFG.replace(top_k=k)
    p, h_BTD = _layer(cfg), _h()
    _, probs_BTE, gates_BTX, expert_BTX = moe.route(h_BTD, p["w_router_DE"], cfg)
    want_probs, want_gates, want_experts = _numpy_route(h_BTD, p["w_router_DE"], k)
    np.testing.assert_allclose(probs_BTE, want_probs, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(np.asarray(expert_BTX), want_experts)
    np.testing.assert_allclose(gates_BTX, want_gates, rtol=RTOL, atol=ATOL)
    if k > 1:  # the rule itself: one unit of weight per token, split over its k experts
        np.testing.assert_allclose(np.sum(gates_BTX, -1), 1.0, rtol=RTOL)
    # the other rule (renormalised at k = 1, raw at k > 1) is far outside the tolerance here
    raw_BTX = np.take_along_axis(want_probs, want_experts, -1)
    other = raw_BTX / raw_BTX.sum(-1, keepdims=True) if k == 1 else raw_BTX
    assert np.abs(other - want_gates).max() > 100 * (ATOL + RTOL)


@pytest.mark.parametrize("k", [1, 2])
def test_moe_layer_combine_weights_equal_a_numpy_layer(k):
    """The whole dropless layer (route, scatter, experts, gate-weighted combine) against a NumPy
    loop written from the equation, sharing no code with moe.py: a combine that weights the
    experts' outputs by anything but the renormalised gates (k > 1) or the raw top probability
    (k = 1) fails here."""
    cfg = CFG.replace(top_k=k, moe_mode="dropless")
    assert cfg.mlp == "swiglu"  # the NumPy layer's activation
    p, h_BTD = _layer(cfg), _h(B=2, T=8)
    y_BTD, stats = moe.moe_mlp(h_BTD, p, cfg, pieces.DENSE)
    assert float(stats["drop"]) == 0.0
    np.testing.assert_allclose(y_BTD, _numpy_moe_layer(h_BTD, p, k), rtol=RTOL, atol=ATOL)


def test_pipeline_stages_router_losses_add_to_the_one_device_value():
    """Each pipeline stage adds its MoE layers' router losses over ALL L/n MoE layers, so the
    stages' shares sum to the one-device aux_loss_weight x mean balance loss + z_loss_weight x
    mean z-loss (`loss_terms`, which averages the stacked statistics itself). Two stages of two
    layers, one MoE layer each: a per-stage mean would count every layer twice."""
    moe_cfg = dict(n_experts=4, top_k=2, moe_every=2, aux_loss_weight=0.5, z_loss_weight=0.25)
    cfg = ModelConfig(n_layers=4, d_model=32, n_heads=2, n_kv_heads=2, d_ff=32, vocab=64, **moe_cfg)
    rng = np.random.default_rng(0)  # any parameters will do: numpy's are quicker than init's
    params = jax.tree.map(
        lambda a: jnp.asarray(rng.normal(0, 0.3, a.shape), a.dtype), ms.abstract_params(cfg)
    )
    tokens_BT1 = jnp.asarray(rng.integers(0, cfg.vocab, (2, 9)))

    @jax.jit
    def shares_and_terms(params, tokens_BT1):
        top, blocks = pieces.split_params(params)
        half = [jax.tree.map(lambda a, s=s: jnp.split(a, 2)[s], blocks) for s in range(2)]
        stage = partial(execute._stage, cfg, pieces.DENSE)  # positions: the whole window
        x_BTD, first = stage(True, top, half[0], None, tokens_BT1)
        _, second = stage(False, top, half[1], x_BTD, tokens_BT1)
        return first, second, pieces.loss_terms(params, tokens_BT1, cfg)[1]

    first_share, second_share, terms = shares_and_terms(params, tokens_BT1)
    want = cfg.aux_loss_weight * float(terms["aux_loss"]) + cfg.z_loss_weight * float(
        terms["z_loss"]
    )
    assert float(first_share) != pytest.approx(float(second_share))  # two distinct layers
    np.testing.assert_allclose(float(first_share) + float(second_share), want, rtol=1e-5)
