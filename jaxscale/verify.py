"""The equivalence matrix: every strategy, auto and manual, on every meaningful mesh among (8,),
(2,4), (4,2) and (2,2,2), checked against the single-device reference.

Per case, one compiled step (returning its pre-clip gradient) gives: the first step's loss and
every gradient leaf (f32: rtol 1e-5, atol 1e-6), and a 10-step trajectory (losses and final
parameters within 1e-4). bf16-compute cases are compared with the f32 reference within a stated
band. Used by tests/test_verify.py and by `jaxscale verify`, which prints the matrix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import numpy as np

from jaxscale import strategies
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.strategies import Case
from jaxscale.train import data
from jaxscale.train import step as train_step

RTOL, ATOL = 1e-5, 1e-6  # first-step loss and gradients, f32 (DESIGN §5)
TRAJ_ATOL = 1e-4  # 10-step trajectory: losses and final parameters, f32
# bf16 compute vs the f32 reference: relative loss error, and gradient error relative to the
# largest gradient entry of the leaf (bf16 keeps ~3 significant digits).
BF16_LOSS_RTOL, BF16_GRAD_RTOL, BF16_TRAJ_ATOL = 2e-2, 2e-2, 1e-2
TRAJ_STEPS = 10

CFG = ModelConfig(n_heads=8, n_kv_heads=8)  # kv heads divide every tensor degree up to 8
TCFG = TrainConfig(steps=TRAJ_STEPS, global_batch=16, seq_len=32, warmup_steps=2, lr=1e-3)


def all_cases() -> list[Case]:
    auto = [("dp", "dp=8"), ("fsdp", "fsdp=8"), ("tp", "tp=8"),
            ("dp_tp", "dp=2,tp=4"), ("dp_tp", "dp=4,tp=2"),
            ("fsdp_tp", "fsdp=2,tp=4"), ("fsdp_tp", "fsdp=4,tp=2"),
            ("dp_fsdp", "dp=2,fsdp=4"), ("dp_fsdp", "dp=4,fsdp=2"),
            ("dp_fsdp_tp", "dp=2,fsdp=2,tp=2")]  # fmt: skip
    manual = [
        ("dp", "dp=8", 0, None), ("zero1", "dp=8", 1, None), ("zero2", "dp=8", 2, None),
        ("zero3", "fsdp=8", 3, None), ("zero3", "dp=2,fsdp=4", 3, None),
        ("zero1", "dp=4,fsdp=2", 1, None), ("zero2", "dp=2,fsdp=4", 2, None),
        ("tp", "tp=8", 0, "megatron"), ("tp_sp", "tp=8", 0, "sequence"),
        ("tp_gather", "tp=8", 0, "gather_output"),
        ("dp+tp", "dp=2,tp=4", 0, "megatron"), ("dp+tp", "dp=4,tp=2", 0, "megatron"),
        ("zero1+tp", "dp=4,tp=2", 1, "megatron"), ("zero2+tp", "dp=2,tp=4", 2, "megatron"),
        ("zero3+tp", "fsdp=4,tp=2", 3, "megatron"), ("zero3+tp", "fsdp=2,tp=4", 3, "megatron"),
        ("zero3+tp_sp", "dp=2,fsdp=2,tp=2", 3, "sequence"),
    ]  # fmt: skip
    cases = [Case("auto", s, m) for s, m in auto]
    cases += [Case("manual", s, m, stage, tp) for s, m, stage, tp in manual]
    cases += [Case("auto", "dp_fsdp_tp", "dp=2,fsdp=2,tp=2", compute_dtype="bfloat16"),
              Case("manual", "zero3+tp", "fsdp=4,tp=2", 3, "megatron", "bfloat16")]  # fmt: skip
    return cases


@dataclass
class Result:
    case: Case
    loss_err: float = float("nan")
    grad_ratio: float = float("nan")  # worst |dg| / tolerance over all leaves; <= 1 passes
    traj_loss_err: float = float("nan")
    traj_param_err: float = float("nan")
    error: str | None = None

    @property
    def passed(self) -> bool:
        if self.error:
            return False
        bf16 = self.case.compute_dtype != "float32"
        traj = BF16_TRAJ_ATOL if bf16 else TRAJ_ATOL
        return self.grad_ratio <= 1.0 and max(self.traj_loss_err, self.traj_param_err) <= traj


@dataclass(frozen=True)
class Reference:
    loss: float
    grads: dict
    losses: np.ndarray
    params: dict


def batches(tcfg: TrainConfig = TCFG) -> list[np.ndarray]:
    task = data.MarkovData()
    return [task.rows(tcfg.seed, s, range(tcfg.global_batch), tcfg.seq_len)
            for s in range(TRAJ_STEPS)]  # fmt: skip


def reference(cfg: ModelConfig = CFG, tcfg: TrainConfig = TCFG) -> Reference:
    """The oracle: the unsharded step on one device."""
    state = train_step.init_state(cfg, tcfg)
    step = train_step.jit_train_step(cfg, tcfg, None, with_grads=True)
    losses, grads0 = [], None
    for batch in batches(tcfg):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
        grads0 = jax.device_get(metrics["grads"]) if grads0 is None else grads0
    return Reference(losses[0], grads0, np.asarray(losses), jax.device_get(state["params"]))


def check(case: Case, ref: Reference, cfg: ModelConfig = CFG, tcfg: TrainConfig = TCFG) -> Result:
    result = Result(case)
    try:
        built = strategies.build(case, cfg, tcfg, with_grads=True)
        with jax.set_mesh(built.mesh):
            state, losses, grads0 = built.init(), [], None
            for batch in batches(tcfg):
                state, metrics = built.step(state, built.put(batch))
                losses.append(float(metrics["loss"]))
                grads0 = jax.device_get(metrics["grads"]) if grads0 is None else grads0
            params = jax.device_get(state["params"])
    except ValueError as e:  # a layout that cannot be built on this mesh
        result.error = str(e).splitlines()[0]
        return result
    bf16 = case.compute_dtype != "float32"
    result.loss_err = abs(losses[0] - ref.loss)
    result.grad_ratio = max(
        _ratio(g, r, bf16) for g, r in zip(jax.tree.leaves(grads0), jax.tree.leaves(ref.grads),
                                           strict=True)
    )  # fmt: skip
    if bf16:  # the loss band joins the gradient band in one ratio
        result.grad_ratio = max(result.grad_ratio, result.loss_err / (BF16_LOSS_RTOL * ref.loss))
    result.traj_loss_err = float(np.max(np.abs(np.asarray(losses) - ref.losses)))
    result.traj_param_err = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref.params), strict=True)
    )
    return result


def _ratio(g, r, bf16: bool) -> float:
    g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
    if bf16:
        tol = BF16_GRAD_RTOL * max(float(np.max(np.abs(r))), 1e-12)
        return float(np.max(np.abs(g - r)) / tol)
    return float(np.max(np.abs(g - r) / (ATOL + RTOL * np.abs(r))))


def format_matrix(results: list[Result]) -> str:
    head = (f"{'case':<26} {'mesh':<17} {'|dloss|':>9} {'grad/tol':>9} {'traj dloss':>10} "
            f"{'traj dparam':>11}  ok")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in results:
        if r.error:
            lines.append(f"{r.case.label:<26} {r.case.mesh:<17} ✗ {r.error}")
            continue
        lines.append(
            f"{r.case.label:<26} {r.case.mesh:<17} {r.loss_err:9.1e} {r.grad_ratio:9.2f} "
            f"{r.traj_loss_err:10.1e} {r.traj_param_err:11.1e}  {'✓' if r.passed else '✗'}"
        )
    lines += _grid(results)
    lines += ["", f"f32: gradients pass at grad/tol <= 1 with rtol {RTOL:g}, atol {ATOL:g}; "
              f"{TRAJ_STEPS}-step trajectory within {TRAJ_ATOL:g}.",
              f"bf16 compute vs the f32 reference: loss within {BF16_LOSS_RTOL:.0%}, gradients "
              f"within {BF16_GRAD_RTOL:.0%} of each leaf's largest entry, trajectory "
              f"{BF16_TRAJ_ATOL:g}."]  # fmt: skip
    return "\n".join(lines)


def _grid(results: list[Result]) -> list[str]:
    shapes = {"(8,)": 1, "(2,4)": (2, 4), "(4,2)": (4, 2), "(2,2,2)": 3}
    rows: dict[str, dict[str, str]] = {}
    for r in results:
        sizes = tuple(int(p.split("=")[1]) for p in r.case.mesh.split(","))
        shape = "(8,)" if len(sizes) == 1 else str(sizes).replace(" ", "")
        rows.setdefault(r.case.label, {})[shape] = "✓" if r.passed else "✗"
    lines = ["", f"{'strategy':<26} " + " ".join(f"{s:>8}" for s in shapes)]
    for label, cells in rows.items():
        lines.append(f"{label:<26} " + " ".join(f"{cells.get(s, '·'):>8}" for s in shapes))
    return lines


def run(cases: list[Case], progress=None, cfg: ModelConfig = CFG, tcfg: TrainConfig = TCFG):
    ref = reference(cfg, tcfg)
    out = []
    for case in cases:
        out.append(check(case, ref, cfg, tcfg))
        if progress:
            progress.update(1, note=f"{case.label} {case.mesh}")
    return out


def as_json(results: list[Result]) -> list[dict]:
    return [{**dataclasses.asdict(r.case), **{k: getattr(r, k) for k in
             ("loss_err", "grad_ratio", "traj_loss_err", "traj_param_err", "error", "passed")}}
            for r in results]  # fmt: skip
