"""Data-parallel serving (`serve/replicas.py`): one engine per replica on its own devices, behind
one router: each request's tokens are the one-device engine's, the requests spread over the
replicas, and a replica whose step fails ends its own requests only."""

import functools
import threading

import jax
import pytest

from jaxscale.config import ModelConfig
from jaxscale.model import state as ms
from jaxscale.serve.engine import Engine, EngineConfig
from jaxscale.serve.replicas import EngineError, Router, replica_meshes
from jaxscale.serve.sampling import SamplingParams
from jaxscale.serve.scheduler import Request

CFG = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=48)
ECFG = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, page_size=8, n_pages=24)
PROMPTS = [[100, 101, 32, 61], [35, 32, 116, 104, 101, 110], [120, 61, 32], [40, 41, 58, 10, 32]]
SETTINGS = [SamplingParams(0.0), SamplingParams(1.0, seed=4), SamplingParams(0.8, seed=7)] * 2


@functools.cache
def _params():  # on first use, not at collection (every xdist worker collects)
    return ms.init_params(CFG, 0)


def _requests():
    return [
        Request(str(i), p, 8, s) for i, (p, s) in enumerate(zip(PROMPTS, SETTINGS, strict=False))
    ]


def test_each_replica_is_a_tensor_mesh_on_its_own_devices():
    devices = jax.devices()
    one, two = replica_meshes("dp=2,tp=2", devices)
    assert [d.id for d in one.devices.flat] == [devices[0].id, devices[1].id]
    assert [d.id for d in two.devices.flat] == [devices[2].id, devices[3].id]
    assert dict(one.shape) == {"tensor": 2}
    assert [dict(m.shape) for m in replica_meshes("dp=4", devices)] == [{"tensor": 1}] * 4
    assert replica_meshes(None, devices) == [None]
    for spec, says in (
        ("fsdp=2", "no use for fsdp"),
        ("dp=2,cp=2", "no use for context"),
        ("tp=2,ep=2", "tp or ep, not both"),
        ("dp=-1", "give every axis its size"),
        (f"dp={len(devices) + 1}", f"needs {len(devices) + 1} devices"),
    ):
        with pytest.raises(ValueError, match=says):
            replica_meshes(spec, devices)


def _serve(router: Router, reqs, submitted=None) -> dict:
    """Submit every request at once (then set `submitted`); wait for each one's last event (or
    error)."""
    got = {r.id: [] for r in reqs}
    done = {r.id: threading.Event() for r in reqs}

    def callback(rid):
        def on(ev):
            got[rid].append(ev)
            if isinstance(ev, Exception) or ev.finish_reason is not None:
                done[rid].set()

        return on

    placed = [router.submit(r, callback(r.id)) for r in reqs]
    if submitted is not None:
        submitted.set()
    for r in reqs:
        assert done[r.id].wait(timeout=300), r.id
    return got, placed


@pytest.mark.parametrize(
    "spec", ["dp=2", pytest.param("dp=2,tp=2", marks=[pytest.mark.slow, pytest.mark.first_line])]
)
def test_replicas_answer_with_the_one_device_tokens(spec):
    """Four requests (greedy and sampled) submitted at once to two replicas: two go to each (the
    least loaded, in turn), each replica's parameters and pool live on its own devices, and
    every request's tokens are the one-device engine's."""
    want = Engine(_params(), CFG, ECFG).run(_requests())
    engines = [Engine(_params(), CFG, ECFG, mesh=m) for m in replica_meshes(spec, jax.devices())]
    router = Router(engines)
    try:
        got, placed = _serve(router, _requests())
    finally:
        router.stop()
    assert placed == [0, 1, 0, 1]
    assert router.loads() == [0, 0]
    for rid, events in got.items():
        assert [ev.token for ev in events] == want[rid].out, rid
    for e, m in zip(engines, replica_meshes(spec, jax.devices()), strict=True):
        mine = set(m.devices.flat)
        assert jax.tree.leaves(e.params)[0].sharding.device_set == mine
        assert e.pool["k"].sharding.device_set == mine
        assert e.compiles > 0  # it served


def test_a_failing_replica_ends_its_own_requests_and_the_other_keeps_serving():
    """Replica 0's step raises: its two requests end with an EngineError (a 500 to their
    clients); replica 1's two get the one-device tokens."""
    want = Engine(_params(), CFG, ECFG).run(_requests())
    engines = [Engine(_params(), CFG, ECFG, mesh=m) for m in replica_meshes("dp=2", jax.devices())]

    submitted = threading.Event()

    def broken():  # once every request is placed, so the loads decide where each goes
        submitted.wait(timeout=60)
        raise RuntimeError("device lost")

    engines[0].step = broken
    router = Router(engines)
    try:
        got, placed = _serve(router, _requests(), submitted)
    finally:
        router.stop()
    assert placed == [0, 1, 0, 1]
    for (rid, events), where in zip(got.items(), placed, strict=True):
        if where == 0:
            assert len(events) == 1 and isinstance(events[0], EngineError), rid
            assert "device lost" in str(events[0])
        else:
            assert [ev.token for ev in events] == want[rid].out, rid
    assert router.errors >= 1 and router.loads() == [0, 0]
