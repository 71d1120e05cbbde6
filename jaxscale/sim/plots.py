"""PNG figures for the simulators (`jaxscale.render.figure`: matplotlib only when one is drawn).
Each returns the path it wrote."""

from jaxscale.render import figure


def batching(static, continuous, path: str) -> str:
    """Utilisation over time for both strategies (seed 000 Exercise 3's utilisation plot)."""
    with figure(path, 2, 1, figsize=(12, 7)) as (fig, axes):
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
            ax.set(
                ylabel="slot utilisation", title=f"{res.strategy} batching: {res.total_steps} steps"
            )
            ax.legend()
        axes[1].set_xlabel("step")
    return path


def speculative(k_points, mp_sweep, path: str) -> str:
    """Speedup and tokens per round vs K, and the match-probability sweep (seed 000 Exercise 2)."""
    with figure(path, 1, 3, figsize=(18, 5)) as (fig, (ax1, ax2, ax3)):
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
        accepted = [p.avg_accepted_per_round for p in k_points]
        ax2.bar(ks, accepted, label="accepted drafts")
        ax2.bar(ks, [1] * len(ks), bottom=accepted, label="target's own token (+1)")
        ax2.plot(ks, [k + 1 for k in ks], linestyle="--", color="red", label="maximum K+1")
        ax2.set(xlabel="draft length K", ylabel="tokens per round", title="tokens per target pass")
        for mp, points in mp_sweep.items():
            ax3.plot(
                [p.k for p in points],
                [p.speedup for p in points],
                marker="o",
                label=f"match_prob={mp}",
            )
        ax3.axhline(1.0, linestyle="--", color="gray")
        ax3.set(xlabel="draft length K", ylabel="speedup", title="match probability vs optimal K")
        for ax in (ax1, ax2, ax3):
            ax.legend()
    return path


def _gantt(path: str, rows: list, draw, height: tuple, xlabel: str, top: float = 1.0) -> str:
    """Stacked Gantt panels, one per entry of `rows` (`draw(ax, row)` fills one); the figure is
    height[0] + height[1] per panel tall; the panels leave the figure above `top` free."""
    size = (12, height[0] + height[1] * len(rows))
    with figure(path, len(rows), 1, figsize=size, rect=(0, 0, 1, top)) as (fig, _):
        for ax, row in zip(fig.axes, rows, strict=True):
            draw(ax, row)
            ax.invert_yaxis()
        fig.axes[-1].set_xlabel(xlabel)
    return path


