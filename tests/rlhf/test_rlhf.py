"""RLHF (jaxscale/rlhf/): the task's score, the reward shaping and advantages against
independent NumPy loops, the models' forwards against the training forward, and the loop on a
mesh: 1 device vs 8 (FSDP, and DP x TP) with the same keys, co-located and disaggregated
transfers against the calculator, the one-step-stale variant, per-phase memory. Tiny random
models (the learning itself: tests/rlhf/test_rlhf_learning.py, slow)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from figure_checks import capture, check_figure, legend_texts

from jaxscale.config import ModelConfig
from jaxscale.model import pieces
from jaxscale.model import state as ms
from jaxscale.rlhf import models, phases, report, run, setup
from jaxscale.rlhf import rewards as rw
from jaxscale.rlhf import task as tk
from jaxscale.rlhf.config import RLHFConfig
from jaxscale.tolerances import ATOL, MEMORY_RTOL, RTOL, TRAJ_ATOL

CFG = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq=32)
TASK = tk.TaskConfig(prompt_len=8, max_new=8, min_new=0, max_lines=400)
RC = RLHFConfig(iterations=2, responses=8, epochs=2, minibatches=2, lr=1e-3, kl_target=1.0)


def test_true_score_components():
    task = tk.TaskConfig(min_new=4)
    assert tk.true_score(b"x = foo(", b"a, b)\n", task) == tk.Score(1.0, True, True, True)
    assert tk.true_score(b"x = foo(", b"abcd\n", task) == tk.Score(0.25, True, False, False)
    # balanced and parseable, but no newline within the budget: it never ended
    assert tk.true_score(b"x = foo(", b"a, b)", task) == tk.Score(0.25, False, True, False)
    # would parse, but fewer than min_new bytes before the newline: no credit at all
    assert tk.true_score(b"x = foo", b"d\n", task) == tk.Score(0.0, True, True, False)
    assert tk.true_score(b"if a ", b"== b:\n", task).parses  # a block opener gets " pass"
    assert not tk.true_score(b"x = foo(", b"a, b]\n", task).balanced


def test_prompts_are_prefixes_of_lines_that_parse():
    prompts = tk.prompt_lines(b"x = comp(a)\nif True:\n# comment line\nx = comp(a b\n" * 2, TASK)
    assert [bytes(p.astype(np.uint8)) for p in prompts] == [b"x = comp"]


def _numpy_gae(rew, val, mask, gamma, lam):
    """float64 loop over each row's real tokens; the value after the last one is 0."""
    adv = np.zeros_like(rew, np.float64)
    for b in range(rew.shape[0]):
        n = int(mask[b].sum())
        a = 0.0
        for t in reversed(range(n)):
            nxt = val[b, t + 1] if t + 1 < n else 0.0
            a = rew[b, t] + gamma * nxt - val[b, t] + gamma * lam * a
            adv[b, t] = a
    return adv


def test_shaped_rewards_and_gae_against_numpy():
    rng = np.random.default_rng(0)
    B, N = 4, 6
    lengths = np.array([6, 3, 1, 4])
    mask = (np.arange(N)[None] < lengths[:, None]).astype(np.float32)
    kl = rng.normal(size=(B, N)).astype(np.float32)
    score = rng.normal(size=B).astype(np.float32)
    val = rng.normal(size=(B, N)).astype(np.float32) * mask
    beta = 0.3
    rew = np.asarray(
        rw.shaped_rewards(jnp.asarray(score), jnp.asarray(kl), jnp.asarray(mask), beta, "response")
    )
    want = -beta * kl * mask
    want[np.arange(B), lengths - 1] += score
    np.testing.assert_allclose(rew, want, rtol=RTOL, atol=ATOL)
    tok = np.asarray(
        rw.shaped_rewards(jnp.asarray(score), jnp.asarray(kl), jnp.asarray(mask), beta, "token")
    )
    np.testing.assert_allclose(tok.sum(1), (-beta * kl * mask).sum(1) + score, rtol=RTOL, atol=ATOL)
    rc = RC.replace(gamma=0.9, lam=0.8)
    adv, ret = phases.advantages(rc, jnp.asarray(want), jnp.asarray(val), jnp.asarray(mask))
    np.testing.assert_allclose(adv, _numpy_gae(want, val, mask, 0.9, 0.8), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ret, (np.asarray(adv) + val) * mask, rtol=RTOL, atol=ATOL)


