"""The training loop: any strategy, one compiled step, JSON-lines metrics, eval, checkpoints.

`prepare` checks everything that can be checked before anything compiles (mesh, strategy,
batch, data, checkpoint directory, output paths, sampling) and says what the run will do;
`train` runs it. Metrics of step s are read on the host after step s+1 has been dispatched, so
the host never stalls the device queue waiting for a loss value. Ctrl-C or SIGTERM stops the
run after the current step (said at once), saves a checkpoint (with a checkpoint directory) and
raises `Interrupted`; the command line exits 130. A second Ctrl-C exits 130 at once, saving
nothing.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale import scalars
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.parallel.compose import Built, Strategy, build
from jaxscale.profiling import ProfileWindow, compiled_text
from jaxscale.progress import Progress
from jaxscale.serve import generate
from jaxscale.stopping import stop_on_signal
from jaxscale.train import checkpoint, data
from jaxscale.train.metrics import MetricsLog


class NonFiniteLoss(RuntimeError):
    """Training produced a NaN or infinite loss; the message names the step."""


class Interrupted(RuntimeError):
    """Ctrl-C or SIGTERM: the run stopped after a step (and saved it, with a checkpoint dir)."""


@dataclass
class TrainResult:
    history: list[dict] = field(default_factory=list)  # one record per logged step
    evals: list[dict] = field(default_factory=list)  # {"step", "eval_loss"}
    sample: str = ""
    state: dict | None = None
    resumed_from: int | None = None
    optimal_loss: float | None = None  # the data's known floor (markov, copy), if it has one
    profile: dict | None = None  # the profiled window's time split (profiling.report)


@dataclass(frozen=True)
class RunSetup:
    """What a run needs besides its configs: where it runs and where it writes."""

    mesh: str = "dp=-1"
    strategy: str = "auto"  # "auto" or "manual:<data>+<tensor>" (jaxscale/parallel/compose.py)
    schedule: str | None = None  # pipeline schedule over the pp axis (manual strategies)
    microbatches: int | None = None  # pipeline microbatches per data shard (default: P)
    virtual_stages: int | None = None  # interleaved: model chunks per device (default 2)
    dataset: str | None = None  # 'stdlib' (default), 'markov', 'copy', or a text file
    ckpt_dir: str | None = None
    resume: bool = False
    metrics_path: str | None = None
    prompt: str = "def "
    sample_tokens: int = 48
    progress: bool = True
    stop_after: int | None = None  # stop at this step (an interruption; the schedule is unchanged)
    keep_checkpoints: int = checkpoint.KEEP  # the newest kept; older ones are deleted
    grad_buckets: int = 0  # manual DP: the layers' gradient all-reduce in N buckets
    profile_dir: str | None = None  # a trace of profile_steps steps after the first (compile)
    profile_steps: int = 3
    tensorboard: str | None = None  # TensorBoard scalars of the metrics, written here


@dataclass
class Plan:
    """A checked run: what will be built, trained and written."""

    built: Built
    dataset: object
    start: int  # the step training starts from (a checkpoint's, or 0)
    end: int
    notes: list[str]  # what the run will do, in words (resume, fallbacks)


def prepare(cfg: ModelConfig, tcfg: TrainConfig, setup: RunSetup) -> Plan:
    """Every check that needs no compile; raises ValueError or CheckpointError naming the input."""
    strategy = Strategy.parse(
        setup.strategy, setup.mesh, setup.microbatches or 1, setup.virtual_stages or 1
    )
    if setup.schedule:  # a pipeline schedule is a manual strategy's pipe part
        strategy = strategy.with_schedule(setup.schedule)
    if setup.grad_buckets:
        strategy = replace(strategy, grad_buckets=setup.grad_buckets)
    try:
        spec = strategy.mesh.resolve(jax.device_count())
    except ValueError as e:
        raise ValueError(f"--mesh {setup.mesh}: {e}") from None
    if strategy.schedule:  # working defaults: the pipe full (M = P), two chunks if interleaved
        m = setup.microbatches or spec.size("pipe")
        v = setup.virtual_stages or (2 if strategy.schedule == "interleaved" else 1)
        strategy = replace(strategy, microbatches=m, virtual_stages=v)
    if tcfg.seq_len > cfg.max_seq:
        raise ValueError(f"--seq-len {tcfg.seq_len} exceeds the model's --max-seq {cfg.max_seq}")
    if setup.keep_checkpoints < 1:
        raise ValueError(f"--keep-checkpoints must be >= 1, got {setup.keep_checkpoints}")
    if setup.stop_after is not None and setup.stop_after < 1:
        raise ValueError(f"--stop-after must be >= 1, got {setup.stop_after}")
    dataset = data.make_dataset(setup.dataset)
    data.check(dataset, tcfg.seq_len, cfg.vocab)
    if setup.sample_tokens < 0:
        raise ValueError(f"--sample-tokens must be >= 0, got {setup.sample_tokens}")
    if setup.sample_tokens and isinstance(dataset, data.TextData):
        n_prompt = len(data.ByteTokenizer().encode(setup.prompt))
        if not 0 < n_prompt < cfg.max_seq:
            raise ValueError(
                f"--prompt must be 1 to {cfg.max_seq - 1} bytes (the model's "
                f"max_seq), got {n_prompt}"
            )
    built = build(strategy, cfg, tcfg)
    end = tcfg.steps if setup.stop_after is None else min(setup.stop_after, tcfg.steps)
    start, notes = _resume_point(setup, end)
    if setup.schedule and setup.strategy.strip() == "auto":
        notes.insert(0, f"--schedule {setup.schedule}: {built.label}, the parts the mesh implies")
    if setup.sample_tokens and isinstance(dataset, data.TextData):
        room = cfg.max_seq - len(data.ByteTokenizer().encode(setup.prompt))
        if setup.sample_tokens > room:
            notes.append(
                f"--sample-tokens {setup.sample_tokens}: the sample stops at {room} tokens "
                f"(the prompt's and the sample's together fill max_seq={cfg.max_seq})"
            )
    if setup.tensorboard:
        scalars.check_available()
    if setup.profile_dir:
        if setup.profile_steps < 1:
            raise ValueError(f"--profile-steps must be >= 1, got {setup.profile_steps}")
        if end - start < 2:
            raise ValueError(
                f"--profile needs at least 2 steps to train (the first compiles and is not "
                f"profiled); this run trains {max(end - start, 0)}"
            )
        n = min(setup.profile_steps, end - start - 1)
        notes.append(
            f"--profile {setup.profile_dir}: a trace of steps {start + 1}..{start + n} "
            "(after the first, which compiles)"
        )
    if start:  # the checkpoint's model must be this one: refused now, before anything is written
        meta = checkpoint.meta_record(cfg, tcfg, str(built.strategy.mesh), built.label)
        checkpoint.check_meta(
            checkpoint.read_meta(setup.ckpt_dir, start), meta, Path(setup.ckpt_dir), start
        )
    return Plan(built, dataset, start, end, notes)


def _resume_point(setup: RunSetup, end: int) -> tuple[int, list[str]]:
    if setup.resume and not setup.ckpt_dir:
        raise ValueError("--resume needs a checkpoint directory (--ckpt-dir or --out)")
    if not setup.ckpt_dir:
        return 0, []
    complete, stray = checkpoint.steps(setup.ckpt_dir)
    notes = [
        f"ignoring incomplete checkpoint {setup.ckpt_dir}/{s} (no completion mark)" for s in stray
    ]
    if not setup.resume:
        if complete:
            raise ValueError(
                f"--ckpt-dir {setup.ckpt_dir} already holds checkpoints (up to step "
                f"{complete[-1]}); pass --resume to continue that run, or choose "
                "another directory"
            )
        return 0, notes
    if not complete:
        return 0, [*notes, f"--resume: no checkpoint in {setup.ckpt_dir} yet; starting at step 0"]
    last = complete[-1]
    if last >= end:
        return last, [
            *notes,
            f"resuming from step {last}: the run is already complete "
            f"(ends at {end}); evaluating the checkpoint",
        ]
    return last, [*notes, f"resuming from step {last} ({setup.ckpt_dir}/{last})"]


def train(
    cfg: ModelConfig,
    tcfg: TrainConfig,
    setup: RunSetup,
    plan: Plan | None = None,
    say=lambda line: None,
) -> TrainResult:
    """Run `plan` (prepared here, its notes passed to `say`, when not given)."""
    if plan is None:
        plan = prepare(cfg, tcfg, setup)
        for note in plan.notes:
            say(note)
    built, dataset = plan.built, plan.dataset
    result = TrainResult(optimal_loss=data.optimal_loss(dataset, tcfg.seq_len))
    meta = checkpoint.meta_record(cfg, tcfg, str(built.strategy.mesh), built.label)
    log = MetricsLog(
        setup.metrics_path, cfg, tcfg, built, last_step=plan.end - 1, tensorboard=setup.tensorboard
    )
    with jax.set_mesh(built.mesh), log, stop_on_signal(STOP_NOTE, ABORT_NOTE) as stop:
        state = _initial_state(built, setup, meta, plan, result)
        start = int(jax.device_get(state["step"]))
        log.start(start, resumed=result.resumed_from is not None)
        bar = Progress(
            max(plan.end - start, 0),
            desc=f"train {built.label} {built.strategy.mesh}",
            enabled=setup.progress,
        )
        # without the bar, each logged step is a line (the bar shows the loss otherwise)
        lines = (lambda line: None) if setup.progress else say
        record = partial(_record, log=log, result=result, bar=bar, say=lines)
        pending = None  # (step, metrics) of the last dispatched step, read one step late
        window = _profile_window(setup, start, plan.end)
        try:
            for s in range(start, plan.end):
                window.before(s, state)
                batch = data.global_batch(
                    dataset, built.batch_sharding, tcfg.seed, s, tcfg.global_batch, tcfg.seq_len
                )
                terms = None
                if cfg.n_experts and built.terms is not None and log.logs(s):
                    # the routing terms of this step's params and batch, read before the step
                    # donates the state (one forward more on a logged step)
                    terms = routing_metrics(built.terms(state["params"], batch))
                with jax.profiler.StepTraceAnnotation("train", step_num=s):
                    state, metrics = built.step(state, batch)
                text = partial(compiled_text, built.step, state, batch)
                result.profile = window.after(s, state, text) or result.profile
                if terms is not None:
                    metrics = {**metrics, **terms}
                if pending is not None:
                    record(pending)
                pending = (s, metrics)
                if tcfg.eval_every and (s + 1) % tcfg.eval_every == 0:
                    record(pending)  # first, so the file stays in step order
                    pending = None
                    _evaluate(built, state, dataset, tcfg, s + 1, result, log)
                if setup.ckpt_dir and tcfg.ckpt_every and (s + 1) % tcfg.ckpt_every == 0:
                    if pending is not None:  # its gradient norm checked before saving
                        record(pending)
                        pending = None
                    _save(setup, state, meta)
                if _stop_everywhere(stop):
                    break
            if pending is not None:
                record(pending)
        finally:
            bar.close()
            result.profile = window.stop() or result.profile  # stopped inside the window
        done = int(jax.device_get(state["step"]))
        if stop.is_set():
            saved = _save(setup, state, meta) if setup.ckpt_dir else None
            where = f"; checkpoint saved at {setup.ckpt_dir}/{saved}" if saved else ""
            raise Interrupted(f"interrupted after step {done}{where}")
        if not result.evals or result.evals[-1]["step"] != done:
            _evaluate(built, state, dataset, tcfg, done, result, log)
        if setup.ckpt_dir:
            _save(setup, state, meta)
    if setup.sample_tokens and isinstance(dataset, data.TextData):
        tok = data.ByteTokenizer()
        prompt = [int(t) for t in tok.encode(setup.prompt)]
        room = min(setup.sample_tokens, cfg.max_seq - len(prompt))
        if not prompt or room <= 0:
            raise ValueError(
                f"prompt of {len(prompt)} tokens leaves no room below max_seq={cfg.max_seq}"
            )
        # greedy, with the KV cache: the one static-batch generate serving and RLHF use
        ids = generate.generate(state["params"], [prompt], cfg, room).row(0)
        result.sample = setup.prompt + tok.decode(ids)
    result.state = state
    return result


STOP_NOTE = "stopping after this step (and saving it); Ctrl-C again to abort without saving"
ABORT_NOTE = "aborted: nothing saved since the last checkpoint"


def _profile_window(setup: RunSetup, start: int, end: int) -> ProfileWindow:
    """The steps after the first this run trains (which compiles), at most profile_steps."""
    steps = min(setup.profile_steps, end - start - 1)
    return ProfileWindow(setup.profile_dir if steps > 0 else None, start + 1, max(steps, 1))


def _stop_everywhere(stop: threading.Event) -> bool:
    """Whether to stop after this step. With several processes (`jaxscale launch`) they decide
    together (one host all-gather of a flag per step): a signal reaches them at different
    moments, and a process that saved while another ran one more step would wait for it in the
    save while the other waits in the step's collectives."""
    if jax.process_count() == 1:
        return stop.is_set()
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.int32(stop.is_set()))
    if np.any(flags):
        stop.set()
    return bool(np.any(flags))


