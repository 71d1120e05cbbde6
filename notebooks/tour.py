# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # jaxscale: a tour
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/OWNER/jaxscale/blob/main/notebooks/tour.ipynb)
#
# One Flax NNX transformer, sharded by data, FSDP/ZeRO, tensor, pipeline and expert parallelism,
# every strategy checked against a single-device reference and every prediction against the
# compiled program. This notebook runs top to bottom on a CPU, GPU or TPU runtime:
#
# - **CPU** (and this repository's CI, which executes this notebook): 8 simulated CPU devices
#   throughout.
# - **GPU or TPU** (Colab's free tier is one TPU v5e chip): single-device work (training, step
#   time, MFU) on the accelerator; the 8-way mesh demos on 8 simulated CPU devices in a
#   subprocess, so the accelerator backend stays usable; on a TPU, AOT compiles for larger
#   TPU topologies.
#
# The paired `tour.py` (jupytext, percent format) is the file to edit; `tour.ipynb` is generated
# from it with outputs stripped.

# %% Install (Colab) and detect the runtime
import importlib.util
import subprocess
import sys

REPO = "https://github.com/OWNER/jaxscale"  # this repository's URL
if importlib.util.find_spec("jaxscale") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{REPO}"], check=True)

from jaxscale import notebook as nb  # noqa: E402  (imports no jax)

rt = nb.detect()
nb.prepare_kernel(rt)  # a CPU runtime gets 8 simulated devices, before jax is imported
print(rt.describe())

# %% [markdown]
# ## 1. The devices
# `jaxscale doctor` in this kernel: versions, backend, devices, a `psum` across all of them.

# %%
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxscale.cli import main as jaxscale_main  # noqa: E402

jaxscale_main(["doctor"])

# %% [markdown]
# ## 2. A mesh
# A batch of 16 rows split over a data axis spanning every device of this kernel (8 simulated
# CPU devices, or the accelerators there are): each device holds its rows only.

# %%
from jaxscale.mesh import build_mesh  # noqa: E402

mesh = build_mesh("dp=-1")
x_BD = jax.device_put(np.arange(16 * 4.0).reshape(16, 4), NamedSharding(mesh, P("data")))
print(mesh)
for shard in x_BD.addressable_shards[:4]:
    print(shard.device, "holds rows", shard.index[0], "shape", shard.data.shape)

# %% [markdown]
# ## 3. The strategies compared
# `jaxscale bench` on 8 simulated devices (the tiny model, so it takes a minute): the compiler's
# choice (`auto`: jit and the sharding rules) beside the hand-written ZeRO-3 + Megatron
# tensor parallelism, on two FSDP x TP meshes. Per-device state, argument bytes and collectives
# are read from each compiled program beside the predictions, and a short trajectory is checked
# against one device (`eq`).

# %%
out = nb.jaxscale(
    "bench",
    "--model",
    "tiny",
    "--strategies",
    "auto,manual:zero3+tp",
    "--meshes",
    "fsdp=4,tp=2;fsdp=2,tp=4",
    "--steps",
    "1",
    "--remat-layers",
    "2",
    "--out",
    "results/tour",
)
nb.show("results/tour/bench_meshes.png")

# %% [markdown]
# ## 4. The collective census of one step
# Every collective op in each compiled step (the bench's JSON report): bytes per device read
# from the HLO, beside the axis modules' prediction for the hand-written strategies (the auto
# path's collectives are the compiler's own choice, so it has none).

# %%
import json  # noqa: E402

report = json.loads(open("results/tour/bench_meshes.json").read())
for row in report["rows"]:
    predicted = row["comm_why_not"] is None  # the auto path's collectives are GSPMD's choice
    ops = ", ".join(
        f"{op} {c['measured'] / 1024:.0f} KiB"
        + (f" (predicted {c['predicted'] / 1024:.0f})" if predicted else "")
        for op, c in row["collectives"].items()
    )
    print(f"{row['label']:<16} {row['mesh']:<12} {ops or 'no collectives'}")

# %% [markdown]
# ## 5. Training, on this kernel's devices
# A short run on the Python standard library's sources. On a GPU or TPU this is the real step
# time, and the metrics carry MFU (model FLOPs over the chip's peak); on CPU it is 8 simulated
# devices and wall-clock is indicative only.

# %%
big = rt.kind != "cpu"  # a wider model in bf16 where a real accelerator is there
train_args = [
    "train",
    "--steps",
    "60" if big else "40",
    "--run-dir",
    "runs/tour",
    "--eval-every",
    "20",
    "--sample-tokens",
    "32",
    "--no-progress",
]
if big:  # fused attention and unrolled layers: what reaches 47% MFU on an H100 (docs/hardware.md)
    train_args += [
        "--model",
        "medium",
        "--compute-dtype",
        "bfloat16",
        "--seq-len",
        "512",
        "--global-batch",
        "32",
        "--unroll-layers",
        "--attention",
        "cudnn" if rt.kind == "gpu" else "xla",
    ]