def test_kl_estimators_whitening_and_groups():
    rng = np.random.default_rng(1)
    lp, ref = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    d = lp - ref
    np.testing.assert_allclose(rw.kl_per_token(lp, ref, "k1"), d, rtol=RTOL)
    k3 = np.asarray(rw.kl_per_token(jnp.asarray(lp), jnp.asarray(ref), "k3"))
    np.testing.assert_allclose(k3, np.exp(-d) - 1 + d, rtol=RTOL, atol=ATOL)
    assert (k3 >= 0).all()
    x = rng.normal(size=(3, 5)).astype(np.float32)
    m = np.ones((3, 5), np.float32)
    m[1, 3:] = 0
    wb = np.asarray(rw.whiten(jnp.asarray(x), jnp.asarray(m), "batch"))
    real = x[m > 0]
    np.testing.assert_allclose(wb[m > 0], (real - real.mean()) / real.std(), rtol=1e-4, atol=1e-5)
    assert (wb[m == 0] == 0).all()
    wr = np.asarray(rw.whiten(jnp.asarray(x), jnp.asarray(m), "response"))
    row = x[1, :3]
    np.testing.assert_allclose(wr[1, :3], (row - row.mean()) / row.std(), rtol=1e-4, atol=1e-5)
    s = np.array([1.0, 2.0, 3.0, 5.0, 5.0, 5.0], np.float32)
    g = np.asarray(rw.group_advantages(jnp.asarray(s), 3))
    np.testing.assert_allclose(g[:3], (s[:3] - 2.0) / (s[:3].std() + 1e-6), rtol=RTOL)
    np.testing.assert_allclose(g[3:], 0.0, atol=ATOL)  # equal scores: no signal
    assert rw.adaptive_beta(0.1, 4.0, 1.0, 64, 32) == pytest.approx(0.1 * (1 + 0.2 * 0.5))
    assert rw.adaptive_beta(0.1, 0.5, 1.0, 64, 32) == pytest.approx(0.1 * (1 - 0.2 * 0.5))
    assert rw.adaptive_beta(0.1, 9.0, 0.0, 64, 32) == 0.1  # target 0: fixed


@pytest.fixture(scope="module")
def tiny():
    actor, rm = setup.random_models(CFG, 0)
    train, held = tk.split(tk.prompt_lines(_corpus(), TASK))
    return actor, rm, train, held


def _corpus() -> bytes:
    from jaxscale.train.data import load_stdlib_corpus

    return load_stdlib_corpus(300_000)


def test_forwards_match_the_training_forward(tiny):
    actor, rm, train, _ = tiny
    sh = phases.Shapes(TASK.prompt_len, TASK.max_new, tk.EOS)
    rows = train[:4]
    toks, valid, logp = phases.rollout(
        actor, jnp.asarray(rows), jnp.arange(4, dtype=jnp.uint32), CFG, sh
    )
    seq = jnp.concatenate([jnp.asarray(rows), toks], 1)
    full = jax.nn.log_softmax(pieces.logits(actor, seq, CFG), -1)  # the training forward
    want = jnp.take_along_axis(full[:, sh.P - 1 : -1], seq[:, sh.P :, None], -1)[..., 0]
    got, _, _ = models.response_logits_logp(actor, seq, sh.P, CFG)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    # the rollout's behaviour log-probs (KV cache) are the same numbers where a token was made
    np.testing.assert_allclose(
        np.where(valid, logp, 0), np.where(valid, want, 0), rtol=RTOL, atol=ATOL
    )
    last = jnp.asarray([3, 5, 8, 15])
    h = models.hidden(rm["backbone"], seq, CFG)
    s = h[jnp.arange(4), last] @ rm["head"]["w_D"] + rm["head"]["b"]
    np.testing.assert_allclose(models.reward_forward(rm, seq, last, CFG), s, rtol=RTOL, atol=ATOL)


def _run(tiny, mesh, devices, rc=RC):
    actor, rm, train, held = tiny
    lab = run.build(rc, CFG, actor, rm, mesh, TASK, devices=devices)
    return lab, run.iterate(lab, train, held[:8], TASK)


@pytest.fixture(scope="module")
def one_device(tiny):
    return _run(tiny, "dp=1", jax.devices()[:1])


METRICS = ("true_score", "rm_score", "kl", "beta", "policy_loss", "value_loss", "clip_frac")


