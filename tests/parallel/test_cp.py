"""Context parallelism (jaxscale/parallel/cp/): the splits and their balance, the refusals,
the bytes each form moves against the compiled program's census, and planted bugs each caught
by the first-step loss against the single-device reference (the equivalence matrix itself is
tests/test_verify.py's, `verify.CASES`)."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale import verify
from jaxscale.bench import meshes
from jaxscale.mesh import parse_mesh
from jaxscale.model import blockwise, pieces
from jaxscale.model import state as model_state
from jaxscale.parallel import cp
from jaxscale.parallel.compose import Strategy, build
from jaxscale.parallel.cp import ring


def test_zigzag_gives_each_device_one_early_and_one_late_chunk():
    # T = 16 over cp = 4: 8 chunks of 2; device 1 holds chunks 1 and 6
    got = np.asarray(cp.device_positions(1, 4, 16, "zigzag"))
    assert got.tolist() == [2, 3, 12, 13]
    every = np.concatenate([np.asarray(cp.device_positions(i, 4, 16, "zigzag")) for i in range(4)])
    assert sorted(every.tolist()) == list(range(16))  # a partition of the sequence
    assert np.asarray(cp.device_positions(3, 4, 16, "contiguous")).tolist() == [12, 13, 14, 15]


@pytest.mark.parametrize("c", [2, 4, 8])
def test_the_ring_skips_masked_chunk_pairs_balanced_only_under_zigzag(c):
    """Causal attention over c devices: the zigzag split gives every device the same number of
    unmasked s x s chunk pairs, 2c+1 (its own block: both diagonals and the late chunk over the
    early one; every other block: half of its four pairs); the contiguous split gives device i
    i+1 pairs, so the busiest device does 2c/(c+1) times the mean."""
    zig = ring.executed_pairs(c, "zigzag")
    assert zig == [2 * c + 1] * c
    contig = ring.executed_pairs(c, "contiguous")
    assert contig == list(range(1, c + 1))
    assert max(contig) / np.mean(contig) == pytest.approx(2 * c / (c + 1))


def test_the_context_axis_parses_and_unused_or_missing_axes_are_refused():
    assert parse_mesh("cp=4,dp=2").names == ("data", "context")
    assert parse_mesh("context=8").shape == (8,)
    s = Strategy.parse("manual:dp+cp_ring_contig", "dp=2,cp=4")
    assert (s.context, s.cp_split, s.label()) == ("ring", "contiguous", "manual:dp+cp_ring_contig")
    cfg, tcfg = verify.CFG, verify.TCFG
    refusals = [
        ("manual:dp", "dp=2,cp=4", "cp=4 is unused"),
        ("manual:cp_ring", "dp=8", "needs a context axis"),
        ("manual:tp_gather+cp_gather", "cp=2,tp=4", "tp_gather substitutes"),
        ("auto", "cp=8", None),  # the auto path takes the axis from the rules
    ]
    for text, mesh, words in refusals:
        if words is None:
            build(Strategy.parse(text, mesh), cfg, tcfg)
            continue
        with pytest.raises(ValueError, match=words):
            build(Strategy.parse(text, mesh, microbatches=2), cfg.replace(n_layers=2), tcfg)


def test_a_grouped_hop_in_branches_only_one_stage_takes_moves_the_ring_blocks():
    """The ring inside a schedule's per-tick branches: stage 0 hops in a branch while stage 1
    goes straight to the stage transfer, then the other way round. XLA:CPU's runtime pairs
    every device's next collective-permute with every other's, so the ring's hops there are
    all-to-alls of the context group (`ring.hop`, grouped): each stage gets its neighbours'
    blocks, the transfer the other stage's output, and a backward hop equals the permute."""
    c = 4
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, c), ("pipe", cp.AXIS))

    def body(x):
        x = x[0]
        fwd = partial(ring.hop, axis=cp.AXIS, perm=ring.ring_perm(c), c=c, grouped=True)
        d = jax.lax.axis_index("pipe")
        y = jax.lax.switch(d, [fwd, lambda a: a * 10], x)
        z = jax.lax.ppermute(y, "pipe", [(0, 1), (1, 0)])  # the stage transfer
        w = jax.lax.switch(d, [lambda a: a * 10, fwd], x + 0 * z)  # after the transfer
        back = ring.hop(x, cp.AXIS, ring.back_perm(c), c, grouped=True)
        want_back = jax.lax.ppermute(x, cp.AXIS, ring.back_perm(c))
        return jnp.stack([y, z, w, back - want_back])[None]

    spec = P(("pipe", cp.AXIS))
    x = np.arange(1.0, 9.0, dtype=np.float32).reshape(8, 1, 1) * np.ones((1, 3, 2), np.float32)
    got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))(
        jax.device_put(x, NamedSharding(mesh, spec))
    )
    got = np.asarray(got)[:, :, 0, 0].reshape(2, c, 4)  # [stage, context device, output]
    v = x[:, 0, 0].reshape(2, c)
    from_prev = np.roll(v, 1, axis=1)  # device i holds device i-1's block after one hop
    np.testing.assert_array_equal(got[0, :, 0], from_prev[0])
    np.testing.assert_array_equal(got[1, :, 0], 10 * v[1])
    np.testing.assert_array_equal(got[0, :, 1], 10 * v[1])  # what stage 1 sent
    np.testing.assert_array_equal(got[1, :, 1], from_prev[0])
    np.testing.assert_array_equal(got[0, :, 2], 10 * v[0])
    np.testing.assert_array_equal(got[1, :, 2], from_prev[1])
    np.testing.assert_array_equal(got[:, :, 3], 0)