def _initial_state(built: Built, setup: RunSetup, meta, plan: Plan, result: TrainResult):
    """Fresh, or restored into this strategy's layout (whatever strategy and mesh saved it)."""
    if plan.start == 0:
        return built.init()
    state, _ = checkpoint.restore(
        setup.ckpt_dir, built.state_shardings, built.abstract_state, meta, step=plan.start
    )
    result.resumed_from = plan.start
    return state


def routing_metrics(terms: dict) -> dict:
    """An MoE step's loss terms as metrics: ce, aux_loss, z_loss, drop_fraction, the load of
    every expert [MoE layer][expert] (share of assignments) and its worst max/mean."""
    load = terms["expert_load"]
    n_experts = load.shape[-1]
    return {
        **{k: v for k, v in terms.items() if k != "expert_load"},
        "expert_load": load,
        "load_max_over_mean": n_experts * load.max(),
    }


def _record(pending, log: MetricsLog, result: TrainResult, bar: Progress, say) -> None:
    s, metrics = pending
    values = {
        k: float(v) if np.ndim(v) == 0 else np.round(np.asarray(v, np.float64), 5).tolist()
        for k, v in jax.device_get(metrics).items()
    }
    for key in ("loss", "grad_norm"):  # a non-finite gradient makes the next params NaN
        if key in values and not math.isfinite(values[key]):
            raise NonFiniteLoss(
                f"non-finite {key.replace('_', ' ')} ({values[key]}) at step {s}; stopping "
                f"(nothing saved). {_ADVICE}"
            )
    record = log.train(s, values)
    if record is not None:
        result.history.append(record)
        say(f"step {s:5d}  loss {values['loss']:.4f}")
    bar.update(1, note=f"loss {values['loss']:.4f}")


