"""One training command's work: compile, run every seed, summarise, write metrics and the curve.

Kept apart from `cli.py` so the bench and the experiment call the same code. The whole run is one
compiled program; the progress bar is fed by a host callback from inside it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxscale.render import json_line
from jaxscale.rl import env as envs
from jaxscale.rl.config import RLConfig


class Stopped(Exception):
    """A run stopped (Ctrl-C) before anything worth keeping finished."""


@dataclass(frozen=True)
class Outcome:
    cfg: RLConfig
    seeds: tuple[int, ...]
    metrics: dict  # name -> [S, n_updates] numpy
    evals: np.ndarray  # [S, n_chunks]
    compile_s: float
    train_s: float
    devices: int
    profile: dict | None = None  # --profile: the run's trace read back (profiling.report)

    @property
    def threshold(self) -> float:
        return envs.check_env(self.cfg.env).solved_return

    def eval_steps(self) -> np.ndarray:
        """Environment steps at each evaluation."""
        return (np.arange(self.evals.shape[1]) + 1) * self.cfg.batch * self.cfg.eval_every

    def solved_at(self) -> list[int | None]:
        """Per seed: env steps at the first evaluation whose mean return reached the threshold."""
        out = []
        for row in self.evals:
            hit = np.nonzero(row >= self.threshold)[0]
            out.append(int(self.eval_steps()[hit[0]]) if hit.size else None)
        return out

    def first_non_finite(self) -> dict[int, int]:
        """{seed: the first update (1-based) with a non-finite loss}. (Statistics may be NaN
        by design: an update in which no episode ended has no mean episode return.)"""
        bad = np.zeros((len(self.seeds), self.cfg.n_updates), bool)
        for k, v in self.metrics.items():
            if k.endswith("loss"):
                bad |= ~np.isfinite(np.asarray(v, np.float64).reshape(bad.shape))
        rows = zip(self.seeds, bad, strict=True)
        return {seed: int(np.argmax(row)) + 1 for seed, row in rows if row.any()}

    def summary(self) -> dict:
        solved = self.solved_at()
        done = sorted(s for s in solved if s is not None)
        final = self.evals[:, -1]
        return {
            "algo": self.cfg.algo,
            "env": self.cfg.env,
            "seeds": len(self.seeds),
            "env_steps": self.cfg.env_steps,
            "devices": self.devices,
            "threshold": self.threshold,
            "final_eval_return": [float(x) for x in final],
            "seeds_solved_at_end": int(np.sum(final >= self.threshold)),
            "solved_at_env_steps": solved,
            "median_solved_at": int(np.median(done)) if len(done) * 2 > len(solved) else None,
            "compile_s": round(self.compile_s, 2),
            "train_s": round(self.train_s, 2),
            "env_steps_per_s": self.cfg.env_steps * len(self.seeds) / self.train_s,
        }


def train(
    cfg: RLConfig,
    seeds: list[int],
    mesh=None,
    progress: bool = False,
    stop=None,
    profile: str | None = None,
) -> Outcome:
    """Compile and run every seed. `stop` (a `threading.Event`, e.g. set by Ctrl-C): the run
    skips the chunks of `eval_every` updates after it is set, and the Outcome holds the chunks
    that finished (its config's `total_steps` cut to them). `profile` (a directory): the run,
    compiled first, is traced whole (it is one program) and read back per update."""
    import jax

    from jaxscale.progress import Progress
    from jaxscale.rl import loop

    ways = 1 if mesh is None else mesh.shape[loop.AXIS]
    cfg.check(ways)
    bar = Progress(cfg.n_updates, desc=f"{cfg.algo} {cfg.env}", enabled=progress)

    def tick(i, shard):
        # called per device (shard_map) and per seed (vmap): advance on shard 0's newest update
        if np.min(np.asarray(shard)) == 0 and int(np.max(i)) + 1 > bar.n:
            bar.update(int(np.max(i)) + 1 - bar.n)

    keys = jax.vmap(jax.random.key)(np.asarray(seeds, np.uint32))
    asked = None if stop is None else (lambda j: np.int32(stop.is_set()))
    fn = loop.make_run(cfg, mesh, progress=tick if progress else None, stop=asked)
    t0 = time.perf_counter()
    compiled = fn.lower(keys).compile()
    t1 = time.perf_counter()
    if profile:
        Path(profile).mkdir(parents=True, exist_ok=True)
        jax.profiler.start_trace(profile, create_perfetto_trace=True)
    try:
        _, metrics, evals = jax.block_until_ready(compiled(keys))
    finally:
        if profile:
            jax.profiler.stop_trace()
    t2 = time.perf_counter()
    bar.close()
    metrics = {k: np.asarray(v) for k, v in metrics.items()}
    evals = np.asarray(evals)
    if "ran" in metrics:
        # the chunks before the stop ran (every seed and shard alike): keep those
        chunks = int(np.sum(metrics.pop("ran")[0])) // cfg.eval_every
        if chunks == 0:
            raise Stopped(f"stopped before the first {cfg.eval_every} updates finished")
        if chunks < cfg.n_chunks:
            cfg = cfg.replace(total_steps=chunks * cfg.batch * cfg.eval_every)
            metrics = {k: v[:, : chunks * cfg.eval_every] for k, v in metrics.items()}
            evals = evals[:, :chunks]
    traced = None
    if profile:  # per update that ran (a stop skips the rest's work)
        from jaxscale.profiling import report

        traced = report(profile, cfg.n_updates, compiled.as_text())
    return Outcome(cfg, tuple(seeds), metrics, evals, t1 - t0, t2 - t1, ways, traced)


def write_scalars(out: Outcome, logdir) -> None:
    """The same records as TensorBoard scalars (jaxscale/scalars.py): seed<S>/<metric> at each
    update's environment steps, seed<S>/eval_return at each evaluation's."""
    from jaxscale.scalars import Scalars

    writer, cfg = Scalars(logdir), out.cfg
    try:
        for s, seed in enumerate(out.seeds):
            for u in range(cfg.n_updates):
                values = {k: float(v[s, u]) for k, v in out.metrics.items()}
                writer.record(f"seed{seed}", (u + 1) * cfg.batch, values)
            for j, steps in enumerate(out.eval_steps()):
                writer.record(f"seed{seed}", int(steps), {"eval_return": float(out.evals[s, j])})
    finally:
        writer.close()


def write_metrics(out: Outcome, path: Path) -> Path:
    """JSON lines: one per update and seed, and one per evaluation and seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = out.cfg
    with path.open("w") as f:
        for s, seed in enumerate(out.seeds):
            for u in range(cfg.n_updates):
                rec = {"seed": seed, "update": u + 1, "env_steps": (u + 1) * cfg.batch}
                rec |= {k: float(v[s, u]) for k, v in out.metrics.items()}
                f.write(json_line(rec) + "\n")
            for j, steps in enumerate(out.eval_steps()):
                f.write(
                    json.dumps(
                        {
                            "seed": seed,
                            "env_steps": int(steps),
                            "eval_return": float(out.evals[s, j]),
                        }
                    )
                    + "\n"
                )
    return path


def plot_curves(runs: dict[str, Outcome], path: Path) -> Path:
    """Return vs environment steps: each run's mean over seeds of the training episodes' return
    (line, min-max band over seeds) and of the evaluations (markers). The legend sits right of
    the axes, clear of the curves."""
    from jaxscale.render import figure

    with figure(path, figsize=(12, 5), dpi=110) as (fig, ax):
        for i, (label, out) in enumerate(runs.items()):
            color = f"C{i}"
            x = (np.arange(out.cfg.n_updates) + 1) * out.cfg.batch
            r = out.metrics["episode_return"]  # NaN in updates where no episode ended
            seen = ~np.all(np.isnan(r), axis=0)
            x, r = x[seen], r[:, seen]
            ax.plot(
                x,
                np.nanmean(r, 0),
                color=color,
                linewidth=1.2,
                label=f"{label}: training episodes (mean of {len(out.seeds)} seeds)",
            )
            ax.fill_between(
                x,
                np.nanmin(r, 0),
                np.nanmax(r, 0),
                color=color,
                alpha=0.15,
                label=f"{label}: training episodes, min-max over {len(out.seeds)} seeds",
            )
            if not np.all(np.isnan(out.evals)):
                ax.plot(
                    out.eval_steps(),
                    out.evals.mean(0),
                    "o",
                    color=color,
                    markersize=4,
                    label=f"{label}: evaluation",
                )
        threshold = next(iter(runs.values())).threshold
        ax.axhline(threshold, linestyle="--", color="gray", label=f"solved ({threshold:g})")
        ax.set(
            xlabel="environment steps", ylabel="episodic return", title="CartPole: learning curves"
        )
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    return path
