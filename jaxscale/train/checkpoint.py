"""Checkpoints with orbax: atomic, mesh- and strategy-independent, checked before they are trusted.

A checkpoint holds the training state (step, params, optimizer state) and a JSON record of the
model and training configs. Orbax writes each step into a temporary directory and renames it when
complete, and marks it complete (`_CHECKPOINT_METADATA`); a step directory without the mark (an
interrupted save, a stray folder) is never taken for a checkpoint, so resume falls back to the
last complete one. Restoring takes target shardings, so a checkpoint saved under one mesh and
strategy restores under another (orbax reshards). Every failure is a `CheckpointError` whose
message is one line naming the step and what to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import sys
from pathlib import Path

import jax

from jaxscale.config import ModelConfig, TrainConfig

FORMAT = "jaxscale-v1"
# Model fields that change how the parameters are computed with, not what they are: a run may
# resume with another value (remat on or off, another compute dtype, an unrolled layer loop).
COMPUTE_ONLY = ("compute_dtype", "remat", "unroll_layers")
_COMPLETE_MARKS = ("_CHECKPOINT_METADATA", "commit_success.txt")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt, or does not match the run restoring it."""


KEEP = 3  # finished checkpoints kept by default (`train --keep-checkpoints`)


def _manager(directory: Path, create: bool, keep: int | None = KEEP):
    """Orbax's manager of `directory`; saving through it deletes all but the newest `keep`
    (None: keep all)."""
    import orbax.checkpoint as ocp

    # orbax logs a warning for every step directory it cannot read; `steps` reports those once
    logging.getLogger("absl").setLevel(logging.ERROR)

    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=create, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(directory.absolute(), options=options)


def meta_record(cfg: ModelConfig, tcfg: TrainConfig, mesh_spec: str, strategy: str = "auto"):
    return {
        "model": dataclasses.asdict(cfg),
        "train": dataclasses.asdict(tcfg),
        "mesh": mesh_spec,
        "strategy": strategy,
        "format": FORMAT,
    }


def steps(directory: str | Path) -> tuple[list[int], list[int]]:
    """(complete steps, incomplete step directories), each ascending."""
    path = Path(directory)
    if not path.is_dir():
        return [], []
    complete, stray = [], []
    for child in path.iterdir():
        if child.is_dir() and child.name.isdigit():
            done = any((child / mark).exists() for mark in _COMPLETE_MARKS)
            (complete if done else stray).append(int(child.name))
    return sorted(complete), sorted(stray)


def latest_step(directory: str | Path) -> int | None:
    """The newest complete checkpoint's step, or None."""
    complete, _ = steps(directory)
    return complete[-1] if complete else None


def save(directory: str | Path, state, meta: dict, keep: int | None = KEEP) -> int:
    """Write `state` at its step (a no-op if that step is already saved), keeping the newest
    `keep` checkpoints; returns the step. Blocks until the write is complete."""
    import orbax.checkpoint as ocp

    step = int(jax.device_get(state["step"]))
    path = Path(directory)
    complete, stray = steps(path)
    if step in complete:
        return step
    if step in stray:  # an unfinished directory of this very step (never a checkpoint): replace it
        shutil.rmtree(path / str(step))
    try:
        with _manager(path, create=True, keep=keep) as mgr:
            mgr.save(
                step,
                force=True,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
                ),
            )
            mgr.wait_until_finished()
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"cannot write checkpoint step {step} to {path}: {_first_line(e)}"
        ) from e
    return step


def restore(
    directory: str | Path,
    target_shardings,
    abstract_state,
    expected_meta: dict,
    step: int | None = None,
):
    """Restore into the given shardings (any mesh, any strategy): (state, saved meta)."""
    import orbax.checkpoint as ocp

    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory at {path}")
    step = latest_step(path) if step is None else step
    if step is None:
        raise CheckpointError(f"{path} holds no finished checkpoint")
    fix = _fix(path, step)
    meta = read_meta(path, step)
    check_meta(meta, expected_meta, path, step)
    with _manager(path, create=False) as mgr:
        target = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            abstract_state,
            target_shardings,
        )
        try:
            with _quiet_failed_reads():
                restored = mgr.restore(
                    step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
                )
        except Exception as e:  # orbax raises many types for unreadable files
            raise CheckpointError(
                f"checkpoint {path} step {step} is corrupt ({_first_line(e)}); {fix}"
            ) from e
    return restored["state"], meta