_ADVICE = "Lower --lr, enable --grad-clip, or use float32 compute."


def _save(setup: RunSetup, state, meta):
    """Save `state` unless a parameter or optimizer value is non-finite (a NaN checkpoint would
    be resumed from, or served)."""
    if not bool(_all_finite(state)):
        step = int(jax.device_get(state["step"]))
        raise NonFiniteLoss(f"non-finite parameters after step {step}; not saved. {_ADVICE}")
    return checkpoint.save(setup.ckpt_dir, state, meta, keep=setup.keep_checkpoints)


@jax.jit
def _all_finite(state):
    leaves = jax.tree.leaves({k: v for k, v in state.items() if k != "step"})
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves if _inexact(x)]))


def _inexact(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _evaluate(built: Built, state, dataset, tcfg: TrainConfig, step: int, result, log) -> None:
    losses = [
        float(
            built.loss(
                state["params"],
                data.global_batch(
                    dataset, built.batch_sharding, tcfg.seed, s, tcfg.global_batch, tcfg.seq_len
                ),
            )
        )
        for s in data.eval_steps(tcfg.eval_batches)
    ]
    loss = float(np.mean(losses))
    result.evals.append(log.eval(step, loss, result.optimal_loss))
    if not math.isfinite(loss):
        raise NonFiniteLoss(f"non-finite eval loss ({loss}) at step {step}; stopping. {_ADVICE}")
