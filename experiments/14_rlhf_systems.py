"""RLHF system architecture on 8 simulated devices: seed 002 ch. 14 (the hybrid engine,
weight_update_demo.py, memory_timeline.py, async one-step-stale generation).

    .venv/bin/python experiments/14_rlhf_systems.py [--iterations 10] [--random] [--out results]

One RLHF loop (PPO, as `jaxscale rlhf` runs it), placed four ways:

    co-located, generation in the training layout (fsdp=8)   the hybrid engine's mode switch
    co-located, replicated generation (fsdp=8)               an FSDP -> replicated reshard
    disaggregated: train fsdp=4 | generate dp=4              a cross-mesh device_put per iteration
    disaggregated, one-step stale                            generation k+1 overlaps training k

Reported: the bytes each weight transfer moved (from the arrays' shard maps) against
calc.weight_transfer, the seed's transfer methods for the same bytes and for its 140 GB, each
phase's compiled memory against calc.rlhf_memory (and the seed's 70B), the time per phase beside
the seed's timeline, and a measured timeline plot (results/rlhf_timeline.png). The actor and the
reward model are `jaxscale rlhf`'s (SFT and Bradley-Terry, cached in --runs); --random takes a
tiny random model instead (seconds). Times on simulated CPU devices are indicative only.
"""

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from jaxscale.devices import simulated_process

simulated_process()  # process edge: 8 simulated devices, XLA:CPU sized for them

from jaxscale.cliutil import positive_int  # noqa: E402
from jaxscale.rlhf.cli import add_stage_flags  # noqa: E402

RUNS = {  # name: (label, RLHFConfig fields, training mesh)
    "hybrid": ("co-located, train layout", {"gen_layout": "train"}, "fsdp=8"),
    "reshard": ("co-located, replicated", {"gen_layout": "replicated"}, "fsdp=8"),
    "disagg": ("disaggregated", {"placement": "disaggregated"}, "fsdp=4"),
    "stale": ("disaggregated, stale", {"placement": "disaggregated", "stale": True}, "fsdp=4"),
}
PHASES = (
    ("generate", "t_generate_s", "tab:blue"),
    ("score", "t_score_s", "tab:orange"),
    ("train", "t_train_s", "tab:green"),
    ("transfer", "t_transfer_s", "tab:red"),
)
RANDOM_MODEL = dict(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq=32)


def banner(title: str) -> None:
    print(f"\n{'=' * 60}\n {title}\n{'=' * 60}", flush=True)


@dataclass
class Run:
    lab: object
    res: object
    stamps: list  # perf_counter at the end of each iteration (after its transfer)

    def wall_s(self) -> float:
        """Mean wall time per iteration after the first (which compiles)."""
        import numpy as np

        d = np.diff(self.stamps)
        return float(d.mean()) if len(d) else float("nan")


