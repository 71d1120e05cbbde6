"""Plots of the communication lab: the collectives benchmark with its alpha-beta fit, and, for
experiment 04, the model's all-reduce algorithms next to a measured psum.

matplotlib is imported inside the function (Agg backend), so importing this module is cheap.
"""

import os

import numpy as np

from jaxscale.calc import comm


def plot_algorithms(rows, n_measured: int, path: str, link_key: str = "nvlink4") -> str:
    """Left: model time of each all-reduce algorithm on 8 ranks over `link_key`, crossovers
    marked. Right: measured latency (`rows` from jaxscale.bench.collectives.measure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    link = comm.LINKS[link_key]
    sizes = np.logspace(3, 9, 61)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for alg in comm.algorithms_for("all-reduce", 8):
        t = [comm.collective_cost("all-reduce", alg, 8, s, link).total_s * 1e3 for s in sizes]
        left.loglog(sizes, t, label=alg)
    for alg in ("tree", "double_binary_tree"):
        x = comm.crossover_bytes("all-reduce", alg, "ring", 8, link)
        if x:
            left.axvline(x, ls=":", color="gray")
            left.text(
                x, left.get_ylim()[1] * 0.3, f" {alg} < ring\n below {x / 1e6:.2f} MB", fontsize=7
            )
    left.set(
        xlabel="message size D (bytes)",
        ylabel="time (ms)",
        title=f"alpha-beta model, 8 ranks, {link.name}",
    )
    left.legend(fontsize=7)
    if rows:
        right.loglog([r.size_bytes for r in rows], [r.latency_s * 1e3 for r in rows], "o-")
    right.set(
        xlabel="message size D (bytes)",
        ylabel="median latency (ms)",
        title=f"measured psum, {n_measured} devices (indicative on CPU)",
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_measurements(rows, fits, n: int, path: str) -> str:
    """`jaxscale bench collectives`: measured latency (dots) and the alpha-beta fit (lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for f in fits:
        mine = [r for r in rows if r.variant == f.variant]
        sizes = np.array([r.size_bytes for r in mine], float)
        (line,) = ax.loglog(sizes, [r.latency_s * 1e3 for r in mine], "o", label=f.variant)
        bus = np.array([r.busbw_Bps * r.latency_s for r in mine])  # bus bytes of each size
        ax.loglog(sizes, (f.alpha_s + bus / f.busbw_Bps) * 1e3, "-", color=line.get_color())
    ax.set_xlabel("message size per device (bytes)")
    ax.set_ylabel("latency (ms, median)")
    ax.set_title(f"collectives on {n} devices: measured (dots) and alpha-beta fit (lines)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