def pipeline(results, path: str, titles=None) -> str:
    """One Gantt chart per schedule: forward, backward (and ZB-H1's weight-gradient) ops per
    device over time. `titles`: a prefix per panel (e.g. simulated / executed)."""
    from matplotlib.collections import PolyCollection

    prefix = dict(zip(map(id, results), titles or [""] * len(results), strict=True))

    def draw(ax, res):
        cfg = res.config
        for kind, color in (("F", "#1f77b4"), ("B", "#ff7f0e"), ("W", "#2ca02c")):  # fast
            boxes = [
                [(s.start, d - 0.4), (s.end, d - 0.4), (s.end, d + 0.4), (s.start, d + 0.4)]
                for s in res.spans.values()
                if s.op.key[0] == kind
                for d in [s.op.resource]
            ]
            ax.add_collection(
                PolyCollection(
                    boxes,
                    facecolors=color,
                    edgecolors="white",
                    linewidths=1 if len(boxes) < 512 else 0,
                )
            )
        ax.set_xlim(0, res.makespan * 1.05)  # the 5% margin barh would leave
        ax.set_ylim(-0.5, cfg.stages - 0.5)  # inverted by _gantt: GPU0 on top
        shown = range(0, cfg.stages, -(-cfg.stages // 16))  # at most 16 labels
        ax.set_yticks(shown, [f"GPU{d}" for d in shown])
        ax.set_title(
            f"{prefix[id(res)]}{cfg.schedule}: P={cfg.stages}, M={cfg.microbatches}, makespan "
            f"{res.makespan:g}, bubble {res.bubble_s2:.1%} (blue F, orange B, green W)"
        )

    return _gantt(path, list(results), draw, (2, 1.6), "time")


TIMELINE_COLORS = {"S": "#1f77b4", "C": "#2ca02c", "P": "#ff7f0e", "L": "#d62728", "K": "#2ca02c"}
TIMELINE_LEGEND = (
    ("S", "schedule (CPU)"),
    ("P", "postprocess (CPU)"),
    ("L", "launch (CPU)"),
    ("C", "compute / kernel (GPU)"),
)  # K is drawn in C's colour


def timelines(named_spans: dict, path: str) -> str:
    """CPU/GPU Gantt rows for each named simulation, cut at its end time (overlap command), with
    a legend of the op colours on top."""
    from matplotlib.patches import Patch

    def draw(ax, item):
        name, (spans, end) = item
        for span in (s for s in spans.values() if s.start < end):
            ax.barh(
                0 if span.op.resource == "cpu" else 1,
                min(span.end, end) - span.start,
                left=span.start,
                color=TIMELINE_COLORS[span.op.label],
                edgecolor="white",
                linewidth=0.5,
            )
        ax.set_yticks([0, 1], ["CPU", "GPU"])
        ax.set(xlim=(0, end), title=name)
        if ax is ax.figure.axes[0]:
            handles = [Patch(color=TIMELINE_COLORS[k], label=text) for k, text in TIMELINE_LEGEND]
            ax.figure.legend(handles=handles, loc="upper center", ncol=4, frameon=False)

    return _gantt(path, list(named_spans.items()), draw, (1.5, 1.4), "ms", top=0.97)


def param_server(runs, path: str) -> str:
    """Optimality gap per server update, log scale. A gap of exactly 0 (converged to rounding)
    has no place on a log axis: the curve ends there and its label says when. The sync and async
    runs are drawn wide and pale, the delayed sweep thin and dashed on top, so that curves that
    coincide (sync and tau=0, async and tau=W-1 with equal compute times) all stay visible."""
    with figure(path) as (fig, ax):
        for label, run in runs.items():
            zero = next((i for i, g in enumerate(run.gaps) if not g > 0), None)
            gaps = [g if g > 0 else float("nan") for g in run.gaps]
            note = " (diverged)" if run.diverged else ""
            if zero is not None and not run.diverged:
                note = f" (gap 0 from update {zero})"
            style = (
                {"linestyle": "--", "linewidth": 1.2}
                if run.mode.startswith("delayed")
                else {"linewidth": 4, "alpha": 0.45}
            )
            ax.semilogy(range(len(gaps)), gaps, label=label + note, **style)
        ax.set(
            xlabel="server update",
            ylabel="f(x) - f*",
            title="parameter server: sync vs stale async",
        )
        ax.legend(fontsize=8)
    return path


def bubble_curve(stages: int, rows: list[dict], path: str) -> str:
    """Bubble vs microbatches under both conventions, with simulated points."""
    with figure(path, figsize=(9, 5)) as (fig, ax):
        ms = [r["microbatches"] for r in rows]
        ax.plot(ms, [r["bubble_s2"] for r in rows], marker="o", label="(P-1)/(M+P-1)  idle / total")
        ax.plot(ms, [r["bubble_s4"] for r in rows], marker="s", label="(P-1)/M  idle / ideal")
        ax.plot(
            ms,
            [r["simulated_1f1b_bubble"] for r in rows],
            "kx",
            markersize=9,
            label="simulated 1F1B",
        )
        pts = [(r["microbatches"], r.get("simulated_interleaved_bubble")) for r in rows]
        pts = [p for p in pts if p[1] is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), "g^", label="simulated interleaved")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set(xlabel="microbatches M", ylabel="bubble", title=f"pipeline bubble, P={stages}")
        ax.legend()
    return path