jaxscale_main(train_args)
jaxscale_main(["plot", "runs/tour", "--out", "runs/tour/loss.png"])
nb.show("runs/tour/loss.png")
last = [json.loads(line) for line in open("runs/tour/metrics.jsonl") if '"loss"' in line][-1]
print({k: round(v, 4) for k, v in last.items() if k in ("step", "loss", "tokens_per_s", "mfu")})

# %% [markdown]
# ## 6. The advisor, validated
# A layout for a 7B model on 64 GPUs from the seeds' rule sets, then `--validate`: the layout
# scaled down to 8 simulated devices, compiled, its memory and collectives checked against the
# advisor's own prediction.

# %%
_ = nb.jaxscale(
    "advise", "--params", "7e9", "--gpus", "64", "--gpu-mem", "80", "--top", "3", "--validate"
)

# %% [markdown]
# ## 7. Pipeline schedules
# The simulator's grids (pure Python): GPipe, 1F1B, interleaved and ZB-H1 on 4 stages with 8
# microbatches; `jaxscale bench pipeline` runs the same grids as one SPMD program and checks
# the bubble and the transfers against these.

# %%
_ = nb.jaxscale(
    "simulate",
    "pipeline",
    "--pp",
    "4",
    "--microbatches",
    "8",
    "--plot",
    "results/tour/pipeline.png",
)
nb.show("results/tour/pipeline.png")

# %% [markdown]
# ## 8. Mixture of experts: the all-to-alls
# Eight experts, top-2 routing, expert parallelism over 4 devices times data parallelism over
# 2: each MoE layer's dispatch and combine are all-to-alls. The run logs the routing terms
# (load-balancing loss, router z-loss, dropped tokens).

# %%
_ = nb.jaxscale(
    "train",
    "--mesh",
    "ep=4,dp=2",
    "--strategy",
    "manual:dp+ep",
    "--experts",
    "8",
    "--top-k",
    "2",
    "--steps",
    "20",
    "--log-every",
    "10",
    "--eval-every",
    "0",
    "--sample-tokens",
    "0",
    "--no-progress",
    "--metrics",
    "results/tour/moe.jsonl",
)
for line in open("results/tour/moe.jsonl"):
    record = json.loads(line)
    if "loss" in record:
        print({k: round(v, 4) for k, v in record.items() if isinstance(v, float)})

# %% [markdown]
# ## 9. PPO on CartPole, fully jitted
# Rollouts, GAE and the clipped updates in one compiled program, data-parallel over the
# mesh; the evaluation return over training.

# %%
_ = nb.jaxscale("rl", "ppo", "--seeds", "2", "--out", "results/tour/ppo")
nb.show("results/tour/ppo/learning_curve.png")

# %% [markdown]
# ## 10. Serving the model just trained
# The checkpoint of section 5, loaded into the continuous-batching engine (paged KV cache,
# radix prefix cache): three requests at once, the first one's text streamed as its tokens
# arrive. `jaxscale serve --ckpt-dir runs/tour/checkpoints` serves the same engine over an
# OpenAI-compatible HTTP API.

# %%
from jaxscale.serve.engine import Engine, EngineConfig  # noqa: E402
from jaxscale.serve.sampling import SamplingParams  # noqa: E402
from jaxscale.serve.scheduler import Request  # noqa: E402
from jaxscale.train.checkpoint import load_model  # noqa: E402

cfg, params = load_model("runs/tour/checkpoints")
engine = Engine(params, cfg, EngineConfig(max_num_seqs=4, page_size=16))
for i, prompt in enumerate(["def ", "import ", "class "]):
    engine.add(Request(str(i), list(prompt.encode()), 48, SamplingParams(0.7, seed=i)))
print("def ", end="")
while engine.scheduler.has_work():
    for ev in engine.step():
        if ev.request_id == "0":  # request 0's text, printed as its tokens arrive
            print(ev.text, end="", flush=True)
print(f"\n{engine.steps} engine steps, {engine.compiles} compiled shapes")

# %% [markdown]
# ## 11. On a TPU runtime: compile for larger TPU topologies
# Ahead-of-time compilation of the bench's rows for a v5e 2x4 slice, on this one chip's host:
# memory and collectives from the TPU compiler, nothing executed. Elsewhere this needs the
# `tpu-aot` extra (libtpu), and the cell says so.

# %%
if importlib.util.find_spec("libtpu") is not None:
    _ = nb.jaxscale(
        "bench",
        "--target",
        "tpu:v5e:2x4",
        "--model",
        "tiny",
        "--strategies",
        "auto:dp,auto:fsdp",
        "--out",
        "results/tour",
    )
else:
    print("libtpu is not installed here: pip install -e '.[tpu-aot]' to compile for TPUs")
