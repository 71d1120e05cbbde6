"""Checkpoints with orbax: atomic, mesh-independent, and checked before they are trusted.

A checkpoint holds the training state (step, params, Adam state) and a JSON record of the model
and training configs. Orbax writes each step into a temporary directory and renames it when
complete, so an interrupted save leaves no half-written step behind. Restoring takes target
shardings, so a checkpoint saved under one mesh restores under another (orbax reshards).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax

from jaxscale.config import ModelConfig, TrainConfig


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt, or does not match the run restoring it."""


def _manager(directory: Path, create: bool):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(
        max_to_keep=3, create=create, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(directory.absolute(), options=options)


def meta_record(cfg: ModelConfig, tcfg: TrainConfig, mesh_spec: str) -> dict:
    return {
        "model": dataclasses.asdict(cfg),
        "train": dataclasses.asdict(tcfg),
        "mesh": mesh_spec,
        "format": "jaxscale-v1",
    }


def save(directory: str | Path, state, meta: dict) -> int:
    """Write `state` at its step; returns the step. Blocks until the write is complete."""
    import orbax.checkpoint as ocp

    step = int(jax.device_get(state["step"]))
    with _manager(Path(directory), create=True) as mgr:
        mgr.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        mgr.wait_until_finished()
    return step


def latest_step(directory: str | Path) -> int | None:
    path = Path(directory)
    if not path.is_dir():
        return None
    with _manager(path, create=False) as mgr:
        return mgr.latest_step()


def restore(directory: str | Path, target_shardings, abstract_state, expected_meta: dict,
            step: int | None = None):  # fmt: skip
    """Restore into the given shardings (any mesh). Raises CheckpointError with the reason."""
    import orbax.checkpoint as ocp

    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory at {path}")
    with _manager(path, create=False) as mgr:
        step = mgr.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"{path} holds no finished checkpoint")
        try:
            meta = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception as e:  # orbax raises many types for unreadable files
            raise CheckpointError(f"checkpoint {path} step {step} is unreadable: {e}") from e
        _check_meta(meta, expected_meta, path, step)
        target = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            abstract_state,
            target_shardings,
        )
        try:
            restored = mgr.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
            )
        except Exception as e:
            raise CheckpointError(f"checkpoint {path} step {step} is corrupt: {e}") from e
    return restored["state"], meta


def _check_meta(meta, expected: dict, path: Path, step: int) -> None:
    if not isinstance(meta, dict) or meta.get("format") != expected["format"]:
        raise CheckpointError(f"{path} step {step} is not a jaxscale checkpoint")
    if meta["model"] != expected["model"]:
        diff = {
            k: (meta["model"].get(k), v)
            for k, v in expected["model"].items()
            if meta["model"].get(k) != v
        }
        raise CheckpointError(
            f"checkpoint {path} step {step} was saved for a different model; "
            f"field: (saved, requested) = {json.dumps(diff)}"
        )