@pytest.mark.parametrize("mesh", ["fsdp=8", "dp=2,tp=2"])
def test_a_mesh_gives_the_one_device_run(tiny, one_device, mesh):
    """Same keys: the rollouts are the same tokens, the rewards and metrics the same numbers,
    the parameters after the iterations the same (f32 trajectory tolerance)."""
    devices = jax.devices()[: 8 if mesh == "fsdp=8" else 4]
    _, ref = one_device
    _, got = _run(tiny, mesh, devices)
    for (rows_a, toks_a), (rows_b, toks_b) in zip(ref.rollouts, got.rollouts, strict=True):
        np.testing.assert_array_equal(rows_a, rows_b)
        np.testing.assert_array_equal(toks_a, toks_b)
    for a, b in zip(ref.history, got.history, strict=True):
        for k in METRICS:
            np.testing.assert_allclose(b[k], a[k], rtol=RTOL, atol=TRAJ_ATOL, err_msg=k)
    for x, y in zip(jax.tree.leaves(ref.tree), jax.tree.leaves(got.tree), strict=True):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=TRAJ_ATOL)
    assert ref.history[-1]["kl"] != 0.0  # the actor moved away from the reference


@pytest.mark.slow  # the fast suite keeps the one-device equality on two meshes
@pytest.mark.first_line
def test_grpo_and_a_shared_critic_on_the_mesh(tiny):
    """GRPO (no critic: no value head, the KL in the loss) on fsdp=8 gives the one-device run;
    a shared critic is a value head on the actor's backbone, trained with it."""
    rc = RC.replace(algo="grpo", group=2)
    _, one = _run(tiny, "dp=1", jax.devices()[:1], rc)
    lab, got = _run(tiny, "fsdp=8", jax.devices(), rc)
    assert set(lab.tree) == {"actor"}
    for a, b in zip(one.history, got.history, strict=True):
        for k in ("true_score", "rm_score", "kl", "policy_loss", "kl_loss"):
            np.testing.assert_allclose(b[k], a[k], rtol=RTOL, atol=TRAJ_ATOL, err_msg=k)
    for x, y in zip(jax.tree.leaves(one.tree), jax.tree.leaves(got.tree), strict=True):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=TRAJ_ATOL)
    shared, res = _run(tiny, "fsdp=8", jax.devices(), RC.replace(critic="shared", iterations=1))
    assert set(shared.tree) == {"actor", "value_head"}
    assert np.abs(np.asarray(shared.tree["value_head"]["w_D"])).sum() > 0  # the head trained
    assert res.history[0]["value_loss"] > 0


def test_colocated_transfers_against_the_calculator(tiny, one_device):
    lab, res = one_device
    assert res.transfers[0].bytes_moved == 0  # one device holds everything already
    actor, rm, train, held = tiny
    lab = run.build(RC.replace(iterations=1), CFG, actor, rm, "fsdp=8", TASK)
    n_bytes = sum(x.nbytes for x in jax.tree.leaves(actor))
    _, tr = run.place.transfer(lab.tree["actor"], lab.gen_shardings, lab.meshes)
    assert tr.bytes_moved == tr.bytes_predicted > 0 and not tr.zero_copy
    # only leaves with an embed dimension are split by FSDP; each device gains 7/8 of those
    assert tr.bytes_moved < 7 * n_bytes
    same = run.build(RC.replace(gen_layout="train"), CFG, actor, rm, "fsdp=8", TASK)
    _, tr = run.place.transfer(same.tree["actor"], same.gen_shardings, same.meshes)
    assert tr.zero_copy and tr.bytes_moved == tr.bytes_predicted == 0


@pytest.mark.slow  # the fast suite keeps the one-device equality on two meshes
@pytest.mark.first_line
def test_disaggregated_and_stale(tiny):
    actor, rm, train, held = tiny
    rc = RC.replace(placement="disaggregated", iterations=3)
    lab, res = _run(tiny, "fsdp=4", jax.devices(), rc)
    n_bytes = sum(x.nbytes for x in jax.tree.leaves(actor))
    assert {d.id for d in lab.meshes.train.devices.flat}.isdisjoint(
        {d.id for d in lab.meshes.gen.devices.flat}
    )
    for tr in res.transfers:  # four generation devices each receive the whole actor
        assert tr.bytes_moved == tr.bytes_predicted == 4 * n_bytes and not tr.zero_copy
    _, stale = _run(tiny, "fsdp=4", jax.devices(), rc.replace(stale=True))
    # rollout 0 is the same; rollout 1 was made by the initial weights (one step stale), so
    # it differs from the synchronous run's, which the first update made
    np.testing.assert_array_equal(stale.rollouts[0][1], res.rollouts[0][1])
    assert not np.array_equal(stale.rollouts[1][1], res.rollouts[1][1])
    lab0 = run.build(rc, CFG, actor, rm, "fsdp=4", TASK)
    rows, seeds = run.batch_rows(lab0, train, 1)
    toks, _, _ = jax.device_get(
        run.dispatch_generate(
            lab0, jax.device_put(lab0.tree["actor"], lab0.gen_shardings), rows, seeds
        )
    )
    np.testing.assert_array_equal(stale.rollouts[1][1], toks)


