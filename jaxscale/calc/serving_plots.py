"""PNG plots for the serving and RL calculators; matplotlib is imported only when one is drawn."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_rl_throughput(
    path: str,
    batch_sizes: list[int],
    sync_samples_per_s: list[float],
    async_samples_per_s: list[float],
    title_suffix: str = "",
) -> None:
    """The seed's two panels (shared/seeds/001_*.txt L1503-1532): samples/s per batch size for
    sync and async, and the async/sync speedup."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    x = range(len(batch_sizes))
    width = 0.35
    ax1.bar([i - width / 2 for i in x], sync_samples_per_s, width, label="Synchronous")
    ax1.bar([i + width / 2 for i in x], async_samples_per_s, width, label="Asynchronous")
    ax1.set_xticks(list(x))
    ax1.set_xticklabels([str(b) for b in batch_sizes])
    ax1.set_xlabel("Batch size")
    ax1.set_ylabel("Throughput (samples/s)")
    ax1.set_title(f"RL training throughput: sync vs async{title_suffix}")
    ax1.legend()
    ax1.grid(True, alpha=0.3, axis="y")
    speedups = [a / s for a, s in zip(async_samples_per_s, sync_samples_per_s, strict=True)]
    ax2.plot(batch_sizes, speedups, marker="o", color="green")
    ax2.axhline(1.0, color="r", linestyle="--", alpha=0.5, label="Baseline (sync)")
    ax2.set_xlabel("Batch size")
    ax2.set_ylabel("Speedup (async / sync)")
    ax2.set_title("Async vs sync speedup")
    ax2.legend()
    ax2.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_kv_capacity(
    path: str, contexts: list[int], series: dict[str, list[int]], title: str
) -> None:
    """Concurrent requests against context length, one line per label (log-log)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, values in series.items():
        ax.plot(contexts, values, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("Context length (tokens)")
    ax.set_ylabel("Concurrent requests")
    ax.set_title(title)
    ax.legend()
    ax.grid(True, alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