def read_meta(directory: str | Path, step: int) -> dict:
    """The run record a checkpoint step was saved with (model, training, mesh, strategy)."""
    import orbax.checkpoint as ocp

    path = Path(directory)
    with _manager(path, create=False) as mgr:
        try:
            with _quiet_failed_reads():
                args = ocp.args.Composite(meta=ocp.args.JsonRestore())
                return mgr.restore(step, args=args)["meta"]
        except Exception as e:  # orbax raises many types for unreadable files
            raise CheckpointError(
                f"checkpoint {path} step {step} is unreadable ({_first_line(e)}); "
                f"{_fix(path, step)}"
            ) from e


def check_meta(meta, expected: dict, path: Path, step: int) -> None:
    """The saved run must have the same parameters: the same model but for compute-only fields."""
    if not isinstance(meta, dict) or meta.get("format") != expected["format"]:
        raise CheckpointError(f"{path} step {step} is not a jaxscale checkpoint")
    saved, wanted = meta["model"], expected["model"]
    diff = {
        k: (saved.get(k), v)
        for k, v in wanted.items()
        if k not in COMPUTE_ONLY and saved.get(k) != v
    }
    if diff:
        raise CheckpointError(
            f"checkpoint {path} step {step} was saved for a different model; "
            f"field: (saved, requested) = {json.dumps(diff)}"
        )


@contextlib.contextmanager
def _quiet_failed_reads():
    """Around an orbax read: if it fails, orbax's other reads of the same step fail too, on
    their own threads and tasks, while the error unwinds or at the interpreter's exit. They print
    'Event loop is closed' (a tensorstore callback, as an unraisable exception) and 'Task
    exception was never retrieved' (asyncio's log): noise after the one-line error. The filters
    go in before the read, since the first can print while the read is still failing, and stay
    after a failure; a read that succeeds leaves nothing behind."""
    previous = sys.unraisablehook

    def hook(info):
        if not (
            isinstance(info.exc_value, RuntimeError)
            and "Event loop is closed" in str(info.exc_value)
        ):
            previous(info)

    def unretrieved(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Task exception was never retrieved")

    sys.unraisablehook = hook
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addFilter(unretrieved)
    yield  # a failed read raises here, and the filters stay
    sys.unraisablehook = previous
    asyncio_log.removeFilter(unretrieved)


def _fix(path: Path, step: int) -> str:
    older = [s for s in steps(path)[0] if s < step]
    if older:
        return f"delete {path / str(step)} to resume from step {older[-1]}"
    return "delete it, or train from scratch in another --ckpt-dir"


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= 160 else line[:157] + "..."


def load_params(directory: str | Path, step: int | None = None):
    """(model config, parameters on one device) of a training checkpoint, for inference: the
    config comes from the checkpoint's own record, the optimizer state is read and dropped."""

    from jaxscale.parallel import auto

    path = Path(directory)
    step = latest_step(path) if path.is_dir() and step is None else step
    if step is None:
        raise CheckpointError(f"{path} holds no finished checkpoint")
    meta = read_meta(path, step)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} step {step} is not a jaxscale checkpoint")
    cfg, tcfg = ModelConfig(**meta["model"]), TrainConfig(**meta["train"])
    abstract = jax.eval_shape(lambda: auto.init_state(cfg, tcfg))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    state, _ = restore(path, jax.tree.map(lambda _: device, abstract), abstract, meta, step)
    return cfg, state["params"]


def load_model(ckpt_dir: str | None, flag: str = "--ckpt-dir"):
    """(cfg, params): a checkpoint's (a run directory's or a checkpoint directory's; `flag`
    names the option that gave it), or a random tiny model's with a warning."""
    from jaxscale.model import state as ms

    if ckpt_dir is None:
        print(
            "jaxscale serve: warning: no --ckpt-dir; serving a random tiny model (its "
            "completions are noise). Train one with `jaxscale train --out runs/a`.",
            file=sys.stderr,
        )
        cfg = ModelConfig(max_seq=256)
        return cfg, ms.init_params(cfg, 0)
    path = Path(ckpt_dir)
    if (path / "checkpoints").is_dir():  # a `jaxscale train --run-dir` directory
        path = path / "checkpoints"
    if not path.is_dir():
        raise CheckpointError(f"{flag} {ckpt_dir}: no such directory")
    try:
        return load_params(path)
    except CheckpointError as e:  # the flag that named it, then what is wrong there
        raise CheckpointError(f"{flag} {ckpt_dir}: {e}") from None
