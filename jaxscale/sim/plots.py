"""PNG figures for the simulators (`jaxscale.render.figure`: matplotlib only when one is drawn).
Each returns the path it wrote."""

from jaxscale.render import figure


def batching(static, continuous, path: str) -> str:
    """Utilisation over time for both strategies (shared/seeds/000 L943-981)."""
    with figure(path, 2, 1, figsize=(12, 7)) as (fig, axes):
        for ax, res, color in zip(axes, (static, continuous), ("#d62728", "#2ca02c"), strict=True):
            steps = range(len(res.utilization))
            ax.fill_between(steps, res.utilization, alpha=0.3, color=color)
            ax.plot(steps, res.utilization, color=color, linewidth=1)
            ax.axhline(res.avg_utilization, color=color, linestyle="--",
                       label=f"average {res.avg_utilization:.1%}")  # fmt: skip
            ax.set_ylim(0, 1.1)
            ax.set(ylabel="slot utilisation",
                   title=f"{res.strategy} batching: {res.total_steps} steps")  # fmt: skip
            ax.legend()
        axes[1].set_xlabel("step")
    return path


def speculative(k_points, mp_sweep, path: str) -> str:
    """Speedup and tokens per round vs K, and the match-probability sweep (L546-637)."""
    with figure(path, 1, 3, figsize=(18, 5)) as (fig, (ax1, ax2, ax3)):
        ks = [p.k for p in k_points]
        speedups = [p.speedup for p in k_points]
        best = max(range(len(ks)), key=lambda i: speedups[i])
        ax1.plot(ks, speedups, marker="o")
        ax1.axvline(ks[best], linestyle="--", color="orange",
                    label=f"optimal K={ks[best]} ({speedups[best]:.2f}x)")  # fmt: skip
        ax1.axhline(1.0, linestyle="--", color="red", alpha=0.5, label="no speculation")
        ax1.set(xlabel="draft length K", ylabel="speedup", title="speculative decoding speedup")
        accepted = [p.avg_accepted_per_round for p in k_points]
        ax2.bar(ks, accepted, label="accepted drafts")
        ax2.bar(ks, [1] * len(ks), bottom=accepted, label="target's own token (+1)")
        ax2.plot(ks, [k + 1 for k in ks], linestyle="--", color="red", label="maximum K+1")
        ax2.set(xlabel="draft length K", ylabel="tokens per round", title="tokens per target pass")
        for mp, points in mp_sweep.items():
            ax3.plot([p.k for p in points], [p.speedup for p in points], marker="o",
                     label=f"match_prob={mp}")  # fmt: skip
        ax3.axhline(1.0, linestyle="--", color="gray")
        ax3.set(xlabel="draft length K", ylabel="speedup", title="match probability vs optimal K")
        for ax in (ax1, ax2, ax3):
            ax.legend()
    return path


def _gantt(path: str, rows: list, draw, height: tuple, xlabel: str) -> str:
    """Stacked Gantt panels, one per entry of `rows` (`draw(ax, row)` fills one); the figure is
    height[0] + height[1] per panel tall."""
    with figure(path, len(rows), 1, figsize=(12, height[0] + height[1] * len(rows))) as (fig, _):
        for ax, row in zip(fig.axes, rows, strict=True):
            draw(ax, row)
            ax.invert_yaxis()
        fig.axes[-1].set_xlabel(xlabel)
    return path


def pipeline(results, path: str) -> str:
    """One Gantt chart per schedule: forward and backward ops per device over time."""

    def draw(ax, res):
        for span in res.spans.values():
            ax.barh(span.op.resource, span.end - span.start, left=span.start, edgecolor="white",
                    color="#1f77b4" if span.op.key[0] == "F" else "#ff7f0e")  # fmt: skip
        cfg = res.config
        ax.set_yticks(range(cfg.stages), [f"GPU{d}" for d in range(cfg.stages)])
        ax.set_title(
            f"{cfg.schedule}: P={cfg.stages}, M={cfg.microbatches}, makespan "
            f"{res.makespan:g}, bubble {res.bubble_s2:.1%} (blue F, orange B)"
        )

    return _gantt(path, list(results), draw, (2, 1.6), "time")


TIMELINE_COLORS = {"S": "#1f77b4", "C": "#2ca02c", "P": "#ff7f0e", "L": "#d62728", "K": "#2ca02c"}


def timelines(named_spans: dict, path: str) -> str:
    """CPU/GPU Gantt rows for each named simulation, cut at its end time (overlap command)."""

    def draw(ax, item):
        name, (spans, end) = item
        for span in (s for s in spans.values() if s.start < end):
            ax.barh(0 if span.op.resource == "cpu" else 1, min(span.end, end) - span.start,
                    left=span.start, color=TIMELINE_COLORS[span.op.label], edgecolor="white",
                    linewidth=0.5)  # fmt: skip
        ax.set_yticks([0, 1], ["CPU", "GPU"])
        ax.set(xlim=(0, end), title=name)

    return _gantt(path, list(named_spans.items()), draw, (1.5, 1.4), "ms")


def param_server(runs, path: str) -> str:
    """Optimality gap per server update, log scale."""
    with figure(path) as (fig, ax):
        for label, run in runs.items():
            gaps = [max(g, 1e-32) for g in run.gaps]
            ax.semilogy(range(len(gaps)), gaps,
                        label=label + (" (diverged)" if run.diverged else ""))  # fmt: skip
        ax.set(xlabel="server update", ylabel="f(x) - f*",
               title="parameter server: sync vs stale async")  # fmt: skip
        ax.legend()
    return path


def bubble_curve(stages: int, rows: list[dict], path: str) -> str:
    """Bubble vs microbatches under both conventions, with simulated points."""
    with figure(path, figsize=(9, 5)) as (fig, ax):
        ms = [r["microbatches"] for r in rows]
        ax.plot(ms, [r["bubble_s2"] for r in rows], marker="o", label="(P-1)/(M+P-1)  idle / total")
        ax.plot(ms, [r["bubble_s4"] for r in rows], marker="s", label="(P-1)/M  idle / ideal")
        ax.plot(ms, [r["simulated_1f1b_bubble"] for r in rows], "kx", markersize=9,
                label="simulated 1F1B")  # fmt: skip
        pts = [(r["microbatches"], r.get("simulated_interleaved_bubble")) for r in rows]
        pts = [p for p in pts if p[1] is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), "g^", label="simulated interleaved")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set(xlabel="microbatches M", ylabel="bubble", title=f"pipeline bubble, P={stages}")
        ax.legend()
    return path
