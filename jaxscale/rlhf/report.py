"""What an RLHF run reports beside its curves: each phase's compiled memory next to the
calculator's per-phase prediction (`calc rl memory` / seed memory_timeline.py), the weight
transfers next to `calc rl transfer`'s methods, the time per phase, and the plot."""

from __future__ import annotations

import jax
import numpy as np

from jaxscale.calc import rlhf_memory as rm_calc
from jaxscale.calc import weight_transfer as wt
from jaxscale.render import figure
from jaxscale.rlhf import placement as place

GB = 1e9


def _per_device(compiled) -> dict:
    m = compiled.memory_analysis()
    return {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "temp": m.temp_size_in_bytes,
    }


def phase_memory(lab, prompts: np.ndarray) -> list[dict]:
    """Per device, of each compiled phase (memory_analysis), beside the calculator's rows for
    the same model, batch and sharding: the state it holds ("fixed": weights, Adam) and what
    grows with batch x sequence ("scaling": the KV cache while generating, activations)."""
    from jaxscale.rlhf import run

    cfg, rc, sh = lab.cfg, lab.rc, lab.sh
    n_params = sum(x.size for x in jax.tree.leaves(lab.ref))
    model = rm_calc.TimelineModel("lab", n_params / 1e9, cfg.d_model, cfg.n_layers)
    value_bytes = np.dtype(cfg.param_dtype).itemsize
    adam_for = "actor+critic" if "critic" in lab.tree else "actor"
    calc = {
        p: {
            i.name: i.gb * GB
            for i in rm_calc.phase_memory(
                model,
                rc.rows,
                sh.P + sh.N,
                p,
                adam_for=adam_for,
                kv_dim=cfg.n_kv_heads * cfg.head_dim,
                value_bytes=value_bytes,
                misc_gb=0,
            ).items
        }
        for p in rm_calc.TIMELINE_PHASES
    }
    rows, seeds = run.batch_rows(lab, prompts, 0)
    gen_actor = jax.device_put(lab.tree["actor"], lab.gen_shardings)
    with jax.set_mesh(lab.meshes.gen):
        rows_sh = lab.gen_sharder.named(("batch", None))
        args = (
            gen_actor,
            jax.device_put(rows, rows_sh),
            jax.device_put(seeds, lab.gen_sharder.named(("batch",))),
        )
        toks, valid, logp = lab.phases[0](*args)
        generate = _per_device(lab.phases[0].lower(*args).compile())
    n_gen, n_train = lab.meshes.gen.devices.size, lab.meshes.train.devices.size
    gen_w = 1 if lab.gen_sharder.rules != lab.train_sharder.rules else n_train
    with jax.set_mesh(lab.meshes.train):
        b = lab.train_sharder.named(("batch", None))
        seq = jax.device_put(np.concatenate([rows, np.asarray(toks)], 1), b)
        v, lp = jax.device_put((np.asarray(valid), np.asarray(logp)), b)
        sargs = (lab.tree, lab.ref, lab.rm, seq, v, lp, np.float32(rc.beta))
        score = _per_device(lab.phases[1].lower(*sargs).compile())
        batch, _ = lab.phases[1](*sargs)
        train = _per_device(
            lab.phases[2]
            .step.lower(lab.tree, lab.opt_state, batch, np.int32(0), np.float32(rc.beta))
            .compile()
        )
    g, s, t = calc["generation"], calc["scoring"], calc["training"]
    opt = next(v for k, v in t.items() if k.startswith("Optimizer"))
    critic = t["Critic (weights)"] if "critic" in lab.tree else 0.0
    # scoring reads the reference, the reward model (without an LM head: its share of the
    # actor's size) and, for PPO, the critic's backbone (the actor's, when shared); the
    # behaviour log-probs come from generation, so the actor itself is not read
    ppo = rc.algo == "ppo"
    rm_share = sum(x.size for x in jax.tree.leaves(lab.rm)) / n_params
    return [
        {
            "phase": "generation",
            "holds": "actor (generation layout) + KV cache",
            "calc_fixed": g["Actor (weights)"] / gen_w,
            "calc_scaling": g["KV Cache"] / n_gen,
            **generate,
        },
        {
            "phase": "scoring",
            "holds": "reference, reward model" + (", critic" if ppo else ""),
            "calc_fixed": (s["Reward Model (weights)"] * (1 + ppo + rm_share)) / n_train,
            "calc_scaling": s["Activations"] / n_train,
            **score,
        },
        {
            "phase": "training",
            "holds": ("actor + critic" if ppo else "actor") + ", Adam; gradients are temporaries",
            "calc_fixed": (t["Actor (weights)"] + critic + opt) / n_train,
            "calc_scaling": (
                t["Activations"]
                + t["Actor (gradients)"]
                + (t["Critic (gradients)"] if critic else 0)
            )
            / n_train,
            **train,
        },
    ]


def transfer_rows(transfers: list[place.Transfer]) -> list[dict]:
    """The measured moves (first and steady state) beside the calculator's method times for the
    same bytes."""
    out = []
    for label, tr in (("first", transfers[0]), ("steady", transfers[-1])):
        gb = max(tr.bytes_moved, 1) / GB
        out.append(
            {
                "transfer": label,
                "bytes_moved": tr.bytes_moved,
                "bytes_predicted": tr.bytes_predicted,
                "seconds": tr.seconds,
                "zero_copy": tr.zero_copy,
                **{
                    f"calc_{k}_s": wt.transfer_time_s(wt.TRANSFER_METHODS[k], gb)
                    for k in ("nccl_nvlink", "nccl_ib", "cuda_ipc")
                },
            }
        )
    return out