def test_the_ring_inside_a_pipeline_schedule_gives_the_reference_loss():
    """`manual:cp_ring+gpipe` on pp=2,cp=4, the forward alone (`Built.loss`): with the ring's
    hops as collective-permutes inside the schedule's branches the first loss was 6.13 against
    5.97 here (a stage received a K/V block as its input); the verify cases check the
    gradients and trajectory under gpipe, 1f1b and interleaved (slow)."""
    cfg, tcfg = verify.CFG.replace(n_layers=2), verify.TCFG
    built = build(Strategy.parse("manual:cp_ring+gpipe", "pp=2,cp=4", microbatches=2), cfg, tcfg)
    batch = verify.batches(tcfg, 1)[0]
    params = model_state.init_params(cfg, tcfg.seed)
    want = float(pieces.loss(params, jnp.asarray(batch), cfg))
    with jax.set_mesh(built.mesh):
        got = float(
            built.loss(jax.device_put(params, built.state_shardings["params"]), built.put(batch))
        )
    case = verify.Case(built.strategy)
    assert verify.Result(case, loss_err=abs(got - want), ref_loss=want).loss_ok, (got, want)


def test_what_does_not_divide_is_named():
    tcfg = verify.TCFG
    with pytest.raises(ValueError, match="sequence length 30 is not divisible into the 16 chunks"):
        build(Strategy.parse("manual:cp_ring", "cp=8"), verify.CFG, tcfg.replace(seq_len=30))
    four_heads = verify.CFG.replace(n_heads=4, n_kv_heads=4)
    with pytest.raises(ValueError, match=r"heads=4 is not divisible by 8 \(heads 4, kv_heads 4\)"):
        build(Strategy.parse("manual:cp_ulysses", "cp=8"), four_heads, tcfg)
    with pytest.raises(ValueError, match="per tensor shard"):
        build(Strategy.parse("manual:cp_ulysses+tp", "cp=4,tp=2"), four_heads, tcfg)
    moe = verify.CFG.replace(**dict(verify.MOE))
    with pytest.raises(ValueError, match="with --experts use --moe-mode dropless"):
        build(Strategy.parse("manual:cp_gather", "cp=8"), moe, tcfg)


