"""The RLHF loop on a mesh: place the four models, then per iteration transfer -> generate ->
true score (host) -> score -> train -> adapt beta, timing each phase.

The actor and critic train in the training mesh's layout (the rules table: FSDP shards `embed`
over fsdp, TP heads/MLP/vocab over tensor); the frozen reference and reward model sit in the same
layout; rollouts split their rows over the data axes of the generation mesh. One-step-stale
(`stale`, disaggregated only): generation of batch k+1 is dispatched with the weights that made
batch k, before training k, so the two run at once on their own devices; PPO's ratio is taken
against the behaviour policy's own log-probs, so the staleness is corrected by the clip.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale.config import ModelConfig
from jaxscale.model import state as ms
from jaxscale.rlhf import models, phases
from jaxscale.rlhf import placement as place
from jaxscale.rlhf import rewards as rw
from jaxscale.rlhf import task as task_lib
from jaxscale.rlhf.config import RLHFConfig
from jaxscale.sharding import REPLICATED_RULES, Sharder, tree_shardings


@dataclass
class RunResult:
    history: list[dict] = field(default_factory=list)
    initial_true: float = 0.0  # held-out prompts, fixed seeds, before training
    final_true: float = 0.0  # the same prompts and seeds after
    transfers: list[place.Transfer] = field(default_factory=list)
    rollouts: list[tuple] = field(default_factory=list)  # (prompts [B, P], tokens [B, N])
    tree: dict | None = None
    memory: list[dict] = field(default_factory=list)
    # stale runs: the actor that made the batch under way, one update behind `tree`'s (what a
    # checkpoint needs to resume: the next batch is generated with it), in the generation layout
    behind: dict | None = None


@dataclass
class Lab:
    """Everything placed and compiled for one run."""

    rc: RLHFConfig
    cfg: ModelConfig
    sh: phases.Shapes
    meshes: place.Meshes
    train_sharder: Sharder
    gen_sharder: Sharder
    gen_shardings: object
    phases: tuple
    tree: dict
    opt_state: object
    ref: dict
    rm: dict


def _placed(tree, sharder: Sharder, cfg: ModelConfig):
    shardings = tree_shardings(sharder, models.logical_axes(tree, cfg))
    return jax.device_put(tree, shardings), shardings


def placement(rc: RLHFConfig, mesh: str, devices=None) -> place.Meshes:
    """The checked config's meshes; every error names its flag."""
    rc.check()
    try:
        m = place.meshes(mesh, rc.placement, rc.gen_devices, devices)
    except ValueError as e:
        raise ValueError(f"--mesh {mesh}: {e}") if "gen-devices" not in str(e) else e from None
    for name, mm in (("training", m.train), ("generation", m.gen)):
        if rc.rows % place.data_ways(mm):
            raise ValueError(
                f"--responses {rc.rows} does not split over the {name} mesh's "
                f"data axes ({place.data_ways(mm)})"
            )
    return m


