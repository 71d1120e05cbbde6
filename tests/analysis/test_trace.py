"""The trace reader (jaxscale/analysis/trace.py) on hand-made ops with known overlaps, and on
traces the profiler records here of programs whose collectives the HLO census counts; and
`jaxscale train --profile`."""

import json

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale.analysis import trace
from jaxscale.analysis.compiled import compile_with_report
from jaxscale.cli import main as cli_main

MS = 1_000_000  # ns


def _op(device, name, start_ms, end_ms, module="jit_step"):
    return trace.Op(device, module, name, int(start_ms * MS), int(end_ms * MS))


def test_collective_names_are_read_as_the_hlo_prints_them():
    kinds = {
        "all-reduce": "all-reduce",
        "all-reduce.12": "all-reduce",
        "all-gather-start.3": "all-gather",
        "all-gather-done.3": "all-gather",
        "collective-permute-start": "collective-permute",
        "reduce-scatter.1": "reduce-scatter",
        "all-to-all.7": "all-to-all",
        "fusion.2": None,
        "all-reduce-fusion": None,  # a fusion named after what it feeds is compute
        "wrapped_tanh": None,
    }
    assert {name: trace.collective_kind(name) for name in kinds} == kinds


def test_split_of_hand_made_ops_with_overlap():
    """Two steps on one device, 10 ms apart. Step 1: compute 0-4 ms, an all-reduce 3-6 ms
    (1 ms under compute, GPU-style), compute 6-7; step 2 the same shifted by 10 ms. Another
    module's ops and another device's are not this device's step."""
    ops = []
    for t in (0, 10):
        ops += [
            _op(0, "fusion.1", t + 0, t + 4),
            _op(0, "all-reduce.1", t + 3, t + 6),
            _op(0, "fusion.2", t + 6, t + 7),
        ]
    ops += [_op(0, "fusion.9", 20, 30, module="jit_eval"), _op(1, "fusion.1", 0, 1)]
    times = {d.device: d for d in trace.device_times(ops, steps=2, module="jit_step")}
    d = times[0]
    assert d.step == pytest.approx(17e-3 / 2)  # 0 .. 17 ms over two steps
    assert d.compute == pytest.approx(5e-3)  # 4 + 1 per step
    assert d.collective == pytest.approx(3e-3) and d.collectives == {"all-reduce": d.collective}
    assert d.exposed == pytest.approx(2e-3)  # 4-6 ms: no compute under it
    assert d.idle == pytest.approx(8.5e-3 - 7e-3)  # busy 0-7 per step
    assert times[1].step == pytest.approx(0.5e-3)
    s = trace.summary([d])
    assert s["exposed_fraction"] == pytest.approx(2 / 3)
    assert trace.step_module(ops) == "jit_step"  # 14 ms of ops against jit_eval's 10


def _recorded(tmp_path, steps=3):
    """A data-parallel program (matmuls, one psum over 8 devices) traced for `steps` runs after
    one unprofiled run; (ops, the census of its compiled program, its HLO text)."""
    mesh = jax.make_mesh((8,), ("d",))
    x = jax.device_put(jnp.ones((8 * 64, 128)), NamedSharding(mesh, P("d")))
    w = jnp.full((128, 128), 0.01)

    def local(x, w):
        g = jnp.tanh(x @ w).T @ x  # a gradient-like [128, 128] per device
        return jax.lax.psum(g, "d")  # all-reduce

    step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("d"), P()), out_specs=P()))
    compiled, report = compile_with_report(step, x, w)
    step(x, w).block_until_ready()
    jax.profiler.start_trace(str(tmp_path))
    for _ in range(steps):
        out = step(x, w)
    out.block_until_ready()
    jax.profiler.stop_trace()
    return trace.read_ops(trace.trace_file(tmp_path)), report, compiled.as_text()


def test_a_recorded_trace_has_every_device_and_the_programs_collectives(tmp_path):
    """Each device ran each of the program's collectives once per step, found through the
    program's opcodes (its all-reduce is named after jax's psum, not after the opcode)."""
    ops, report, text = _recorded(tmp_path)
    module, opcodes = trace.program_opcodes(text)
    assert trace.step_module(ops) == module
    mine = [o for o in ops if o.module == module]
    assert sorted({o.device for o in mine}) == list(range(8))
    census = report.collective_totals(normalized=False)
    for device in range(8):
        kinds = [trace.collective_kind(opcodes[o.name]) for o in mine if o.device == device]
        found = [k for k in kinds if k]
        assert len(found) == 3 * sum(t.count for t in census.values()), kinds
        assert set(found) == set(census)
    times = trace.device_times(ops, 3, module, opcodes)
    for d in times:
        assert d.compute > 0 and d.collective > 0 and d.step > 0
        assert d.compute + d.exposed + d.idle == pytest.approx(d.step, rel=1e-9)
        assert d.exposed <= d.collective


def _train(capsys, *argv):
    rc = cli_main(["train", "--layers", "1", "--no-progress", "--sample-tokens", "0", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_train_profile_writes_a_trace_and_prints_its_split(tmp_path, capsys):
    rc, out, err = _train(capsys, "--profile", str(tmp_path / "p"), "--steps", "4")
    assert rc == 0, err
    saved = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert saved["devices"] == 8 and saved["steps"] == 3 and saved["module"] == "jit_step"
    # the default data-parallel step all-reduces its gradients, and on CPU nothing overlaps it
    assert list(saved["collectives_s"]) == ["all-reduce"] and saved["exposed_fraction"] > 0.9
    assert "profile: per step (mean of 8 devices, 3 steps)" in out
    assert saved["trace"] in out and "ui.perfetto.dev" in out
    assert list((tmp_path / "p").rglob("*.xplane.pb")) and list((tmp_path / "p").rglob("*.json.gz"))


def test_train_profile_refuses_a_window_it_cannot_hold(tmp_path, capsys):
    """One step is all compile: nothing to profile; a window of 0 steps is a flag error."""
    rc, _, err = _train(capsys, "--profile", str(tmp_path / "p"), "--steps", "1", "--dry-run")
    assert rc == 2 and "--profile needs at least 2 steps to train" in err, err
    with pytest.raises(SystemExit) as exc:
        _train(capsys, "--profile", str(tmp_path / "p"), "--profile-steps", "0", "--dry-run")
    assert exc.value.code == 2 and "--profile-steps" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()  # nothing written before every check passed
