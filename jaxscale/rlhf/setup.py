"""The stages before RLHF: the SFT actor and the reward model (seed 002 ch13, "Common Questions").

    SFT     `jaxscale train` on the standard-library corpus (kept in a run directory and reused)
    pairs   `samples` completions per prompt from the SFT policy, every two with different true
            scores ordered into (preferred, rejected): the comparisons a labeller would make
    RM      the SFT transformer with a zero scalar head, read at the last valid token, trained on
            the pairs with the Bradley-Terry loss -log sigmoid(r_w - r_l); held-out pairwise
            accuracy is reported

Everything here runs on one device: the reward model is trained separately and then frozen.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxscale.config import ModelConfig
from jaxscale.model import state as ms
from jaxscale.rlhf import models, phases
from jaxscale.rlhf import task as task_lib

SFT_TRAIN = [
    "--data",
    "stdlib",
    "--seq-len",
    "64",
    "--global-batch",
    "32",
    "--no-progress",
    "--sample-tokens",
    "0",
    "--eval-every",
    "0",
    "--log-every",
    "100",
    "--lr",
    "3e-3",
    "--mesh",
    "dp=-1",
]
SFT_MODEL = [
    "--d-model",
    "64",
    "--layers",
    "2",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--d-ff",
    "256",
    "--max-seq",
    "64",
]


def sft_model(
    run_dir: str | Path,
    steps: int,
    model_flags: list[str] = SFT_MODEL,
    progress: bool = False,
):
    """(cfg, params) trained by `jaxscale train`, reused from `run_dir` when it holds a run.
    Training runs in its own process, as a user would run it: nothing of it (its checkpoint
    writer's threads, its programs) is left running beside the RLHF programs on the devices.
    `progress`: its progress bar on stderr; its report lines are kept off stdout either way
    (`rlhf --json` prints one JSON object there) and shown only if it fails."""
    import subprocess
    import sys

    from jaxscale.train.checkpoint import load_model

    run_dir = Path(run_dir)
    if not (run_dir / "checkpoints").is_dir():
        flags = [f for f in SFT_TRAIN if progress is False or f != "--no-progress"]
        argv = [sys.executable, "-m", "jaxscale", "train", *flags, *model_flags]
        argv += ["--steps", str(steps), "--run-dir", str(run_dir)]
        done = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-4000:])
            raise RuntimeError(f"SFT training into {run_dir} failed")
    return load_model(str(run_dir))


def comparison_pairs(
    cfg: ModelConfig,
    params,
    prompts: np.ndarray,
    task,
    samples: int = 4,
    seed: int = 0,
    batch: int = 64,
    progress=None,
):
    """(seq_w [K, S], last_w [K], seq_l [K, S], last_l [K]): every two of `samples` completions
    of a prompt whose true scores differ, the better one first. `progress()` after each batch."""
    sh = phases.Shapes(task.prompt_len, task.max_new, task_lib.EOS)
    gen = jax.jit(lambda p, x, s: phases.rollout(p, x, s, cfg, sh))
    rows = np.repeat(prompts, samples, axis=0).astype(np.int32)
    pad = -len(rows) % batch
    rows_p = np.concatenate([rows, rows[:pad]]) if pad else rows
    toks, valid = [], []
    for i in range(0, len(rows_p), batch):
        seeds = np.arange(i, i + batch, dtype=np.uint32) + np.uint32(seed * 10_000_019)
        t, v, _ = jax.device_get(gen(params, rows_p[i : i + batch], seeds))
        toks.append(t)
        valid.append(v)
        if progress:
            progress()
    toks, valid = np.concatenate(toks)[: len(rows)], np.concatenate(valid)[: len(rows)]
    score = task_lib.scores(rows, toks, valid, task)
    seq = np.concatenate([rows, toks], 1)
    last = sh.P + np.maximum(valid.sum(-1), 1) - 1
    win, lose = [], []
    for p in range(len(prompts)):
        for a, b in itertools.combinations(range(p * samples, (p + 1) * samples), 2):
            if score[a] != score[b]:
                win.append(a if score[a] > score[b] else b)
                lose.append(b if score[a] > score[b] else a)
    win, lose = np.asarray(win, int), np.asarray(lose, int)
    return seq[win], last[win], seq[lose], last[lose]


def bt_loss(rm, pairs, cfg):
    seq_w, last_w, seq_l, last_l = pairs
    margin = models.reward_forward(rm, seq_w, last_w, cfg) - models.reward_forward(
        rm, seq_l, last_l, cfg
    )
    return -jnp.mean(jax.nn.log_sigmoid(margin)), jnp.mean(margin > 0)


def train_reward_model(
    cfg: ModelConfig,
    sft_params,
    pairs,
    steps: int = 300,
    batch: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    progress=None,
):
    """The reward model: SFT backbone + zero head, Bradley-Terry on random minibatches of pairs."""
    rm = models.reward_model_init(sft_params, cfg)
    tx = optax.adamw(lr, weight_decay=0.0)
    opt = tx.init(rm)

    @jax.jit
    def step(rm, opt, mb):
        (loss, acc), g = jax.value_and_grad(bt_loss, has_aux=True)(rm, mb, cfg)
        upd, opt = tx.update(g, opt, rm)
        return optax.apply_updates(rm, upd), opt, loss, acc

    rng = np.random.default_rng(seed)
    n = len(pairs[0])
    if n < batch:
        raise ValueError(f"{n} comparison pairs; the reward model needs at least {batch}")
    for i in range(steps):
        idx = rng.choice(n, batch, replace=False)
        rm, opt, loss, acc = step(rm, opt, tuple(x[idx] for x in pairs))
        if progress:
            progress(i, float(loss), float(acc))
    return rm


def pairwise_accuracy(rm, pairs, cfg: ModelConfig) -> float:
    """Fraction of pairs the reward model orders like the true score."""
    f = jax.jit(lambda rm, s, last: models.reward_forward(rm, s, last, cfg))
    return float(
        np.mean(np.asarray(f(rm, pairs[0], pairs[1])) > np.asarray(f(rm, pairs[2], pairs[3])))
    )


def save_tree(path: str | Path, tree) -> None:
    flat, _ = jax.tree.flatten_with_path(tree)
    np.savez(path, **{jax.tree_util.keystr(k): np.asarray(v) for k, v in flat})


def load_tree(path: str | Path, like):
    data = np.load(path)
    flat, treedef = jax.tree.flatten_with_path(like)
    return jax.tree.unflatten(
        treedef, [jnp.asarray(data[jax.tree_util.keystr(k)]) for k, _ in flat]
    )


def pair_batches(prompts: int, samples: int = 4, batch: int = 64) -> int:
    """How many generation batches `comparison_pairs` runs for `prompts` prompts."""
    return -(-prompts * samples // batch)


@dataclass(frozen=True)
class Cache:
    """Where `prepare` keeps each stage under the runs directory (absolute: a relative one would
    move with the working directory, and a run started elsewhere would silently retrain)."""

    sft_dir: Path  # the `jaxscale train` run
    sft: Path  # its parameters alone (.npz, config beside in .json): later runs need no orbax
    rm: Path  # the reward model (.npz, its accuracies beside in .json)

    @property
    def sft_cached(self) -> bool:
        return self.sft.is_file()

    @property
    def rm_cached(self) -> bool:
        return self.rm.is_file()

    def files(self) -> list[Path]:
        """Every file a run writes here (the .npz and their .json)."""
        return [p.with_suffix(x) for p in (self.sft, self.rm) for x in (".npz", ".json")]


def cache_lines(c: Cache, sft_steps: int, rm_steps: int) -> list[str]:
    """The run header's account of the cache: where it is, and which stage is reused or trained."""
    sft = f"cached ({c.sft.name})" if c.sft_cached else f"will be trained (into {c.sft_dir.name}/)"
    rm = f"cached ({c.rm.name})" if c.rm_cached else "will be trained"
    return [
        f"cache: {c.sft.parent}",
        f"  SFT ({sft_steps} steps of jaxscale train on the standard library): {sft}",
        f"  reward model ({rm_steps} Bradley-Terry steps): {rm}",
    ]


def cache(runs: str | Path, task, sft_steps: int, rm_steps: int, rm_prompts: int = 256) -> Cache:
    runs = Path(runs).absolute()
    rm = f"rm3_{sft_steps}_{rm_steps}_{rm_prompts}_{task.prompt_len}_{task.max_new}.npz"
    return Cache(runs / f"sft_{sft_steps}", runs / f"sft_{sft_steps}.npz", runs / rm)


def _sft(c: Cache, sft_steps: int, progress: bool):
    if c.sft_cached:
        cfg = ModelConfig(**json.loads(c.sft.with_suffix(".json").read_text()))
        return cfg, load_tree(c.sft, jax.eval_shape(lambda: ms.init_params(cfg, 0)))
    cfg, params = sft_model(c.sft_dir, sft_steps, progress=progress)
    c.sft.parent.mkdir(parents=True, exist_ok=True)
    save_tree(c.sft, params)
    c.sft.with_suffix(".json").write_text(json.dumps(dataclasses.asdict(cfg)))
    return cfg, params


def _bar(total: int, desc: str, enabled: bool):
    from jaxscale.progress import Progress

    return Progress(total, desc=desc, enabled=enabled)


def _reward_model(c: Cache, cfg, params, train_p, held_p, task, rm_steps, rm_prompts, say, bar):
    if c.rm_cached:
        like = models.reward_model_init(params, cfg)
        return load_tree(c.rm, like), json.loads(c.rm.with_suffix(".json").read_text())
    n_held = rm_prompts // 2
    gen = _bar(pair_batches(rm_prompts) + pair_batches(n_held), "comparison pairs", bar)
    try:
        tick = lambda: gen.update(1)  # noqa: E731
        pairs = comparison_pairs(cfg, params, train_p[:rm_prompts], task, progress=tick)
        held = comparison_pairs(cfg, params, held_p[:n_held], task, seed=1, progress=tick)
    finally:
        gen.close()
    say(
        f"reward model: {rm_steps} Bradley-Terry steps on {len(pairs[0])} comparison pairs "
        f"from {rm_prompts} prompts"
    )
    fit = _bar(rm_steps, "reward model", bar)
    try:
        note = lambda i, loss, acc: fit.update(1, f"loss {loss:.3f} acc {acc:.2f}")  # noqa: E731
        rm = train_reward_model(cfg, params, pairs, rm_steps, progress=note)
    finally:
        fit.close()
    acc = {
        "train_pairs": len(pairs[0]),
        "held_out_pairs": len(held[0]),
        "train_accuracy": pairwise_accuracy(rm, pairs, cfg),
        "held_out_accuracy": pairwise_accuracy(rm, held, cfg),
    }
    save_tree(c.rm, rm)
    c.rm.with_suffix(".json").write_text(json.dumps(acc))
    return rm, acc


def prepare(
    runs: str | Path,
    task,
    sft_steps: int = 600,
    rm_steps: int = 200,
    rm_prompts: int = 256,
    say=lambda line: None,
    progress: bool = False,
):
    """(cfg, SFT params, reward model, its held-out accuracy, train prompts, held-out prompts):
    each stage kept under `runs` and reused by the next call with the same settings.
    `progress`: a bar on stderr for each stage that trains."""
    train_p, held_p = task_lib.load_prompts(task)
    c = cache(runs, task, sft_steps, rm_steps, rm_prompts)
    for line in cache_lines(c, sft_steps, rm_steps):
        say(line)
    cfg, params = _sft(c, sft_steps, progress)
    rm, acc = _reward_model(
        c, cfg, params, train_p, held_p, task, rm_steps, rm_prompts, say, progress
    )
    say(
        f"reward model: pairwise accuracy {acc['held_out_accuracy']:.3f} on "
        f"{acc['held_out_pairs']} held-out pairs ({acc['train_accuracy']:.3f} on its "
        f"{acc['train_pairs']} training pairs)"
    )
    return cfg, params, rm, acc, train_p, held_p


def random_models(cfg: ModelConfig, seed: int = 0):
    """(actor, reward model) of random weights, the reward head random too (a zero head scores
    every response alike: zero advantages, nothing to learn): tests' and `--random`'s models."""
    actor = ms.init_params(cfg, seed)
    rm = models.reward_model_init(ms.init_params(cfg, seed + 1), cfg)
    rm["head"] = {
        "w_D": jax.random.normal(jax.random.key(seed), (cfg.d_model,)),
        "b": jnp.float32(0.1),
    }
    return actor, rm
