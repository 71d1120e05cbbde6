"""AOT compilation for abstract TPU topologies (jaxscale.analysis.aot).

Target parsing, tile-padding arithmetic and the env handling always run. The rest compiles the
bench's FSDP training step (fsdp=8, layers unrolled as in the bench) once for the 8 simulated CPU
devices and once for a TPU v5e:2x4 slice, and checks what the two compilers did against closed
forms derived here from the model's parameter shapes. Without libtpu those tests SKIP with
`aot_unavailable_reason()`.
"""

import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxscale.analysis import aot, hlo
from jaxscale.analysis.hlo_text import nbytes
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import build_mesh
from jaxscale.model import state as model_state
from jaxscale.parallel import auto
from jaxscale.sharding import Sharder

F32 = 4  # bytes per element
# TPU v5e per chip (Cloud TPU v5e spec page; scaling-book tpus.md): 197 TFLOP/s bf16, 819 GB/s HBM.
V5E_PEAK_FLOPS = 197e12
V5E_HBM_BYTES_PER_S = 8.19e11


# --- targets ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, platform, generation, torus",
    [
        ("cpu", "cpu", None, ()),
        (" CPU ", "cpu", None, ()),
        ("tpu:v5e:2x4", "tpu", "v5e", (2, 4)),
        ("tpu:v6e:2x4", "tpu", "v6e", (2, 4)),
        ("tpu:v5p:2x2x1", "tpu", "v5p", (2, 2, 1)),
        ("tpu:v4:2x2x1", "tpu", "v4", (2, 2, 1)),
        ("TPU:V5E:4x4", "tpu", "v5e", (4, 4)),
    ],
)
def test_parse_target_accepts_the_documented_forms(text, platform, generation, torus):
    t = aot.parse_target(text)
    assert (t.platform, t.generation, t.torus) == (platform, generation, torus)
    assert aot.parse_target(str(t)) == t  # str() round-trips
    if platform == "tpu":
        assert t.topology_name == f"{generation}:{'x'.join(map(str, torus))}"


def test_parse_target_defaults_to_cpu():
    assert aot.parse_target() == aot.Target("cpu")


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "expected 'cpu'"),
        ("gpu", "expected 'cpu'"),
        ("tpu", "expected 'cpu'"),
        ("v5e:2x4", "expected 'cpu'"),  # the platform prefix is required
        ("tpu:v5e", "expected 'cpu'"),
        ("tpu:v5e-8", "expected 'cpu'"),  # libtpu rejects this spelling too
        ("tpu:v7x:2x2x1", "expected 'cpu'"),
        ("tpu:v5e:2x4x1", "v5e has a 2-D torus"),
        ("tpu:v5p:2x2", "v5p has a 3-D torus"),
        ("tpu:v5e:0x4", "must be positive"),
        ("tpu:v5e:-2x4", "expected 'cpu'"),
    ],
)
def test_parse_target_rejects_other_text_naming_the_accepted_forms(text, message):
    with pytest.raises(ValueError, match=message) as info:
        aot.parse_target(text)
    assert "tpu:v5e:2x4" in str(info.value) or "positive" in str(info.value)


def test_cpu_target_is_the_local_devices():
    assert aot.target_devices("cpu") == jax.devices()
    assert len(aot.target_devices(aot.Target("cpu"))) == 8  # tests/conftest.py


def test_quiet_env_is_set_for_the_libtpu_load_and_removed_afterwards(monkeypatch):
    for key in aot._QUIET_LIBTPU_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TPU_HOST_BOUNDS", "2,2,1")  # a user's own setting is kept
    with aot._quiet_libtpu():
        assert os.environ["TPU_WORKER_HOSTNAMES"] == "localhost"
        assert os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
        assert os.environ["TPU_HOST_BOUNDS"] == "2,2,1"
    assert "TPU_WORKER_HOSTNAMES" not in os.environ
    assert "ALLOW_MULTIPLE_LIBTPU_LOAD" not in os.environ
    assert os.environ["TPU_HOST_BOUNDS"] == "2,2,1"


