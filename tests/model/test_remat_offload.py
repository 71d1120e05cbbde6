"""`--remat offload`: block checkpointing whose kept inputs live in pinned host memory. Its values
are block's (tests/model/test_model.py runs it among the policies); here, what a TPU compiler
does with it, compiled ahead of time (jaxscale.analysis.aot; SKIP without libtpu, the tpu-aot
extra): each block's input goes to host memory, nothing else does. XLA:CPU drops the host
copies, so on CPU devices the training commands refuse the policy (tests/parallel)."""

import jax
import jax.numpy as jnp
import pytest

from jaxscale.analysis import aot
from jaxscale.config import ModelConfig
from jaxscale.model import pieces
from jaxscale.model import state as ms

# d_model 128: a [B, T, D] f32 block input fills TPU tiles (8 x 128) without padding
CFG = ModelConfig(n_layers=4, d_model=128, n_heads=4, n_kv_heads=4, d_ff=256)
B, T = 2, 32


@pytest.fixture(scope="module")
def tpu_device():
    reason = aot.aot_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return aot.target_devices("tpu:v5e:2x2")[0]


def _host_and_device_temps(policy: str, device):
    cfg = CFG.replace(remat=policy)
    step = jax.jit(jax.value_and_grad(lambda p, b: pieces.loss(p, b, cfg)))
    sharding = jax.sharding.SingleDeviceSharding(device)
    params = jax.eval_shape(lambda: ms.init_params(cfg, 0))
    args = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        (params, jax.ShapeDtypeStruct((B, T + 1), jnp.int32)),
    )
    m = step.lower(*args).compile().memory_analysis()
    return m.host_temp_size_in_bytes, m.temp_size_in_bytes


def test_offload_keeps_each_blocks_input_in_host_memory_on_a_tpu(tpu_device):
    """The TPU step's host temporaries are the L stacked block inputs, L x B x T x D x 4 bytes,
    exactly; block's (the same recompute, inputs on the device) are none."""
    host, _ = _host_and_device_temps("offload", tpu_device)
    assert host == CFG.n_layers * B * T * CFG.d_model * 4
    assert _host_and_device_temps("block", tpu_device)[0] == 0


def test_offload_is_refused_on_cpu_devices_in_one_line(capsys):
    """On XLA:CPU the policy would silently be block: `train` (every strategy, through the
    composer) and `bench remat` refuse it, naming why."""
    from jaxscale.cli import main as cli_main

    rc = cli_main(["train", "--remat", "offload", "--dry-run", "--data", "markov"])
    err = capsys.readouterr().err
    assert rc == 2 and "--remat offload: XLA:CPU keeps saved activations in device memory" in err
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "remat", "--policies", "block,offload", "--dry-run"])
    assert exc.value.code == 2 and "offload needs a TPU or GPU compiler" in capsys.readouterr().err