def _setup(args):
    """(cfg, actor, reward model, task, RLHFConfig, train prompts, held-out prompts)."""

    from jaxscale.config import ModelConfig
    from jaxscale.rlhf import setup as rlhf_setup
    from jaxscale.rlhf import task as rlhf_task
    from jaxscale.rlhf.config import RLHFConfig
    from jaxscale.train.data import load_stdlib_corpus

    if not args.random:
        task = rlhf_task.TaskConfig()
        cfg, actor, rm, _, train, held = rlhf_setup.prepare(
            args.runs, task, args.sft_steps, args.rm_steps, say=print
        )
        return cfg, actor, rm, task, RLHFConfig(iterations=args.iterations), train, held
    cfg = ModelConfig(**RANDOM_MODEL)
    task = rlhf_task.TaskConfig(prompt_len=8, max_new=8, min_new=0, max_lines=400)
    train, held = rlhf_task.split(rlhf_task.prompt_lines(load_stdlib_corpus(300_000), task))
    actor, rm = rlhf_setup.random_models(cfg, 0)
    rc = RLHFConfig(
        iterations=args.iterations, responses=8, epochs=2, minibatches=2, lr=1e-3, kl_target=1.0
    )
    print(f"random model {RANDOM_MODEL}, random reward model")
    return cfg, actor, rm, task, rc, train, held


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stage_flags(p)
    p.add_argument("--iterations", type=positive_int, default=10, help="RLHF iterations per run")
    p.add_argument("--random", action="store_true", help="a tiny random model (fast)")
    p.add_argument("--out", default="results", help="directory for the PNG and JSONL")
    args = p.parse_args()
    import jax
    import numpy as np

    from jaxscale.calc import rlhf_memory as rm_calc
    from jaxscale.calc import weight_transfer as wt
    from jaxscale.render import grid
    from jaxscale.rlhf import report as rlhf_report
    from jaxscale.rlhf import run as rlhf_run

    cfg, actor, rm, task, rc, train_p, held_p = _setup(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    leaves = jax.tree.leaves(actor)
    actor_bytes = sum(x.nbytes for x in leaves)
    print(
        f"actor: {sum(x.size for x in leaves):,} parameters, {actor_bytes:,} bytes; "
        f"{rc.iterations} iterations x {rc.rows} responses per run, "
        f"{jax.device_count()} {jax.devices()[0].platform} devices"
    )
    runs = {}
    with open(out / "rlhf_systems.jsonl", "w") as log:
        for name, (label, fields, mesh) in RUNS.items():
            t = time.perf_counter()
            lab = rlhf_run.build(rc.replace(**fields), cfg, actor, rm, mesh, task)
            stamps = []
            write = lambda r, n=name: log.write(json.dumps({"run": n, **r}) + "\n")  # noqa: E731
            tick = lambda r, s=stamps: s.append(time.perf_counter())  # noqa: E731
            res = rlhf_run.iterate(lab, train_p, held_p, task, log=write, progress=tick)
            runs[name] = Run(lab, res, stamps)
            print(
                f"{label:<26} train {dict(lab.meshes.train.shape)} generate "
                f"{dict(lab.meshes.gen.shape)}: {time.perf_counter() - t:.1f} s with compiles, "
                f"true score {res.initial_true:.3f} -> {res.final_true:.3f}"
            )

    banner("Co-located, generation in the training layout: the hybrid engine")
    tr = runs["hybrid"].res.transfers
    print(
        f"mode switch (over {len(tr)} switches): bytes moved {max(t.bytes_moved for t in tr):,} "
        f"(predicted {max(t.bytes_predicted for t in tr):,}), same buffers (zero copy): "
        f"{all(t.zero_copy for t in tr)}"
    )
    print(
        "device_put to the layout the weights already have returns their own buffers: "
        "verl's\n'mode switch (no data movement!)', 'only metadata changes' (the seed's CUDA "
        "IPC case)"
    )

    banner("Co-located, replicated generation: the FSDP -> replicated reshard")
    lab, tr = runs["reshard"].lab, runs["reshard"].res.transfers
    split = sum(
        x.nbytes for x in jax.tree.leaves(lab.tree["actor"]) if not x.sharding.is_fully_replicated
    )
    n = lab.meshes.gen.devices.size
    print(
        f"reshard per iteration: bytes moved {tr[-1].bytes_moved:,}, predicted "
        f"{tr[-1].bytes_predicted:,} (reshard_bytes); all {len(tr)} as predicted: "
        f"{all(t.bytes_moved == t.bytes_predicted for t in tr)}"
    )
    print(
        f"  = {n} devices x {split:,} bytes of FSDP-split leaves x {n - 1}/{n} that each lacks "
        f"({tr[-1].bytes_moved / actor_bytes:.2f} x the actor; replicated leaves cost nothing)"
    )
    print(f"  time (here): {np.median([t.seconds for t in tr[1:]]) * 1e3:.2f} ms per reshard")

    banner("Disaggregated: train fsdp=4 on devices 0-3, generate dp=4 on devices 4-7")
    lab, tr = runs["disagg"].lab, runs["disagg"].res.transfers
    n_gen = lab.meshes.gen.devices.size
    print(
        f"cross-mesh device_put: bytes moved {tr[-1].bytes_moved:,} per transfer, predicted "
        f"{tr[-1].bytes_predicted:,} (cross_mesh_bytes: {n_gen} generation devices x "
        f"{actor_bytes:,} actor bytes); all {len(tr)} as predicted: "
        f"{all(t.bytes_moved == t.bytes_predicted for t in tr)}"
    )
    sec = float(np.median([t.seconds for t in tr[1:]]))
    gb = tr[-1].bytes_moved / 1e9
    print(
        f"  time (here): {sec * 1e3:.2f} ms per transfer ({gb / sec:.2f} GB/s between simulated "
        f"devices)\nthe seed's methods (calc.weight_transfer) for these bytes and for its 140 GB:"
    )
    arch = {a: wt.applicable_methods(a) for a in wt.ARCHITECTURES}
    print(
        grid(
            [
                "method",
                f"{tr[-1].bytes_moved:,} B",
                f"{wt.SEED_MODEL_SIZE_GB:.0f} GB",
                "note (140 GB)",
                "applies to",
            ],
            [
                [
                    m.name,
                    wt.format_duration(wt.transfer_time_s(m, gb)),
                    wt.format_duration(wt.transfer_time_s(m, wt.SEED_MODEL_SIZE_GB)),
                    wt.rating(m, wt.transfer_time_s(m, wt.SEED_MODEL_SIZE_GB)),
                    ", ".join(a.replace("disaggregated-", "") for a in arch if k in arch[a]),
                ]
                for k, m in wt.TRANSFER_METHODS.items()
            ],
        )
    )
    print("at these bytes every method is its setup time; at 140 GB bandwidth decides")

    banner("Memory per phase, per device: compiled (memory_analysis) vs calc.rlhf_memory")
    for name in ("reshard", "hybrid"):
        rows = rlhf_report.phase_memory(runs[name].lab, train_p)
        rows = rows if name == "reshard" else rows[:1]
        print(f"{RUNS[name][0]}:")
        print(rlhf_report.memory_table(rows))
    print(
        "arguments: what the phase's program is handed (weights, Adam moments, the batch) vs\n"
        "the calculator's fixed rows; temp: what it makes while running (the KV cache while\n"
        "generating, activations and gradients while training) vs its scaling rows (the seed's\n"
        "~10 x hidden values per token per layer is a large-model rule). In the train layout\n"
        "generation is handed 1/8 of the actor per device and its compiled decode loop\n"
        "all-gathers the FSDP-split weights at every step: the zero-copy switch moves the\n"
        "gather into generation; the replicated layout pays it once per iteration."
    )
    m70 = rm_calc.get_timeline_model("70b")
    b, s = rm_calc.SEED_SCALING_BATCH, rm_calc.SEED_SCALING_SEQ
    print(f"\nthe seed's 70B (memory_timeline.py, batch {b} x {s}, `jaxscale calc rl timeline`):")
    print(
        grid(
            ["phase", "fixed GB", "scaling GB", "total GB", "per GPU at TP=8"],
            [
                [
                    ph,
                    f"{pm.fixed_gb:.1f}",
                    f"{pm.scaling_gb:.1f}",
                    f"{pm.total_gb:.1f}",
                    f"{rm_calc.phase_memory(m70, b, s, ph, tp=8).total_gb:.1f}",
                ]
                for ph in rm_calc.TIMELINE_PHASES
                for pm in [rm_calc.phase_memory(m70, b, s, ph)]
            ],
        )
    )

    banner("Time per iteration: the seed's timeline and ours (simulated CPU: indicative)")
    for key in wt.SEED_TIMELINE_METHODS:
        one, two = wt.rlhf_timeline(key), wt.rlhf_timeline(key, transfers=2)
        print(
            f"seed 70B, {wt.TRANSFER_METHODS[key].name}: generate {one.generation_s:.0f} s + "
            f"train {one.training_s:.0f} s + transfer {wt.format_duration(one.transfer_s)} = "
            f"{one.total_s:.2f} s ({one.overhead:.1%} transfer); the seed's two transfers: "
            f"{two.total_s:.2f} s ({two.overhead:.1%})"
        )
    rows = []
    for name, run in runs.items():
        t = rlhf_report.time_breakdown(run.res.history)
        wall = run.wall_s()
        rows.append(
            [
                RUNS[name][0],
                *(f"{t[k] * 1e3:.1f}" for _, k, _ in PHASES),
                f"{wall * 1e3:.1f}",
                f"{t['t_transfer_s'] / wall:.1%}",
            ]
        )
    print("ours, mean ms per iteration after the first (which compiles):")
    print(grid(["run", "generate", "score", "train", "transfer", "wall", "transfer share"], rows))
    ratio = runs["stale"].wall_s() / runs["disagg"].wall_s()
    print(
        f"stale vs synchronous disaggregated: wall per iteration x {ratio:.2f}; 'generate' of\n"
        "the stale run is only the wait left after training (its generation ran meanwhile on\n"
        "devices 4-7; 8 simulated devices share the host's cores: the overlap is indicative)"
    )
    _staleness(runs, train_p, actor)

    banner("Timeline plot")
    print(f"wrote {_plot(runs, out / 'rlhf_timeline.png')}")
    print(f"wrote {out / 'rlhf_systems.jsonl'}")
    return 0


def _staleness(runs, train_p, actor) -> None:
    """Rollout 1 of the stale run against a generation of batch 1 by the initial weights."""
    import jax
    import numpy as np

    from jaxscale.rlhf import run as rlhf_run

    lab, res = runs["stale"].lab, runs["stale"].res
    print(
        "staleness: rollout k+1 comes from the weights before update k (one update behind);"
        "\nPPO's ratio is taken against those weights' own log-probs, so its clip bounds the "
        "lag"
    )
    if len(res.rollouts) < 2:
        return
    rows, seeds = rlhf_run.batch_rows(lab, train_p, 1)
    pre = jax.device_put(actor, lab.gen_shardings)
    toks = np.asarray(jax.device_get(rlhf_run.dispatch_generate(lab, pre, rows, seeds))[0])
    same = np.array_equal(res.rollouts[1][1], toks)
    sync = runs["disagg"].res.rollouts[1][1]
    print(
        f"  stale rollout 1 = batch 1 generated by the weights before update 0: {same}; the\n"
        f"  synchronous run's rollout 1 (same prompts and seeds, weights after update 0) "
        f"differs in {int((sync != res.rollouts[1][1]).sum())} of {sync.size} token positions"
    )


def _plot(runs, path) -> str:
    """Each run's iterations after the first on its own clock: generate from the iteration's
    start, score, train and transfer back from its end (the host's true score between); the
    stale run's generation of batch k+1 in flight on its own lane."""
    from matplotlib.patches import Patch

    from jaxscale.render import figure

    lanes = [*(RUNS[n][0] for n in runs), "stale: generation in flight"]
    colors = {ph: c for ph, _, c in PHASES} | {"host": "lightgrey"}
    with figure(path, figsize=(12, 4.2)) as (fig, ax):
        for y, (name, run) in enumerate(runs.items()):
            h, st = run.res.history, run.stamps
            for k in range(1, len(h)):
                beg, end, r = st[k - 1] - st[0], st[k] - st[0], h[k]
                bars = [("generate", beg, r["t_generate_s"])]
                x = end
                for ph, key, _ in PHASES[:0:-1]:
                    x -= r[key]
                    bars.append((ph, x, r[key]))
                g_end = beg + r["t_generate_s"]
                bars.append(("host", g_end, max(x - g_end, 0.0)))
                if name == "stale" and k >= 2:  # batch k, dispatched in iteration k-1
                    d0 = st[k - 2] - st[0] + h[k - 1]["t_generate_s"]
                    ax.barh(
                        len(runs),
                        (g_end - d0) * 1e3,
                        left=d0 * 1e3,
                        height=0.5,
                        lw=0.3,
                        color=colors["generate"],
                        alpha=0.45,
                        edgecolor="k",
                    )
                for ph, left, w in bars:
                    ax.barh(y, w * 1e3, left=left * 1e3, height=0.6, color=colors[ph])
                ax.plot([end * 1e3] * 2, [y - 0.4, y + 0.4], color="k", lw=0.8)
        ax.set_yticks(range(len(lanes)), lanes)
        ax.invert_yaxis()
        ax.set_xlabel("ms since the end of iteration 0 (which compiles); | = an iteration ends")
        ax.set_title("RLHF iterations, measured on 8 simulated CPU devices (times indicative)")
        ax.legend(
            handles=[Patch(color=c, label=p) for p, c in colors.items()],
            ncol=5,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.18),
            fontsize=8,
        )
        ax.grid(axis="x", alpha=0.3)
    return str(path)


if __name__ == "__main__":
    raise SystemExit(main())