TIME_KEYS = ("t_generate_s", "t_score_s", "t_train_s", "t_transfer_s")


def time_breakdown(history: list[dict]) -> dict:
    """Mean seconds per phase over the iterations after the first (which compiles)."""
    rest = history[1:] or history
    return {k: float(np.mean([r[k] for r in rest])) for k in TIME_KEYS}


def plot(runs: dict[str, list[dict]], path, kl_target: float = 0.0, smooth: int = 5) -> str:
    """True score, parse rate, reward-model score and KL over iterations, a 2x2 grid (1200x900
    pixels), one colour per run: each iteration faint, its `smooth`-iteration running mean solid;
    the KL target dashed. Each panel's legend sits under its axes, clear of the curves."""
    from matplotlib.lines import Line2D
    from matplotlib.transforms import ScaledTranslation

    keys = ("true_score", "parses_rate", "rm_score", "kl")
    titles = (
        "true score (programmatic)",
        "share of lines that parse",
        "reward-model score",
        "KL(actor || reference)",
    )
    ylabels = ("true score", "share of lines", "reward-model score", "KL, nats per response")
    with figure(path, 2, 2, figsize=(12, 9)) as (fig, axes):
        axes = axes.ravel()
        for i, (label, hist) in enumerate(runs.items()):
            it = np.asarray([r["iteration"] for r in hist])
            for ax, key in zip(axes, keys, strict=True):
                y = np.asarray([r[key] for r in hist], float)
                mean = np.convolve(y, np.ones(smooth) / smooth, "valid") if len(y) >= smooth else y
                ax.plot(it, y, color=f"C{i}", alpha=0.25, lw=0.8)
                ax.plot(it[len(it) - len(mean) :], mean, color=f"C{i}", lw=1.6, label=label)
        if kl_target > 0:
            axes[3].axhline(kl_target, color="k", ls="--", lw=1, label=f"KL target ({kl_target:g})")
        # what the faint and solid strokes are, once per legend, in gray
        key_handles = [Line2D([], [], color="gray", alpha=0.4, lw=0.8)]
        key_labels = ["each iteration"]
        if smooth > 1:
            key_handles.append(Line2D([], [], color="gray", lw=1.6))
            key_labels.append(f"{smooth}-iteration mean")
        for ax, title, ylabel in zip(axes, titles, ylabels, strict=True):
            ax.set_title(title, fontsize=13)
            ax.set_xlabel("iteration", fontsize=11)
            ax.set_ylabel(ylabel, fontsize=11)
            ax.tick_params(labelsize=10)
            ax.grid(alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()
            labels += key_labels
            # under the x label whatever the panel's height: 40 points below the axes
            under = ax.transAxes + ScaledTranslation(0, -40 / 72, fig.dpi_scale_trans)
            ax.legend(
                handles + key_handles,
                labels,
                fontsize=9,
                ncol=3 if max(map(len, labels)) <= 16 else 2 if max(map(len, labels)) <= 24 else 1,
                loc="upper center",
                bbox_to_anchor=(0.5, 0),
                bbox_transform=under,
                borderaxespad=0,
            )
    return str(path)


def summary_text(summary: dict, k: int) -> str:
    """`jaxscale rlhf`'s summary as text: the first and last k iterations, the held-out score,
    the time per iteration, the weight transfers beside the calculator and (with --memory) each
    phase's compiled memory beside it."""
    from jaxscale.render import grid

    lines = []
    f, last = summary["first_iterations"], summary["last_iterations"]
    lines.append(
        grid(
            ["", f"first {k} iterations", f"last {k} iterations"],
            [[key, f"{f[key]:.4f}", f"{last[key]:.4f}"] for key in f],
        )
    )
    ho = summary["held_out_true_score"]
    lines.append(f"held-out true score (fixed seeds): {ho['initial']:.4f} -> {ho['final']:.4f}")
    t = summary["time_per_iteration_s"]
    lines.append(
        "time per iteration: " + ", ".join(f"{key[2:-2]} {v * 1e3:.1f} ms" for key, v in t.items())
    )
    lines.append(
        grid(
            [
                "transfer",
                "bytes moved",
                "predicted",
                "ms (here)",
                "zero copy",
                "calc NVLink ms",
                "calc IB ms",
            ],
            [
                [
                    r["transfer"],
                    f"{r['bytes_moved']:,}",
                    f"{r['bytes_predicted']:,}",
                    f"{r['seconds'] * 1e3:.2f}",
                    r["zero_copy"],
                    f"{r['calc_nccl_nvlink_s'] * 1e3:.2f}",
                    f"{r['calc_nccl_ib_s'] * 1e3:.2f}",
                ]
                for r in summary["transfers"]
            ],
        )
    )
    if "memory" in summary:
        lines.append("memory per device: compiled (memory_analysis) vs calc rl memory's rows")
        lines.append(memory_table(summary["memory"]))
    return "\n".join(lines)


def memory_table(rows: list[dict]) -> str:
    """`phase_memory`'s rows as a text table: compiled memory per device beside the calculator."""
    from jaxscale.render import grid

    cols = ["phase", "holds", "arguments MB", "calc fixed MB", "temp MB", "calc scaling MB"]
    mb = ("arguments", "calc_fixed", "temp", "calc_scaling")
    return grid(cols, [[r["phase"], r["holds"], *(f"{r[k] / 1e6:.3f}" for k in mb)] for r in rows])
