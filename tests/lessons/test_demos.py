"""Seed 002 ch1-3 demonstrations on simulated devices, against the seed's golden vectors
(what the seed's scripts print or compute) or an independent numpy computation."""

import jax
import numpy as np
import pytest

from jaxscale.lessons import collectives as DC
from jaxscale.lessons import ranks as D

ATOL = 1e-5  # float32 reductions in a different order


@pytest.fixture(scope="module")
def mesh4():
    return D.line_mesh(4)


@pytest.mark.parametrize("w, expected", [(4, 6), (8, 28)])  # ch1 hello_distributed.py
def test_hello(w, expected):
    h = D.hello(D.line_mesh(w))
    assert h.rank_sum == expected == h.expected_sum
    np.testing.assert_array_equal(h.gathered[-1], [10 * (w - 1), 10 * (w - 1) + 1])
    assert h.correct


def test_line_mesh_rejects_more_ranks_than_devices():
    with pytest.raises(ValueError, match="world size 9"):
        D.line_mesh(jax.device_count() + 1)


def test_relay_chain_seed_defect_1(mesh4):
    """Ch2 send_recv_basic.py: from 42 with W=4 the chain ends at 62; the seed prints 72.0."""
    c = D.relay_chain(mesh4)
    np.testing.assert_array_equal(c.held, [42.0, 52.0, 62.0, 62.0])
    assert c.final == 62.0 == c.expected
    assert c.seed_printed_expected == 72.0


def test_relay_chain_invariant_on_eight_ranks():
    c = D.relay_chain(D.line_mesh(8), init=0.0, add=10.0)
    assert c.final == 0.0 + 10.0 * 6 == c.expected  # init + add * (#relays)


def test_ring_pass_full_circle(mesh4):
    # seed 002 ch2 Exercise 1 (Ring Topology): start 0 -> 30 (prose), start 42 -> 72 (code)
    assert D.ring_pass(mesh4, 0.0)[0] == 30.0
    assert D.ring_pass(mesh4, 42.0)[0] == 72.0


def test_even_odd_swap(mesh4):
    sent, received = D.even_odd_swap(mesh4)
    for r in range(4):
        np.testing.assert_array_equal(received[r], sent[r ^ 1])
    with pytest.raises(ValueError, match="even world size"):
        D.even_odd_swap(D.line_mesh(3))


def test_pipeline_forward_equals_sequential_stages(mesh4):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 8, 8)).astype(np.float32) / 3
    b = rng.normal(size=(4, 8)).astype(np.float32)
    x = rng.normal(size=(3, 2, 8)).astype(np.float32)
    ref = x
    for s in range(4):
        ref = np.maximum(ref @ w[s] + b[s], 0.0)
    np.testing.assert_allclose(D.pipeline_forward(mesh4, w, b, x), ref, atol=ATOL)


SEED_AFTER_W4 = {  # seed 002 ch3 collective_cheatsheet.py (root 0)
    "broadcast": [[42.0, 43.0, 44.0]] * 4,
    "scatter": [[0.0, 1.0], [10.0, 11.0], [20.0, 21.0], [30.0, 31.0]],
    "all_gather": [[1.0, 2.0, 3.0, 4.0]] * 4,
    "all_reduce": [[10.0, 20.0]] * 4,
    "reduce_scatter": [[10.0], [20.0], [30.0], [40.0]],
}


@pytest.mark.parametrize("impl", ["lax", "ppermute"])
@pytest.mark.parametrize("op", sorted(SEED_AFTER_W4))
def test_cheatsheet_seed_vectors(mesh4, op, impl):
    np.testing.assert_array_equal(DC.cheatsheet_after(mesh4, op, impl), SEED_AFTER_W4[op])


@pytest.mark.parametrize("impl", ["lax", "ppermute"])
def test_cheatsheet_rooted_ops(mesh4, impl):
    gathered = DC.cheatsheet_after(mesh4, "gather", impl)
    reduced = DC.cheatsheet_after(mesh4, "reduce", impl)
    np.testing.assert_array_equal(gathered[0], [[0, 1], [100, 101], [200, 201], [300, 301]])
    assert reduced[0, 0] == 10.0  # 1 + 2 + 3 + 4
    if impl == "ppermute":  # root semantics by masking: off-root devices hold zeros
        assert not gathered[1:].any() and not reduced[1:].any()


def test_reduce_scatter_generalises_past_four_ranks():
    after = DC.cheatsheet_after(D.line_mesh(8), "reduce_scatter", "ppermute")
    np.testing.assert_array_equal(after[:, 0], 36.0 * np.arange(1, 9))  # (i+1) * sum(1..8)


def test_unknown_cheatsheet_op():
    with pytest.raises(ValueError, match="unknown operation"):
        DC.cheatsheet_before("allreduce", 4)


def test_mean_of_values(mesh4):
    assert DC.mean_of_values(mesh4, [1.0, 2.0, 3.0, 4.0]) == 2.5  # ch3 distributed_mean.py


@pytest.mark.parametrize("weighted", [False, True])
def test_distributed_means_match_numpy(mesh4, weighted):
    m = DC.distributed_mean(mesh4, data_size=100, weighted=weighted)
    assert m.global_mean == pytest.approx(m.reference, abs=ATOL)
    if weighted:
        assert list(m.local_sizes) == [100, 100, 100, 50]
        # with unequal shards the plain average of local means is the wrong answer
        assert abs(np.mean(m.local_means) - m.reference) > 1e-3
    else:
        assert m.global_mean == pytest.approx(float(np.mean(m.local_means)), abs=ATOL)


def test_gradient_sync_averages(mesh4):
    before, after = DC.gradient_sync(mesh4)
    np.testing.assert_allclose(after, np.broadcast_to(before.mean(0), after.shape), atol=ATOL)


def test_distributed_argmax_breaks_ties_to_lowest_rank(mesh4):
    values = np.array([[1, 5], [7, 2], [7, 0], [3, 3]], np.float32)
    assert DC.distributed_argmax(mesh4, values) == (7.0, 1)
    rng = np.random.default_rng(3)
    values = rng.integers(0, 5, size=(4, 3)).astype(np.float32)
    flat_owner = int(np.argmax(values.reshape(-1))) // 3  # first occurrence = lowest rank
    assert DC.distributed_argmax(mesh4, values) == (float(values.max()), flat_owner)


def test_vocab_parallel_softmax_equals_softmax_of_gathered_logits(mesh4):
    logits = np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32) * 10
    np.testing.assert_allclose(
        DC.sharded_softmax(mesh4, logits), np.asarray(jax.nn.softmax(logits)), atol=1e-6
    )
