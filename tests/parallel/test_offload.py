"""`--offload opt_state` (the auto path, parallel/auto.py): the optimizer state lives in host
memory (pinned_host) between steps; the step is the same computation, and the compiled layout
puts exactly the optimizer state's bytes in the host memory space."""

import jax
import numpy as np
import pytest

from jaxscale import verify
from jaxscale.analysis.compiled import compile_with_report
from jaxscale.analysis.memory import host_argument_bytes
from jaxscale.bench import predict
from jaxscale.parallel.compose import build
from jaxscale.parallel.strategy import Strategy
from jaxscale.tolerances import MEMORY_RTOL


@pytest.mark.parametrize("mesh", ["dp=8", "fsdp=8"])
def test_offloaded_state_trains_the_same_with_its_bytes_on_the_host(mesh):
    runs = {}
    for offload in ("none", "opt_state"):
        tcfg = verify.TCFG.replace(offload=offload)
        built = build(Strategy.parse("auto", mesh), verify.CFG, tcfg)
        with jax.set_mesh(built.mesh):
            compiled, _ = compile_with_report(built.step, *built.abstract_args(16, 32))
        host = host_argument_bytes(compiled.as_text())
        predicted = predict.predicted_state(built, verify.CFG).optimizer
        runs[offload] = (verify.run_built(built, tcfg, 3, step=compiled), host, predicted)
    (plain, host0, _), (off, host1, optimizer) = runs["none"], runs["opt_state"]
    assert host0 == 0
    # Adam's m and v (and its step count, 4 bytes) per device, and nothing else
    assert host1 == pytest.approx(optimizer, rel=MEMORY_RTOL) and host1 > 0
    np.testing.assert_array_equal(plain.losses, off.losses)
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(off.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_state_stays_on_the_host_between_steps():
    tcfg = verify.TCFG.replace(offload="opt_state")
    built = build(Strategy.parse("auto", "dp=8"), verify.CFG, tcfg)
    with jax.set_mesh(built.mesh):
        state = built.init()
        state, _ = built.step(state, built.put(verify.batches(tcfg, 1)[0]))
    kinds = {x.sharding.memory_kind for x in jax.tree.leaves(state["opt_state"])}
    assert kinds == {"pinned_host"}
    assert {x.sharding.memory_kind for x in jax.tree.leaves(state["params"])} == {"device"}


def test_offload_is_refused_on_the_manual_path():
    tcfg = verify.TCFG.replace(offload="opt_state")
    with pytest.raises(ValueError, match="--offload opt_state is the auto path's"):
        build(Strategy.parse("manual:zero3", "fsdp=8"), verify.CFG, tcfg)


@pytest.mark.slow  # a run, its checkpoint and a resume (10 s); the bytes and values are fast
def test_an_offloaded_run_checkpoints_and_resumes(tmp_path, capsys):
    """The host-resident state is saved and restored into host memory again (config.json keeps
    the setting)."""
    from jaxscale.cli import main as cli_main

    argv = ["train", "--layers", "1", "--no-progress", "--sample-tokens", "0"]
    argv += ["--out", str(tmp_path)]
    assert cli_main([*argv, "--offload", "opt_state", "--steps", "2"]) == 0
    assert cli_main([*argv, "--resume", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "resuming from step 2" in out and '"offload": "opt_state"' in out
