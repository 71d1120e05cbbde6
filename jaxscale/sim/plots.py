"""PNG figures for the simulators; matplotlib is imported only when a plot is written."""

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    fig.clf()
    return path


def batching(static, continuous, path: str) -> str:
    """Utilisation over time for both strategies (shared/seeds/000 L943-981)."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(12, 7))
    for ax, res, color in zip(axes, (static, continuous), ("#d62728", "#2ca02c"), strict=True):
        steps = range(len(res.utilization))
        ax.fill_between(steps, res.utilization, alpha=0.3, color=color)
        ax.plot(steps, res.utilization, color=color, linewidth=1)
        ax.axhline(
            res.avg_utilization,
            color=color,
            linestyle="--",
            label=f"average {res.avg_utilization:.1%}",
        )
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("slot utilisation")
        ax.set_title(f"{res.strategy} batching: {res.total_steps} steps")
        ax.legend()
    axes[1].set_xlabel("step")
    return _save(fig, path)


def speculative(k_points, mp_sweep, path: str) -> str:
    """Speedup and tokens per round vs K, and the match-probability sweep (L546-637)."""
    plt = _pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(18, 5))
    ks = [p.k for p in k_points]
    speedups = [p.speedup for p in k_points]
    best = max(range(len(ks)), key=lambda i: speedups[i])
    ax1.plot(ks, speedups, marker="o")
    ax1.axvline(
        ks[best],
        linestyle="--",
        color="orange",
        label=f"optimal K={ks[best]} ({speedups[best]:.2f}x)",
    )
    ax1.axhline(1.0, linestyle="--", color="red", alpha=0.5, label="no speculation")
    ax1.set(xlabel="draft length K", ylabel="speedup", title="speculative decoding speedup")
    ax1.legend()
    accepted = [p.avg_accepted_per_round for p in k_points]
    ax2.bar(ks, accepted, label="accepted drafts")
    ax2.bar(ks, [1] * len(ks), bottom=accepted, label="target's own token (+1)")
    ax2.plot(ks, [k + 1 for k in ks], linestyle="--", color="red", label="maximum K+1")
    ax2.set(xlabel="draft length K", ylabel="tokens per round", title="tokens per target pass")
    ax2.legend()
    for mp, points in mp_sweep.items():
        ax3.plot(
            [p.k for p in points], [p.speedup for p in points], marker="o", label=f"match_prob={mp}"
        )
    ax3.axhline(1.0, linestyle="--", color="gray")
    ax3.set(xlabel="draft length K", ylabel="speedup", title="match probability vs optimal K")
    ax3.legend()
    return _save(fig, path)


def pipeline(results, path: str) -> str:
    """One Gantt chart per schedule: forward and backward ops per device over time."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(results), 1, figsize=(12, 2 + 1.6 * len(results)), squeeze=False)
    for ax, res in zip(axes[:, 0], results, strict=True):
        for span in res.spans.values():
            kind = span.op.key[0]
            ax.barh(
                span.op.resource,
                span.end - span.start,
                left=span.start,
                color="#1f77b4" if kind == "F" else "#ff7f0e",
                edgecolor="white",
            )
        cfg = res.config
        ax.set_yticks(range(cfg.stages), [f"GPU{d}" for d in range(cfg.stages)])
        ax.invert_yaxis()
        ax.set_title(
            f"{cfg.schedule}: P={cfg.stages}, M={cfg.microbatches}, makespan {res.makespan:g}, "
            f"bubble {res.bubble_s2:.1%} (blue F, orange B)"
        )
    axes[-1, 0].set_xlabel("time")
    return _save(fig, path)


def timelines(named_spans: dict, path: str) -> str:
    """CPU/GPU Gantt rows for each named simulation (overlap command)."""
    plt = _pyplot()
    colors = {"S": "#1f77b4", "C": "#2ca02c", "P": "#ff7f0e", "L": "#d62728", "K": "#2ca02c"}
    fig, axes = plt.subplots(
        len(named_spans), 1, figsize=(12, 1.5 + 1.4 * len(named_spans)), squeeze=False
    )
    for ax, (name, (spans, end)) in zip(axes[:, 0], named_spans.items(), strict=True):
        for span in spans.values():
            if span.start < end:
                row = 0 if span.op.resource == "cpu" else 1
                ax.barh(
                    row,
                    min(span.end, end) - span.start,
                    left=span.start,
                    color=colors[span.op.label],
                    edgecolor="white",
                    linewidth=0.5,
                )
        ax.set_yticks([0, 1], ["CPU", "GPU"])
        ax.invert_yaxis()
        ax.set_xlim(0, end)
        ax.set_title(name)
    axes[-1, 0].set_xlabel("ms")
    return _save(fig, path)


def param_server(runs, path: str) -> str:
    """Optimality gap per server update, log scale."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 5))
    for label, run in runs.items():
        gaps = [max(g, 1e-32) for g in run.gaps]
        ax.semilogy(range(len(gaps)), gaps, label=label + (" (diverged)" if run.diverged else ""))
    ax.set(
        xlabel="server update", ylabel="f(x) - f*", title="parameter server: sync vs stale async"
    )
    ax.legend()
    return _save(fig, path)


def bubble_curve(stages: int, rows: list[dict], path: str) -> str:
    """Bubble vs microbatches under both conventions, with simulated points."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    ms = [r["microbatches"] for r in rows]
    ax.plot(ms, [r["bubble_s2"] for r in rows], marker="o", label="(P-1)/(M+P-1)  idle / total")
    ax.plot(ms, [r["bubble_s4"] for r in rows], marker="s", label="(P-1)/M  idle / ideal")
    ax.plot(ms, [r["simulated_1f1b"] for r in rows], "kx", markersize=9, label="simulated 1F1B")
    if any(r.get("simulated_interleaved") is not None for r in rows):
        pts = [(r["microbatches"], r["simulated_interleaved"]) for r in rows]
        pts = [p for p in pts if p[1] is not None]
        ax.plot(*zip(*pts, strict=True), "g^", label="simulated interleaved")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set(xlabel="microbatches M", ylabel="bubble", title=f"pipeline bubble, P={stages}")
    ax.legend()
    return _save(fig, path)