def test_unavailable_reason_names_the_install_command(monkeypatch):
    monkeypatch.setattr(aot.importlib.util, "find_spec", lambda name: None)
    reason = aot.aot_unavailable_reason.__wrapped__()  # uncached: libtpu "missing"
    assert reason.startswith("libtpu is not installed")
    assert "pip install -e '.[tpu-aot]'" in reason and "\n" not in reason


def test_unavailable_reason_is_none_or_one_line():
    reason = aot.aot_unavailable_reason()
    assert reason is None or ("libtpu" in reason and "\n" not in reason)


class _FakeCompiled:
    def __init__(self, cost):
        self.cost = cost

    def cost_analysis(self):
        return self.cost


@pytest.mark.parametrize(
    "cost, seconds",
    [
        ({"flops": 1.0}, None),  # CPU: no estimate
        ({"optimal_seconds": 2.5e-4}, 2.5e-4),
        ([{"optimal_seconds": 2.5e-4}], 2.5e-4),  # older jax: one dict per program
        ({"optimal_seconds": -8.999307632446289}, None),  # libtpu 0.0.42's "no estimate"
        (None, None),
    ],
)
def test_tpu_estimate_seconds_reads_only_positive_estimates(cost, seconds):
    assert aot.tpu_estimate_seconds(_FakeCompiled(cost)) == seconds


# --- tile padding (pure arithmetic on a hand-written entry layout) ----------------------------


def test_entry_argument_bytes_pads_to_tpu_tiles():
    header = (
        "HloModule m, entry_computation_layout={(f32[2,64]{1,0:T(2,128)}, s32[]{:T(128)}, "
        "f32[256,8]{0,1:T(8,128)}, f32[2,8,4,8]{3,2,1,0:T(4,128)}, "
        "bf16[2,128,8]{1,2,0:T(8,128)(2,1)}, f32[3]{0}, s32[])->f32[]{:T(128)}}, num_partitions=8\n"
    )
    logical = (2 * 64 + 1 + 256 * 8 + 2 * 8 * 4 * 8) * F32 + 2 * 128 * 8 * 2 + (3 + 1) * F32
    padded = (
        2 * 128 * F32  # [2,64] -> minor dim to 128
        + 128 * F32  # a scalar fills a 128-element tile
        + 8 * 256 * F32  # layout {0,1}: physical [8,256], already aligned
        + 2 * 8 * 4 * 128 * F32  # [..,4,8] -> [..,4,128]
        + 2 * 8 * 128 * 2  # layout {1,2,0}: physical [2,8,128], aligned
        + 3 * F32  # no tiles: unpadded
        + F32  # a scalar as XLA:CPU prints it, without a layout
    )
    got = aot.entry_argument_bytes(header)
    assert (got.logical, got.padded) == (logical, padded)


def test_entry_argument_bytes_needs_an_entry_layout():
    with pytest.raises(ValueError, match="entry_computation_layout"):
        aot.entry_argument_bytes("HloModule m\n")


# --- compiling for a TPU v5e:2x4 slice --------------------------------------------------------

# the tiny model with one layer (short compiles), unrolled as `make bench` compiles it
CFG = ModelConfig(n_layers=1, unroll_layers=True)
TCFG = TrainConfig()


def _abstract_args(sharder):
    """(state, batch) as ShapeDtypeStructs sharded on the sharder's mesh (as bench_one builds
    them). Shardings are built outside any TPU mesh context (see compile_for_target)."""
    abstract_state = jax.eval_shape(lambda: auto.init_state(CFG, TCFG))
    state_sh = auto.state_shardings(CFG, TCFG, sharder)
    state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, state_sh
    )
    batch_shape = (TCFG.global_batch, TCFG.seq_len + 1)
    batch = jax.ShapeDtypeStruct(batch_shape, np.int32, sharding=auto.batch_sharding(sharder))
    return state, batch