def build(
    rc: RLHFConfig, cfg: ModelConfig, actor, rm, mesh: str, task: task_lib.TaskConfig, devices=None
) -> Lab:
    m = placement(rc, mesh, devices)
    # every layer written out (2 in the lab's model): no collective inside a loop body (see
    # phases.Train); compute only, the parameters are the same
    cfg = dataclasses.replace(cfg, unroll_layers=True)
    train_sharder = Sharder(m.train)
    gen_sharder = (
        train_sharder
        if (m.shared and rc.gen_layout == "train")
        else Sharder(m.gen, REPLICATED_RULES)
    )
    sh = phases.Shapes(task.prompt_len, task.max_new, task_lib.EOS)
    if sh.P + sh.N > cfg.max_seq:
        raise ValueError(f"prompt ({sh.P}) + response ({sh.N}) exceeds max_seq={cfg.max_seq}")
    try:  # a clear error before anything is placed: "kv_heads=2 does not divide over 8"
        ms.param_shardings(cfg, train_sharder)
        gen_shardings = ms.param_shardings(cfg, gen_sharder)
    except ValueError as e:
        raise ValueError(f"--mesh {mesh}: {e}") from None
    with jax.set_mesh(m.train):
        critic = rc.critic if rc.algo == "ppo" else None
        # separate buffers for every model: training donates the actor's and critic's, and a
        # device_put to a layout an array already has returns the same buffer
        fresh = lambda t: jax.tree.map(np.array, t)  # noqa: E731  (a host copy)
        tree = models.policy_init(fresh(actor), cfg, critic, fresh(actor))
        tree, tree_sh = _placed(tree, train_sharder, cfg)
        ref, _ = _placed({"actor": fresh(actor)}, train_sharder, cfg)
        rm, _ = _placed(fresh(rm), train_sharder, cfg)
        opt_state = jax.jit(phases.optimizer(rc).init)(tree)
        # Adam's moments in their parameters' layout (the init's zeros come out replicated):
        # actor and critic leaves of one shape share their logical axes, so shape decides
        by_shape = {
            x.shape: s for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(tree_sh), strict=True)
        }
        replicated = train_sharder.named(())
        opt_sh = jax.tree.map(lambda x: by_shape.get(x.shape, replicated), opt_state)
        opt_state = jax.device_put(opt_state, opt_sh)
    compiled = phases.jitted(cfg, rc, sh, train_sharder, gen_sharder, tree_sh, opt_sh)
    return Lab(
        rc,
        cfg,
        sh,
        m,
        train_sharder,
        gen_sharder,
        gen_shardings,
        compiled,
        tree,
        opt_state,
        ref["actor"],
        rm,
    )


def batch_rows(lab: Lab, prompts: np.ndarray, it: int):
    """The iteration's prompts (each repeated `group` times for GRPO) and per-row seeds."""
    rc = lab.rc
    rng = np.random.default_rng([rc.seed, it])
    rows = prompts[rng.choice(len(prompts), rc.prompts, replace=len(prompts) < rc.prompts)]
    if rc.algo == "grpo":
        rows = np.repeat(rows, rc.group, axis=0)
    seeds = (
        np.uint32(rc.seed) * np.uint32(1_000_003)
        + np.uint32(it * rc.rows)
        + np.arange(rc.rows, dtype=np.uint32)
    )
    return rows.astype(np.int32), seeds


def dispatch_generate(lab: Lab, gen_actor, prompts_BP, seeds_B):
    with jax.set_mesh(lab.meshes.gen):
        rows = lab.gen_sharder.named(("batch", None))
        p = jax.device_put(prompts_BP, rows)
        s = jax.device_put(seeds_B, lab.gen_sharder.named(("batch",)))
        return lab.phases[0](gen_actor, p, s)


def evaluate(lab: Lab, prompts: np.ndarray, task, tree=None, batches: int = 4) -> float:
    """Mean true score on the first `batches` x rc.rows of `prompts`, with fixed seeds."""
    gen_actor = jax.device_put((tree or lab.tree)["actor"], lab.gen_shardings)
    n = lab.rc.rows
    rows = np.resize(prompts, (batches * n, prompts.shape[1])).astype(np.int32)
    out = []
    for i in range(batches):
        seeds = np.arange(i * n, (i + 1) * n, dtype=np.uint32) + np.uint32(7_777_777)
        batch = rows[i * n : (i + 1) * n]
        toks, valid, _ = jax.device_get(dispatch_generate(lab, gen_actor, batch, seeds))
        out.append(task_lib.scores(batch, toks, valid, task))
    return float(np.concatenate(out).mean())


@dataclass(frozen=True)
class Start:
    """Where a resumed run picks up (`checkpoint.Saved`'s fields the loop needs)."""

    iteration: int
    beta: float
    initial_true: float
    history: list[dict]
    behind: dict | None = None  # stale runs: the actor one update older (it makes batch k)


