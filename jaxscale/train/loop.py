"""The training loop: sharded state, one compiled step, JSON-lines metrics, eval, checkpoints.

Metrics of step s are read on the host after step s+1 has been dispatched, so the host never
stalls the device queue waiting for a loss value (a loss read blocks until it is computed).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

import jax
import numpy as np

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import parse_mesh
from jaxscale.parallel.compose import Built, Strategy, build
from jaxscale.progress import Progress
from jaxscale.train import checkpoint, data
from jaxscale.train import step as train_step


class NonFiniteLoss(RuntimeError):
    """Training produced a NaN or infinite loss; the message names the step."""


@dataclass
class TrainResult:
    history: list[dict] = field(default_factory=list)  # one record per logged step
    evals: list[dict] = field(default_factory=list)  # {"step", "eval_loss"}
    sample: str = ""
    state: dict | None = None
    resumed_from: int | None = None


@dataclass(frozen=True)
class RunSetup:
    """What a run needs besides its configs: where it runs and where it writes."""

    mesh: str = "dp=-1"
    strategy: str = "auto"  # "auto" or "manual:<data>+<tensor>" (jaxscale/parallel/compose.py)
    dataset: str | None = None  # 'stdlib' (default), 'markov', or a text file
    ckpt_dir: str | None = None
    resume: bool = False
    metrics_path: str | None = None
    prompt: str = "def "
    sample_tokens: int = 48
    progress: bool = True
    stop_after: int | None = None  # stop at this step (an interruption; the schedule is unchanged)


def train(cfg: ModelConfig, tcfg: TrainConfig, setup: RunSetup) -> TrainResult:
    spec = parse_mesh(setup.mesh).resolve(jax.device_count())
    if tcfg.seq_len > cfg.max_seq:
        raise ValueError(f"seq_len {tcfg.seq_len} exceeds the model's max_seq {cfg.max_seq}")
    # any strategy the composer builds: refuses unused axes and batches that do not divide
    built = build(Strategy.parse(setup.strategy, str(spec)), cfg, tcfg)
    dataset = data.make_dataset(setup.dataset)
    result = TrainResult()
    meta = checkpoint.meta_record(cfg, tcfg, str(spec))
    with jax.set_mesh(built.mesh):
        state = _initial_state(built, setup, meta, result)
        step_fn, eval_fn, batch_sh = built.step, built.loss, built.batch_sharding
        tokens = data.tokens_per_step(tcfg.global_batch, tcfg.seq_len)
        log = open(setup.metrics_path, "a") if setup.metrics_path else None  # noqa: SIM115
        start = int(jax.device_get(state["step"]))
        end = tcfg.steps if setup.stop_after is None else min(setup.stop_after, tcfg.steps)
        bar = Progress(end - start, desc=f"train {built.label} {spec}", enabled=setup.progress)
        pending = None  # (step, metrics, t_dispatch) read one step late
        t_prev = time.perf_counter()
        try:
            for s in range(start, end):
                batch = data.global_batch(
                    dataset, batch_sh, tcfg.seed, s, tcfg.global_batch, tcfg.seq_len
                )
                state, metrics = step_fn(state, batch)
                if pending is not None:
                    t_prev = _record(pending, t_prev, tokens, result, log, bar)
                pending = (s, metrics)
                if tcfg.eval_every and (s + 1) % tcfg.eval_every == 0:
                    _evaluate(eval_fn, state, dataset, batch_sh, tcfg, s + 1, result, log)
                if setup.ckpt_dir and tcfg.ckpt_every and (s + 1) % tcfg.ckpt_every == 0:
                    checkpoint.save(setup.ckpt_dir, state, meta)
            if pending is not None:
                _record(pending, t_prev, tokens, result, log, bar)
        finally:
            bar.close()
            if log:
                log.close()
        if not result.evals or result.evals[-1]["step"] != end:
            _evaluate(eval_fn, state, dataset, batch_sh, tcfg, end, result, None)
        if setup.ckpt_dir:
            checkpoint.save(setup.ckpt_dir, state, meta)
    if setup.sample_tokens and isinstance(dataset, data.TextData):
        tok = data.ByteTokenizer()
        ids = train_step.greedy_sample(
            cfg, state["params"], tok.encode(setup.prompt), setup.sample_tokens
        )
        result.sample = setup.prompt + tok.decode(ids)
    result.state = state
    return result


def _initial_state(built: Built, setup: RunSetup, meta, result: TrainResult):
    """Fresh, or restored into this strategy's layout (whatever strategy and mesh saved it)."""
    if setup.resume and setup.ckpt_dir and checkpoint.latest_step(setup.ckpt_dir) is not None:
        state, _ = checkpoint.restore(setup.ckpt_dir, built.state_shardings, built.abstract_state,
                                      meta)  # fmt: skip
        result.resumed_from = int(jax.device_get(state["step"]))
        return state
    return built.init()


def _record(pending, t_prev, tokens, result: TrainResult, log, bar: Progress) -> float:
    s, metrics = pending
    values = {k: float(v) for k, v in jax.device_get(metrics).items()}
    now = time.perf_counter()
    if not math.isfinite(values["loss"]):
        raise NonFiniteLoss(
            f"non-finite loss ({values['loss']}) at step {s}; stopping. Lower --lr, enable "
            f"--grad-clip, or use float32 compute."
        )
    record = {"step": s, **values, "tokens_per_s": tokens / max(now - t_prev, 1e-9)}
    result.history.append(record)
    if log:
        log.write(json.dumps(record) + "\n")
    bar.update(1, note=f"loss {values['loss']:.4f}")
    return now


def _evaluate(eval_fn, state, dataset, batch_sh, tcfg: TrainConfig, step: int, result, log):
    losses = [
        float(eval_fn(state["params"], data.global_batch(
            dataset, batch_sh, tcfg.seed, s, tcfg.global_batch, tcfg.seq_len)))
        for s in data.eval_steps(tcfg.eval_batches)
    ]  # fmt: skip
    record = {"step": step, "eval_loss": float(np.mean(losses))}
    result.evals.append(record)
    if log:
        log.write(json.dumps(record) + "\n")
