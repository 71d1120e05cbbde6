"""Point-to-point simulator: the seed's ch2 patterns complete, deadlock or hang as the seed says
(seed 002 ch2: "The Blocking vs Non-Blocking Dance", "Common Pitfalls", send_recv_basic.py)."""

import subprocess
import sys

import pytest

from jaxscale.sim import p2p


def test_chain_seed_defect_1():
    """W=4 from 42: 62.0 at the sink (the seed prints 'Expected: 72.0', defect 1)."""
    result = p2p.simulate(*p2p.chain(4))
    assert result.status == "ok"
    assert [e["x"] for e in result.env] == [42.0, 52.0, 62.0, 62.0]


@pytest.mark.parametrize("w", [2, 3, 8])
def test_chain_invariant(w):
    result = p2p.simulate(*p2p.chain(w, init=1.0, add=10.0))
    assert result.env[-1]["x"] == 1.0 + 10.0 * (w - 2)  # init + add x (#relays)


def test_ring_full_circle():
    assert p2p.simulate(*p2p.ring(4, init=0.0)).env[0]["x"] == 30.0  # seed 002 ch2 Exercise 1
    assert p2p.simulate(*p2p.ring(4, init=42.0)).env[0]["x"] == 72.0


def test_both_send_first_deadlocks_with_rendezvous_sends():
    result = p2p.simulate(*p2p.both_send_first())
    assert result.status == "deadlock"
    assert set(result.cycle) == {0, 1}
    assert all(isinstance(op, p2p.Send) for op in result.blocked.values())
    assert "deadlock" in p2p.format_trace(result).lower()


def test_both_send_first_completes_with_eager_sends():
    result = p2p.simulate(*p2p.both_send_first(), mode="eager")
    assert result.status == "ok"
    assert (result.env[0]["y"], result.env[1]["y"]) == (1.0, 0.0)


def test_interleaved_fix_completes():
    result = p2p.simulate(*p2p.interleaved())
    assert result.status == "ok" and result.env[0]["y"] == 1.0 and result.env[1]["y"] == 0.0


def test_nonblocking_swap_completes_and_swaps():
    result = p2p.simulate(*p2p.nonblocking_swap(4))
    assert result.status == "ok"
    assert [e["y"] for e in result.env] == [100.0, 0.0, 300.0, 200.0]  # rank r gets r^1's x


def test_mismatched_src_dst_hangs_and_names_the_ranks():
    result = p2p.simulate(*p2p.mismatched())
    assert result.status == "hang" and result.cycle == ()
    assert set(result.blocked) == {0, 1}
    assert "rank 1" in result.message and "rank 2 finished" in result.message


def test_forgot_wait_reads_the_old_buffer():
    result = p2p.simulate(*p2p.forgot_wait())
    assert result.reads == ((1, "before wait", 0.0), (1, "after wait", 42.0))


def test_three_rank_cycle_of_blocking_receives():
    programs = [[p2p.Recv(2), p2p.Send(1)], [p2p.Recv(0), p2p.Send(2)], [p2p.Recv(1), p2p.Send(0)]]
    result = p2p.simulate(programs)
    assert result.status == "deadlock" and set(result.cycle) == {0, 1, 2}


@pytest.mark.parametrize(
    "programs, message",
    [
        ([[p2p.Send(5)], []], "peer 5"),
        ([[p2p.Send(0)]], "itself"),
        ([[p2p.Wait("nope")], []], "unknown handle"),
    ],
)
def test_bad_programs_raise(programs, message):
    with pytest.raises(ValueError, match=message):
        p2p.simulate(programs)


def test_bad_mode_raises():
    with pytest.raises(ValueError, match="mode"):
        p2p.simulate([[]], mode="buffered")


def test_importing_p2p_does_not_import_jax():
    code = "import sys, jaxscale.sim.p2p; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
