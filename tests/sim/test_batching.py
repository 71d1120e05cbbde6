"""Static vs continuous batching: seed 000's workload and totals, seed 003's example, invariants."""

import heapq

import numpy as np
import pytest

from jaxscale.sim import batching as bt

TOL = 1e-12  # fractions of small integers

# Printed by seed 000's own Exercise 3 cells (the workload, static, continuous and waste cells),
# executed verbatim with numpy's legacy np.random.seed(42) generator.
SEED_000_FIRST_10 = [109, 71, 118, 171, 65, 65, 174, 126, 51, 112]
SEED_000_TOTAL_TOKENS = 3525  # "Total useful tokens to generate: 3525"; mean 70.5
SEED_000_STATIC = dict(steps=1016, util=0.4336860236220472, latency=150.56, slot_steps=8128)
SEED_000_CONTINUOUS = dict(steps=527, util=0.836100569259962, latency=70.5)


@pytest.fixture(scope="module")
def lengths():
    return bt.Workload().lengths()


def test_workload_is_seed_000s(lengths):
    assert lengths[:10].tolist() == SEED_000_FIRST_10
    assert (lengths.min(), lengths.max()) == (10, 191)  # "Length range: 10 to 191 tokens"
    assert int(lengths.sum()) == SEED_000_TOTAL_TOKENS


def test_static_totals_match_seed_000(lengths):
    res = bt.simulate_static(lengths, 8)
    assert res.total_steps == SEED_000_STATIC["steps"]
    assert res.avg_utilization == pytest.approx(SEED_000_STATIC["util"], abs=TOL)
    assert res.avg_service_latency == pytest.approx(SEED_000_STATIC["latency"], abs=TOL)
    assert res.slot_steps == SEED_000_STATIC["slot_steps"]
    assert res.wasted_slot_steps == 4603  # "Wasted: 4603 (56.6%)"
    assert round(100 * res.waste_fraction, 1) == 56.6


def test_continuous_totals_match_seed_000(lengths):
    res = bt.simulate_continuous(lengths, 8)
    assert res.total_steps == SEED_000_CONTINUOUS["steps"]
    assert res.avg_utilization == pytest.approx(SEED_000_CONTINUOUS["util"], abs=TOL)
    assert res.avg_service_latency == pytest.approx(SEED_000_CONTINUOUS["latency"], abs=TOL)
    assert res.wasted_slot_steps == 0  # "Wasted: 0 (0.0%)"


def test_seed_003_example_full_waste():
    # seed 003 "Examples Planned": one static batch of 8; in full, 860/1600 = 53.75%.
    res = bt.simulate_static(bt.SEED_003_LENGTHS, 8)
    assert (res.total_steps, res.slot_steps, res.useful_tokens) == (200, 1600, 740)
    assert res.wasted_slot_steps == 860
    assert res.waste_fraction == pytest.approx(0.5375, abs=TOL)
    assert bt.seed_003_claimed_waste() == pytest.approx(0.225, abs=TOL)  # seed 003, defect 21


def _greedy_completion(lengths, batch_size):
    """Independent model of continuous batching: each request, in queue order, takes the slot
    that frees first and holds it for exactly its length."""
    free = [0] * min(batch_size, len(lengths))
    heapq.heapify(free)
    ends = []
    for n in lengths:
        start = heapq.heappop(free)
        ends.append(start + int(n))
        heapq.heappush(free, start + int(n))
    return ends


@pytest.mark.parametrize("batch_size", [1, 3, 8, 64])
def test_continuous_matches_greedy_slot_model(lengths, batch_size):
    res = bt.simulate_continuous(lengths, batch_size)
    ends = _greedy_completion(lengths, batch_size)
    assert list(res.completion_step) == ends
    assert res.total_steps == max(ends)
    assert list(res.service_latency) == lengths.tolist()  # each request takes its own length
    assert sum(res.utilization) * batch_size == pytest.approx(lengths.sum(), abs=1e-6)


@pytest.mark.parametrize("batch_size", [1, 5, 8, 50])
def test_static_closed_form(lengths, batch_size):
    res = bt.simulate_static(lengths, batch_size)
    batches = [lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size)]
    assert res.total_steps == sum(int(b.max()) for b in batches)
    assert res.slot_steps == res.total_steps * batch_size
    assert res.wasted_slot_steps == res.slot_steps - int(lengths.sum())
    # the last request of each batch is returned when its batch ends
    assert res.completion_step[-1] == res.total_steps


def test_continuous_never_slower_and_batch_one_is_equal(lengths):
    for b in (2, 4, 8, 16):
        assert (
            bt.simulate_continuous(lengths, b).total_steps
            <= bt.simulate_static(lengths, b).total_steps
        )
    assert bt.simulate_continuous(lengths, 1).total_steps == int(lengths.sum())
    assert bt.simulate_static(lengths, 1).total_steps == int(lengths.sum())


def test_workload_clips_and_reseeds():
    w = bt.Workload(num_requests=2000, seed=3)
    lengths = w.lengths()
    assert lengths.min() == 10 and lengths.max() <= 300
    assert np.array_equal(lengths, bt.Workload(num_requests=2000, seed=3).lengths())
    assert not np.array_equal(lengths, bt.Workload(num_requests=2000, seed=4).lengths())


@pytest.mark.parametrize(
    "lengths, batch_size",
    [([], 8), ([5, 0, 3], 8), ([5, -2], 8), ([5, 3], 0), ([1.5, 2.0], 2)],
)
def test_bad_input_raises(lengths, batch_size):
    with pytest.raises(ValueError):
        bt.simulate_static(np.asarray(lengths), batch_size)
    with pytest.raises(ValueError):
        bt.simulate_continuous(np.asarray(lengths), batch_size)


def test_bad_workload_raises():
    with pytest.raises(ValueError, match="min_length"):
        bt.Workload(min_length=50, max_length=20).lengths()
    with pytest.raises(ValueError, match="num_requests"):
        bt.Workload(num_requests=0).lengths()


def test_sparkline_levels():
    assert bt.sparkline([1.0] * 10, width=5) == "@@@@@"
    assert bt.sparkline([0.0] * 10, width=5) == "     "
    assert len(bt.sparkline(np.linspace(0, 1, 1000), width=60)) == 60