def test_block_attention_merged_by_log_sum_exp_equals_attention_over_all_keys():
    """The ring's arithmetic alone: attention over keys split in two blocks, merged, equals
    `attend` over all of them (and each block alone is not it)."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 6, 4, 8)), jnp.float32) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]  # 2 kv heads: GQA groups of 2
    pos = jnp.arange(6)
    want = pieces.attend(q, k, v, pos, pos)
    first = blockwise.block_attend(q, k[:, :3], v[:, :3], pos, pos[:3])
    second = blockwise.block_attend(q[:, 3:], k[:, 3:], v[:, 3:], pos[3:], pos[3:])
    late, lse = blockwise.merge((first[0][:, 3:], first[1][:, 3:]), second)
    got = jnp.concatenate([first[0][:, :3], late], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(first[0][:, 3:], want[:, 3:], atol=1e-3)


CENSUS = [
    ("manual:cp_ring", "cp=8", False),
    ("manual:cp_gather", "cp=8", False),
    ("manual:cp_ulysses", "cp=8", False),
    ("manual:zero3+tp+cp_ulysses", "fsdp=2,cp=2,tp=2", False),
    ("manual:dp+cp_ring", "dp=2,cp=4", True),  # remat: the forward's sends again
    ("manual:dp+cp_ring", "dp=4,cp=2", False),  # one hop: no send may merge with another
    ("manual:cp_gather", "cp=8", True),
    ("manual:cp_ulysses", "cp=8", True),
]


@pytest.mark.parametrize("text, mesh, remat", CENSUS)
def test_predicted_bytes_equal_the_compiled_programs_census(text, mesh, remat):
    """cp.predict_comm (summed with the other axes by the composer) against the collectives the
    compiled training step runs, op by op, within the bench's 5%."""
    cfg = verify.CFG.replace(unroll_layers=True, remat=remat)
    row = meshes.bench_case(
        verify.Case(Strategy.parse(text, mesh)), cfg, verify.TCFG, 2, None, execute=False
    )
    assert row.error is None and row.comm_why_not is None
    comm = row.comm
    form_op = {"ring": "collective-permute", "gather": "all-gather", "ulysses": "all-to-all"}
    assert form_op[Strategy.parse(text, mesh).context] in comm
    assert all(ok for *_, ok in comm.values()), comm


# --- planted bugs, each caught by the first-step loss ------------------------------------------

PLANT = ("manual:dp+cp_ring", "dp=2,cp=4")


def _first_loss():
    cfg, tcfg = verify.CFG, verify.TCFG
    built = build(Strategy.parse(*PLANT), cfg, tcfg)
    batch = verify.batches(tcfg, 1)[0]
    params = model_state.init_params(cfg, tcfg.seed)
    want = float(pieces.loss(params, jnp.asarray(batch), cfg))
    with jax.set_mesh(built.mesh):
        got = float(
            built.loss(jax.device_put(params, built.state_shardings["params"]), built.put(batch))
        )
    return got, want


def _loss_ok(got, want):
    """verify's first-step loss check (its tolerance, stated once)."""
    case = verify.Case(Strategy.parse(*PLANT))
    return verify.Result(case, loss_err=abs(got - want), ref_loss=want).loss_ok


def test_the_ring_as_built_passes_the_check_the_planted_bugs_fail():
    assert _loss_ok(*_first_loss())


def test_kv_rotated_the_wrong_way_is_caught(monkeypatch):
    monkeypatch.setattr(ring, "ring_perm", lambda c: [(j, (j - 1) % c) for j in range(c)])
    assert not _loss_ok(*_first_loss())


def test_a_missing_log_sum_exp_rescale_is_caught(monkeypatch):
    # each block's normalised output added as it is: the blocks' weights are lost
    monkeypatch.setattr(
        ring, "merge", lambda acc, part: (acc[0] + part[0], jnp.logaddexp(acc[1], part[1]))
    )
    assert not _loss_ok(*_first_loss())


def test_zigzag_positions_not_applied_to_rope_are_caught(monkeypatch):
    """RoPE at the local index 0..T/c-1 while the mask still sees the true positions."""
    window = cp.window

    def local_positions(batch, **kw):
        inputs, targets, _ = window(batch, **kw)
        return inputs, targets, jnp.arange(inputs.shape[1])

    def true_mask(q, k, v, qp, kp, *, c, split, axis=cp.AXIS):
        true = cp.device_positions(jax.lax.axis_index(axis), c, qp.shape[0] * c, split)
        return cp.ring_attend(q, k, v, true, true, c=c, split=split, axis=axis)

    monkeypatch.setattr(cp, "window", local_positions)
    monkeypatch.setitem(cp.ATTEND, "ring", true_mask)
    assert not _loss_ok(*_first_loss())