@pytest.mark.slow  # the fast suite keeps the one-device equality on two meshes
@pytest.mark.first_line
def test_phase_memory_against_the_calculator(tiny):
    """At the lab's model size (`jaxscale rlhf`'s SFT model): the calculator divides every
    weight by the devices, and the few replicated leaves (norms, the value head) stay inside
    MEMORY_RTOL there (in the tiny CFG they would not)."""
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=256, max_seq=64)
    actor = ms.init_params(cfg, 0)
    rm = models.reward_model_init(ms.init_params(cfg, 1), cfg)
    train = tiny[2]
    lab = run.build(RC, cfg, actor, rm, "fsdp=8", TASK)
    rows = {r["phase"]: r for r in report.phase_memory(lab, train)}
    gen, train_row = rows["generation"], rows["training"]
    # generation holds the whole actor on every device (+ prompts and seeds, a few bytes)
    assert gen["arguments"] == pytest.approx(gen["calc_fixed"], rel=MEMORY_RTOL)
    assert gen["temp"] >= gen["calc_scaling"]  # the KV cache lives in the program's temporaries
    # training: actor + critic and their Adam moments, split 8 ways (+ the rollout batch)
    assert train_row["arguments"] == pytest.approx(train_row["calc_fixed"], rel=MEMORY_RTOL)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--algo", "grpo", "--group", "1"], "--group"),
        (["--stale"], "--stale"),
        (["--minibatches", "3"], "--minibatches"),
        (["--algo", "sgd"], "--algo"),
        (["--seed", "-1", "--dry-run"], "--seed"),  # before: passed --dry-run, failed later
        (["--mesh", "pp=2,fsdp=4", "--dry-run"], "pp=2 is unused"),  # before: accepted
        (["--mesh", "ep=2,dp=4", "--dry-run"], "ep=2 is unused"),
    ],
)
def test_cli_refuses_bad_settings(argv, flag, capsys):
    from jaxscale.cli import main

    try:
        code = main(["rlhf", *argv])
    except SystemExit as e:  # argparse refuses a choice itself
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err


def test_a_mesh_the_model_does_not_divide_over_is_refused(tiny):
    actor, rm, _, _ = tiny
    with pytest.raises(ValueError, match=r"--mesh tp=8: .*kv_heads=2.* does not divide"):
        run.build(RC, CFG, actor, rm, "tp=8", TASK)


SWEEP = ("beta 0 (no KL)", "adaptive (beta 0.1, target 6)", "beta 1 fixed", "beta 10 fixed")


@pytest.mark.parametrize("runs", [("ppo",), ("ppo", "grpo"), SWEEP], ids=["one", "two", "sweep"])
def test_the_plot_is_a_labelled_2x2_grid_with_its_legends_off_the_curves(
    tmp_path, monkeypatch, runs
):
    import matplotlib.pyplot as plt

    saved = capture(monkeypatch)
    hist = [
        {"iteration": i, "true_score": i / 30, "parses_rate": 0.5 + i / 60, "rm_score": i / 10}
        | {"kl": 0.05 * i}
        for i in range(30)
    ]
    path = report.plot(dict.fromkeys(runs, hist), tmp_path / "rlhf.png", kl_target=1.0)
    height, width = plt.imread(path).shape[:2]
    assert (width, height) == (1200, 900)
    ((fig, dpi),) = saved
    assert tuple(fig.get_size_inches() * dpi) == (1200, 900)
    axes = fig.axes
    assert len(axes) == 4 and {ax.get_subplotspec().get_geometry()[:2] for ax in axes} == {(2, 2)}
    legends = check_figure(fig)
    assert len(legends) == 4  # one per panel: each has the faint and the mean curves
    for legend in legends:
        assert set(legend_texts(legend)) >= {*runs, "each iteration", "5-iteration mean"}
        assert min(t.get_fontsize() for t in legend.get_texts()) >= 9
    assert "KL target (1)" in legend_texts(legends[3])
    for ax in axes:
        labels = ax.get_xticklabels() + ax.get_yticklabels()
        assert min(t.get_fontsize() for t in labels) >= 10
        assert min(ax.xaxis.label.get_fontsize(), ax.yaxis.label.get_fontsize()) >= 11