@pytest.fixture(scope="module")
def libtpu():
    reason = aot.aot_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def fsdp_step(libtpu):
    """{backend: (compiled, report, abstract args)} for the fsdp=8 training step."""
    out = {}
    for name in ("cpu", "tpu:v5e:2x4"):
        sharder = Sharder(build_mesh("fsdp=8", devices=aot.target_devices(name)))
        args = _abstract_args(sharder)
        step = auto.jit_train_step(CFG, TCFG, sharder)
        compiled, report = aot.compile_for_target(name, step, *args)
        out[name.split(":")[0]] = (compiled, report, args)
    return out


def _param_leaves():
    """(per-layer elements, total elements, sharded?) per parameter under fsdp=8; the stacked
    blocks' per-layer slice drops the leading layer dimension."""
    sharder = Sharder(build_mesh("fsdp=8"))
    shapes = jax.tree_util.tree_leaves_with_path(model_state.abstract_params(CFG))
    shardings = jax.tree.leaves(model_state.param_shardings(CFG, sharder))
    out = []
    for (path, x), sharding in zip(shapes, shardings, strict=True):
        per_layer = x.shape[1:] if "blocks" in jax.tree_util.keystr(path) else x.shape
        out.append((math.prod(per_layer), math.prod(x.shape), not sharding.is_fully_replicated))
    return out


def test_tpu_target_is_an_8_chip_v5e_torus(libtpu):
    devices = aot.target_devices("tpu:v5e:2x4")
    assert len(devices) == 8
    assert {(d.platform, d.device_kind) for d in devices} == {("tpu", "TPU v5 lite")}
    assert {tuple(d.coords[:2]) for d in devices} == {(x, y) for x in range(2) for y in range(4)}
    assert aot.target_devices("tpu:v5e:2x4") == devices  # cached: meshes built twice agree


@pytest.mark.parametrize("text, n", [("tpu:v4:2x2x1", 4), ("tpu:v5p:2x2x2", 8)])
def test_3d_generations_have_one_device_per_chip(libtpu, text, n):
    assert len(aot.target_devices(text)) == n


def test_libtpu_rejections_become_value_errors(libtpu):
    # parses, but libtpu's default 2x2 chips per host do not tile a 3x4 torus
    with pytest.raises(ValueError, match="libtpu rejected topology 'v5e:3x4'.*divisible"):
        aot.target_devices("tpu:v5e:3x4")


def test_args_on_the_wrong_devices_are_refused(libtpu):
    double = jax.jit(lambda x: 2 * x)
    for mesh_on, target in (("cpu", "tpu:v5e:2x4"), ("tpu:v5e:2x4", "cpu")):
        mesh = build_mesh("dp=8", devices=aot.target_devices(mesh_on))
        sharding = jax.sharding.NamedSharding(mesh, jax.P("data"))
        x = jax.ShapeDtypeStruct((64,), np.float32, sharding=sharding)
        with pytest.raises(ValueError, match=f"not for target {target}"):
            aot.compile_for_target(target, double, x)


