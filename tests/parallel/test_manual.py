"""Manual strategies: what the collectives are and where they sit in the compiled program."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from jaxscale.analysis import hlo
from jaxscale.analysis.hlo_text import parse_hlo
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import build_mesh
from jaxscale.model import pieces
from jaxscale.parallel import auto, common
from jaxscale.parallel.compose import Strategy, build
from jaxscale.train import data

CFG = ModelConfig(n_layers=1)
N = 8


def local_loss(params, batch_BT1):
    return pieces.loss(params, batch_BT1, CFG)


@pytest.fixture(scope="module")
def setup():
    mesh = build_mesh(f"dp={N}")
    batch = data.MarkovData().rows(0, 0, range(16), 16)
    params = auto.init_state(CFG, TrainConfig(global_batch=16, seq_len=16))["params"]
    ref = jax.jit(lambda p, b: auto.loss_and_grads(p, b, CFG))(params, batch)
    return mesh, params, jax.device_put(batch, jax.NamedSharding(mesh, P("data"))), ref


def _loop_bodies(text):
    comps = parse_hlo(text)
    return {i.attrs["body"].lstrip("%") for c in comps.values() for i in c if i.opcode == "while"}


def _grad_reductions(text, min_bytes):
    """(all-reduces in loop bodies, all-reduces elsewhere) moving at least min_bytes."""
    bodies = _loop_bodies(text)
    big = [
        c
        for c in hlo.collectives_from_text(text)
        if c.op == "all-reduce" and c.bytes_per_device >= min_bytes
    ]
    return [c for c in big if c.computation in bodies], [
        c for c in big if c.computation not in bodies
    ]


def test_gradient_accumulation_reduces_once_per_step_not_per_microbatch(setup):
    mesh, params, batch, _ = setup
    smallest_leaf = min(x.size for x in jax.tree.leaves(params)) * 4

    def ours(p, b):  # local accumulation, then one psum
        loss, g = common.accumulate(local_loss, p, b, 2, ("data",), unreduced=True)
        return jax.lax.pmean(loss, "data"), jax.tree.map(lambda x: jax.lax.psum(x, "data"), g)

    def naive(p, b):  # autodiff on replicated params reduces inside every microbatch
        micro = b.reshape(1, 2, -1).swapaxes(0, 1)

        def body(acc, mb):
            loss, g = jax.value_and_grad(local_loss)(p, mb)
            return jax.tree.map(jnp.add, acc, (loss, g)), None

        zero = (jax.lax.pcast(jnp.zeros(()), "data", to="varying"), jax.tree.map(jnp.zeros_like, p))
        (loss, g), _ = jax.lax.scan(body, zero, micro)
        return jax.lax.pmean(loss, "data"), g

    texts = {}
    for name, fn in (("ours", ours), ("naive", naive)):
        f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))
        texts[name] = f.lower(params, batch).compile().as_text()
    in_loop, outside = _grad_reductions(texts["ours"], smallest_leaf)
    assert in_loop == [] and outside, "gradients must be reduced after the microbatch loop"
    in_loop, _ = _grad_reductions(texts["naive"], smallest_leaf)
    assert in_loop, "the naive version reduces inside the loop (so the check can fail)"


def test_zero_stages_hold_what_they_promise():
    """Per-device optimizer-state and parameter bytes of the manual layouts (from the specs)."""
    from jaxscale.analysis.memory import bytes_per_device

    tcfg = TrainConfig(global_batch=16, seq_len=16)
    abstract = jax.eval_shape(lambda: auto.init_state(CFG, tcfg))
    P_bytes = sum(x.size for x in jax.tree.leaves(abstract["params"])) * 4
    norms = sum(v.size for k, v in abstract["params"]["blocks"].items() if k.endswith("norm_D"))
    norms = (norms + abstract["params"]["final_norm_D"].size) * 4
    sharded = P_bytes - norms
    # optax's step counters: int32 scalars, replicated
    counters = sum(x.dtype.itemsize for x in jax.tree.leaves(abstract["opt_state"]) if x.ndim == 0)
    for stage, params_expected, opt_expected in (
        (0, P_bytes, 2 * P_bytes),
        (1, P_bytes, 2 * (sharded / N + norms)),
        (2, P_bytes, 2 * (sharded / N + norms)),
        (3, sharded / N + norms, 2 * (sharded / N + norms)),
    ):
        name = f"manual:zero{stage}" if stage else "manual:dp"
        built = build(Strategy.parse(name, f"dp={N}"), CFG, tcfg)
        sh = built.state_shardings
        got_params = bytes_per_device(abstract["params"], sh["params"])
        got_opt = bytes_per_device(abstract["opt_state"], sh["opt_state"])
        assert got_params == pytest.approx(params_expected), stage
        assert got_opt == pytest.approx(opt_expected + counters), stage
