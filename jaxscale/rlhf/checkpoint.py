"""The RLHF policy as a `jaxscale train` checkpoint, and the RLHF state to resume from.

`--out DIR` gets DIR/policy laid out as a `jaxscale train --out` run directory: config.json and
orbax checkpoints under checkpoints/<iteration>/, so `jaxscale serve --ckpt-dir DIR/policy`
loads the trained actor like any trained model. Each checkpoint holds three items:

    state   {step, params, opt_state}: the train format; params are the actor's, opt_state
            the train optimizer's zeros (the serve loader restores the whole train state)
    meta    the train record (model config, format) plus the RLHF record: config, iterations
            done, beta, the initial held-out score and the metrics so far
    rlhf    {tree, opt_state}: actor, critic and their Adam state, for `--resume` (a --stale
            run adds `behind`: the actor one update older, which made the batch under way)

Only `--resume` reads `rlhf`; the serve loader reads `state` and `meta` alone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.train import checkpoint as ckpt

POLICY = "policy"  # under --out


def policy_dir(out: str | Path) -> Path:
    return Path(out) / POLICY


def ckpt_dir(out: str | Path) -> Path:
    return policy_dir(out) / "checkpoints"


@dataclass(frozen=True)
class Saved:
    """The RLHF record of a checkpoint: where a resumed run picks up."""

    iteration: int  # iterations done
    beta: float  # the KL coefficient the controller left after them
    initial_true: float  # held-out true score before the first iteration
    history: list[dict]  # their metrics records
    config: dict  # the RLHFConfig that made them


def _manager(directory: Path, keep: int | None):
    import orbax.checkpoint as ocp

    logging.getLogger("absl").setLevel(logging.ERROR)  # orbax's per-step info lines
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(directory.absolute(), options=options)


def _train_state(cfg: ModelConfig, actor, step: int) -> tuple[dict, TrainConfig]:
    """The train checkpoint's state for `actor`: the loader rebuilds the train state's tree
    (optimizer included) to restore into, so its slot holds the train optimizer's zeros."""
    from jaxscale.parallel import auto

    tcfg = TrainConfig()
    abstract = jax.eval_shape(lambda: auto.init_state(cfg, tcfg))
    zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), abstract["opt_state"])
    state = {"step": np.int32(step), "params": jax.device_get(actor), "opt_state": zeros}
    return state, tcfg


def write_config(out: str | Path, cfg: ModelConfig, record: dict) -> None:
    """DIR/policy/config.json: the model and the run that trained it."""
    path = policy_dir(out)
    path.mkdir(parents=True, exist_ok=True)
    config = {"model": dataclasses.asdict(cfg), **record}
    (path / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def save(
    out: str | Path, cfg: ModelConfig, lab, saved: Saved, mesh: str, keep=None, behind=None
) -> Path:
    """Checkpoint `lab`'s policy after `saved.iteration` iterations (and, for a stale run, the
    actor one update `behind`); blocks until written (the next training step donates the
    buffers saved here)."""
    import orbax.checkpoint as ocp

    state, tcfg = _train_state(cfg, lab.tree["actor"], saved.iteration)
    meta = ckpt.meta_record(cfg, tcfg, mesh, "rlhf") | {"rlhf": dataclasses.asdict(saved)}
    path = ckpt_dir(out)
    resumable = {"tree": lab.tree, "opt_state": lab.opt_state}
    if behind is not None:
        resumable["behind"] = behind
    with _manager(path, keep) as mgr:
        mgr.save(
            saved.iteration,
            force=True,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                meta=ocp.args.JsonSave(meta),
                rlhf=ocp.args.StandardSave(resumable),
            ),
        )
        mgr.wait_until_finished()
    return path / str(saved.iteration)


def latest(out: str | Path) -> int | None:
    return ckpt.latest_step(ckpt_dir(out))


def read_saved(out: str | Path, step: int) -> Saved:
    meta = ckpt.read_meta(ckpt_dir(out), step)
    if not isinstance(meta, dict) or "rlhf" not in meta:
        raise ckpt.CheckpointError(f"{ckpt_dir(out)} step {step} is not an RLHF checkpoint")
    return Saved(**meta["rlhf"])


def restore(out: str | Path, lab, step: int) -> tuple[Saved, dict | None]:
    """Put checkpoint `step`'s actor, critic and Adam state into `lab`, in its own layout; and
    return its record and, for a stale run, the actor one update behind (in the actor's
    training layout)."""
    import orbax.checkpoint as ocp

    saved = read_saved(out, step)
    like = {"tree": lab.tree, "opt_state": lab.opt_state}
    if saved.config.get("stale"):
        like["behind"] = lab.tree["actor"]
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like
    )
    with _manager(ckpt_dir(out), None) as mgr:
        got = mgr.restore(step, args=ocp.args.Composite(rlhf=ocp.args.StandardRestore(target)))
    lab.tree, lab.opt_state = got["rlhf"]["tree"], got["rlhf"]["opt_state"]
    return saved, got["rlhf"].get("behind")