def test_topology_request_prints_nothing():
    code = (
        "from jaxscale.analysis.aot import aot_unavailable_reason, target_devices\n"
        "if aot_unavailable_reason() is None:\n"
        "    d = target_devices('tpu:v6e:2x4'); print(len(d), d[0].device_kind)\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no libtpu metadata warnings, no lockfile error
    if aot.aot_unavailable_reason() is None:
        assert out.stdout.strip() == "8 TPU v6 lite"


def test_argument_bytes_same_shards_tile_padded_on_tpu(fsdp_step):
    cpu_compiled, cpu_report, args = fsdp_step["cpu"]
    tpu_compiled, tpu_report, _ = fsdp_step["tpu"]
    # per-device shard bytes straight from the shardings
    shard_bytes = sum(
        math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(args)
    )
    assert cpu_report.memory.argument == shard_bytes
    cpu_entry, tpu_entry = (
        aot.entry_argument_bytes(cpu_compiled),
        aot.entry_argument_bytes(tpu_compiled),
    )
    assert cpu_entry.logical == cpu_entry.padded == shard_bytes  # CPU has no tiles
    assert tpu_entry.logical == shard_bytes  # the TPU program holds the same shards ...
    assert tpu_entry.padded == tpu_report.memory.argument  # ... padded to its memory tiles
    assert tpu_report.memory.argument > cpu_report.memory.argument  # 64-wide shards: not aligned


def test_each_gradient_is_all_reduced_once_in_f32_on_both_backends(fsdp_step):
    grad_bytes = F32 * sum(total for _, total, _ in _param_leaves())
    for backend in ("cpu", "tpu"):
        report = fsdp_step[backend][1]
        arrays = [
            (dtype, dims)
            for c in report.collectives
            if c.op == "all-reduce"
            for dtype, dims in c.shapes
            if dims  # scalars: the loss and the grad-norm partial sums
        ]
        assert {dtype for dtype, _ in arrays} == {"f32"}, backend
        assert F32 * sum(math.prod(d) for _, d in arrays) == grad_bytes, backend


def test_tpu_gathers_f32_weights_in_bf16_cpu_in_f32(fsdp_step):
    # On TPU an f32 matmul runs at default (bf16) precision, so the compiler converts each weight
    # shard before gathering it: half the bytes on the wire. XLA:CPU gathers the f32 weights.
    cpu_gathers = [c for c in fsdp_step["cpu"][1].collectives if c.op == "all-gather"]
    tpu_gathers = [c for c in fsdp_step["tpu"][1].collectives if c.op == "all-gather"]
    assert cpu_gathers and {c.dtype for c in cpu_gathers} == {"f32"}
    sharded_weights = {n for n, _, sharded in _param_leaves() if sharded}  # elements per layer
    tpu_bf16 = {math.prod(c.shapes[0][1]) for c in tpu_gathers if c.dtype == "bf16"}
    assert sharded_weights <= tpu_bf16


def test_tpu_fsdp_gradients_split_into_reduce_scatters_and_clip_all_reduces(fsdp_step):
    """Every sharded gradient is reduced exactly once. The TPU compiler reduce-scatters those it
    wraps in its all-reduce-scatter fusion; the rest it all-reduces whole, because the global-norm
    clip reads the full gradient before the update slices it (a real all-reduce, not a disguised
    reduce-scatter: the census only folds an all-reduce whose result is used solely as 1/N)."""
    sharded_grad_bytes = F32 * sum(total for _, total, sharded in _param_leaves() if sharded)
    collectives = hlo.normalize(list(fsdp_step["tpu"][1].collectives))
    scattered = sum(c.bytes_per_device for c in collectives if c.op == "reduce-scatter")
    whole = sum(
        nbytes((shape,))
        for c in collectives
        if c.op == "all-reduce"
        for shape in c.shapes
        if len(shape[1]) >= 2  # gradient matrices, not scalars or norm vectors
    )
    assert scattered > 0
    assert scattered + whole == sharded_grad_bytes


def test_optimal_seconds_is_a_positive_roofline_bound(fsdp_step):
    cpu_compiled, _, _ = fsdp_step["cpu"]
    tpu_compiled, tpu_report, _ = fsdp_step["tpu"]
    seconds = aot.tpu_estimate_seconds(tpu_compiled)
    assert isinstance(seconds, float) and seconds > 0
    assert seconds == tpu_report.optimal_seconds
    assert aot.tpu_estimate_seconds(cpu_compiled) is None  # only the TPU compiler gives one
    # no faster than the roofline of the compiler's own FLOPs and bytes on one v5e chip
    assert seconds >= tpu_report.flops / V5E_PEAK_FLOPS
    assert seconds >= tpu_report.bytes_accessed / V5E_HBM_BYTES_PER_S
