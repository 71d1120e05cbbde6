"""The rules table lays out state as each strategy promises (checked without running a step).

Per-device state bytes are computed from the shardings and compared with closed forms: ZeRO-3
(fsdp=8) keeps 1/8 of everything but the replicated norm scales; DP keeps all of it. The
compiler's own argument bytes for the step agree with the layout.
"""

import jax
import numpy as np
import pytest

from jaxscale.analysis.compiled import compile_with_report
from jaxscale.analysis.memory import bytes_per_device
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import build_mesh
from jaxscale.parallel import auto
from jaxscale.sharding import Sharder
from jaxscale.tolerances import MEMORY_RTOL

CFG = ModelConfig()
TCFG = TrainConfig(global_batch=16, seq_len=32)


def _state_bytes(spec):
    sharder = Sharder(build_mesh(spec))
    abstract = jax.eval_shape(lambda: auto.init_state(CFG, TCFG))
    return sharder, abstract, bytes_per_device(abstract, auto.state_shardings(CFG, TCFG, sharder))


def _norm_and_total_params():
    params = jax.eval_shape(lambda: auto.init_state(CFG, TCFG))["params"]
    norms = params["final_norm_D"].size + sum(
        v.size for k, v in params["blocks"].items() if k.endswith("norm_D")
    )
    return norms, sum(x.size for x in jax.tree.leaves(params))


@pytest.mark.parametrize("spec, ways", [("dp=8", 1), ("fsdp=8", 8), ("fsdp=4,tp=2", 8)])
def test_state_bytes_per_device_follow_the_strategy(spec, ways):
    _, _, measured = _state_bytes(spec)
    norms, total = _norm_and_total_params()
    # params + Adam mu + nu (f32 each): sharded parts split `ways` ways, norm scales replicated,
    # plus the step counters (int32 scalars: the train step and the two optax counts)
    per_copy = 4 * ((total - norms) / ways + norms)
    expected = 3 * per_copy + 3 * 4
    assert measured == pytest.approx(expected, rel=1e-9)


@pytest.mark.smoke
def test_compiled_argument_bytes_match_the_layout():
    sharder, abstract, state_bytes = _state_bytes("fsdp=8")
    sh = auto.state_shardings(CFG, TCFG, sharder)
    args = (
        jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, sh),
        jax.ShapeDtypeStruct((16, 33), np.int32, sharding=auto.batch_sharding(sharder)),
    )
    with jax.set_mesh(sharder.mesh):
        _, report = compile_with_report(auto.jit_train_step(CFG, TCFG, sharder), *args)
    batch_bytes = 16 * 33 * 4 // 8
    assert report.memory.argument == pytest.approx(state_bytes + batch_bytes, rel=MEMORY_RTOL)