def iterate(
    lab: Lab,
    prompts: np.ndarray,
    held_out: np.ndarray,
    task,
    log=None,
    progress=None,
    start: Start | None = None,
    after=None,
) -> RunResult:
    """Run rc.iterations iterations; `log(record)` receives each iteration's metrics, and
    `after(iterations done, beta, result)` runs after each (the state then is what `start`
    needs to continue exactly: every iteration's prompts and keys follow from its index)."""
    rc, res = lab.rc, RunResult()
    first = start.iteration if start else 0
    if first and rc.stale and start.behind is None:
        raise ValueError("--stale: resuming needs the one-update-older actor in the checkpoint")
    if start:
        res.initial_true, res.history, beta = start.initial_true, list(start.history), start.beta
    else:
        res.initial_true, beta = evaluate(lab, held_out, task), rc.beta
    gen_actor, tr = place.transfer(lab.tree["actor"], lab.gen_shardings, lab.meshes)
    res.transfers.append(tr)
    rows, seeds = batch_rows(lab, prompts, first)
    t0 = time.perf_counter()
    maker = gen_actor  # stale and resumed: batch k was made by the weights before update k - 1
    if first and rc.stale:
        maker, _ = place.transfer(start.behind, lab.gen_shardings, lab.meshes)
    pending = dispatch_generate(lab, maker, rows, seeds)
    for it in range(first, rc.iterations):
        toks, valid, logp = jax.device_get(pending)
        t_gen = time.perf_counter() - t0
        if rc.stale and it + 1 < rc.iterations:  # batch k+1 from the weights that made batch k
            nxt = batch_rows(lab, prompts, it + 1)
            pending = dispatch_generate(lab, gen_actor, *nxt)
        parts = task_lib.score_parts(rows, toks, valid, task)
        res.rollouts.append((rows, toks))
        t1 = time.perf_counter()
        with jax.set_mesh(lab.meshes.train):
            row_sh = lab.train_sharder.named(("batch", None))
            seq = jax.device_put(np.concatenate([rows, toks], 1), row_sh)
            v, lp = jax.device_put((valid, logp), row_sh)
            batch, sm = lab.phases[1](lab.tree, lab.ref, lab.rm, seq, v, lp, jnp.float32(beta))
            jax.block_until_ready(batch)
            t2 = time.perf_counter()
            lab.tree, lab.opt_state, tm = lab.phases[2](
                lab.tree, lab.opt_state, batch, jnp.float32(beta)
            )
            sm, tm = jax.device_get((sm, tm))
        t3 = time.perf_counter()
        if rc.stale:  # it made batch it + 1, now under way
            res.behind = gen_actor
        gen_actor, tr = place.transfer(lab.tree["actor"], lab.gen_shardings, lab.meshes)
        res.transfers.append(tr)
        kl = float(sm["kl"])
        record = {
            "iteration": it,
            "true_score": float(parts["total"].mean()),
            "beta": beta,
            **{f"{k}_rate": float(parts[k].mean()) for k in ("ends", "balanced", "parses")},
            **{k: float(x) for k, x in {**sm, **tm}.items()},
            "t_generate_s": t_gen,
            "t_score_s": t2 - t1,
            "t_train_s": t3 - t2,
            "t_transfer_s": tr.seconds,
            "transfer_bytes": tr.bytes_moved,
            "tokens_per_s": float(valid.sum()) / max(t_gen, 1e-9),
        }
        res.history.append(record)
        if log:
            log(record)
        if progress:
            progress(record)
        beta = rw.adaptive_beta(beta, kl, rc.kl_target, rc.kl_horizon, rc.rows)
        if after:
            after(it + 1, beta, res)
        if it + 1 < rc.iterations:
            t0 = time.perf_counter()
            if not rc.stale:
                rows, seeds = batch_rows(lab, prompts, it + 1)
                pending = dispatch_generate(lab, gen_actor, rows, seeds)
            else:
                rows, seeds = nxt
    res.final_true = evaluate(lab, held_out, task)
    res.tree = lab.tree
    return res
