"""A strategy: a mesh and what each of its axes does, parsed once, and the checks that need no
model (`check`) or only the model's dimensions (`check_model`).

    Strategy.parse("manual:zero3+tp", "fsdp=4,tp=2")   ZeRO-3 over fsdp, Megatron TP over tensor
    Strategy.parse("auto", "dp=2,fsdp=2,tp=2")        jit + the rules table (GSPMD's collectives)

A mesh axis of size > 1 that nothing uses is refused with a message naming the axis and what
would use it, so a mesh never silently replicates work.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import MeshSpec, parse_mesh
from jaxscale.parallel import ep, zero

# manual strategy names: data part (ZeRO stage) and tensor part (tp mode)
_DATA = {"dp": 0, "zero0": 0, "zero1": 1, "zero2": 2, "zero3": 3}
_TENSOR = {"tp": "megatron", "tp_sp": "sequence", "tp_gather": "gather_output"}
_TENSOR_NAME = {mode: name for name, mode in _TENSOR.items()}
_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")  # manual, pipe axis (parallel/pp/)
_EXPERT = ("ep",)  # manual, expert axis (parallel/ep.py): optional, the axis has one use
# manual, context axis (parallel/cp/): the form and how the sequence's chunks are dealt
_CONTEXT = {
    "cp_ring": ("ring", "zigzag"),
    "cp_gather": ("gather", "zigzag"),
    "cp_ulysses": ("ulysses", "zigzag"),
    "cp_ring_contig": ("ring", "contiguous"),
    "cp_gather_contig": ("gather", "contiguous"),
}
_CONTEXT_NAME = {form: name for name, form in _CONTEXT.items()}


@dataclass(frozen=True)
class Strategy:
    """A mesh and what each of its axes does, parsed once: `mesh` is a MeshSpec (text such as
    "dp=2,fsdp=2,tp=2" is parsed on construction; -1 fills the remaining devices until `build`
    resolves it against the devices), the pipe axis's schedule a field of its own."""

    mesh: MeshSpec
    path: str = "auto"  # "auto": jit + the rules table; "manual": shard_map, explicit collectives
    zero: int = 0  # manual, data axes: 0 = DP, 1/2/3 = ZeRO stage
    tensor: str | None = None  # manual, tensor axis: megatron | sequence | gather_output
    schedule: str | None = None  # manual, pipe axis: gpipe | 1f1b | interleaved | zb-h1
    microbatches: int = 1  # pipeline microbatches M per data shard (the gradient accumulation)
    virtual_stages: int = 1  # v, model chunks per pipe device (interleaved)
    context: str | None = None  # manual, context axis: ring | gather | ulysses
    cp_split: str = "zigzag"  # manual, context axis: zigzag (balanced) | contiguous
    grad_buckets: int = 0  # manual DP: the layers' gradients all-reduced in N buckets (buckets.py)

    def __post_init__(self):
        if isinstance(self.mesh, str):
            try:
                object.__setattr__(self, "mesh", parse_mesh(self.mesh))
            except ValueError as e:
                raise ValueError(f"--mesh {self.mesh}: {e}") from None

    @classmethod
    def parse(
        cls, text: str, mesh: str | MeshSpec, microbatches: int = 1, virtual_stages: int = 1
    ) -> Strategy:
        """'auto', or 'manual:' + data part (dp, zero1..3), tensor part (tp, tp_sp, tp_gather),
        pipeline schedule (gpipe, 1f1b, interleaved, zb-h1) and context form (cp_ring,
        cp_gather, cp_ulysses; cp_ring_contig, cp_gather_contig: the contiguous split) joined
        by '+': 'manual:zero3+tp', 'manual:tp_sp', 'manual:dp+1f1b', 'manual:dp+cp_ring'."""
        path, _, rest = text.strip().partition(":")
        if path == "auto" and not rest:  # the pipe axis's numbers wait for `with_schedule`
            return cls(mesh, microbatches=microbatches, virtual_stages=virtual_stages)
        if path != "manual" or not rest:
            raise ValueError(
                f"--strategy: unknown strategy {text!r}; write 'auto' or 'manual:' followed by "
                f"{'/'.join(_DATA)} and/or {'/'.join(_TENSOR)}, e.g. manual:zero3+tp"
            )
        chosen = _parts(text, rest)
        zero = _DATA[chosen["data"]] if "data" in chosen else 0
        tensor = _TENSOR[chosen["tensor"]] if "tensor" in chosen else None
        schedule = chosen.get("pipeline")
        context, split = _CONTEXT.get(chosen.get("context", ""), (None, "zigzag"))
        return cls(
            mesh,
            "manual",
            zero,
            tensor,
            schedule=schedule,
            microbatches=microbatches,
            virtual_stages=virtual_stages,
            context=context,
            cp_split=split,
        )

    def with_schedule(self, schedule: str) -> Strategy:
        """This strategy with a pipeline schedule on its pipe axis. The auto path becomes the
        manual strategy its mesh implies (a schedule is a manual strategy's pipe part): Megatron
        TP on a tensor axis, ZeRO-3 on an fsdp axis (as auto shards there), DP otherwise."""
        if self.schedule and self.schedule != schedule:
            raise ValueError(
                f"--schedule {schedule} conflicts with {self.schedule} in --strategy; name the "
                "schedule once"
            )
        if schedule not in _SCHEDULES:
            raise ValueError(
                f"--schedule: unknown pipeline schedule {schedule!r}; choose from "
                f"{', '.join(_SCHEDULES)}"
            )
        if self.path != "auto":
            return replace(self, schedule=schedule)
        tensor = _TENSOR["tp"] if self.mesh.size("tensor") > 1 else None
        zero = 3 if self.mesh.size("fsdp") > 1 else 0
        return replace(self, path="manual", zero=zero, tensor=tensor, schedule=schedule)

    def name(self, spec: MeshSpec | None = None) -> str:
        """'dp_fsdp_tp' (auto: the mesh's axes), 'zero3+tp_sp' (manual: the choices)."""
        spec = self.mesh if spec is None else spec
        if self.path == "auto":
            short = {"data": "dp", "fsdp": "fsdp", "expert": "ep", "context": "cp", "tensor": "tp"}
            return "_".join(short[a] for a, n in spec.axes if n != 1 and a in short) or "single"
        parts = []
        if self.zero or spec.size("data") != 1 or spec.size("fsdp") != 1:
            parts.append(f"zero{self.zero}" if self.zero else "dp")
        if spec.size("expert") > 1:
            parts.append(_EXPERT[0])
        if self.tensor:
            parts.append(_TENSOR_NAME[self.tensor])
        if self.context:
            parts.append(_CONTEXT_NAME[(self.context, self.cp_split)])
        if self.schedule:
            v = f" v={self.virtual_stages}" if self.virtual_stages > 1 else ""
            parts.append(f"{self.schedule}(M={self.microbatches}{v})")
        buckets = f" buckets={self.grad_buckets}" if self.grad_buckets else ""
        return "+".join(parts) + buckets if parts else "single"

    def label(self) -> str:
        return f"{self.path}:{self.name()}"


def _parts(text: str, rest: str) -> dict:
    """{kind: part} of a manual strategy's '+'-joined parts; a part of an unknown name, or two
    of one kind (zero3+zero1, tp+tp_sp), is refused."""
    kinds = (
        ("data", _DATA),
        ("tensor", _TENSOR),
        ("pipeline", _SCHEDULES),
        ("experts", _EXPERT),
        ("context", _CONTEXT),
    )
    chosen: dict = {}
    for part in rest.split("+"):
        kind = next((k for k, names in kinds if part in names and part), None)
        if kind is None:
            raise ValueError(
                f"--strategy: unknown part {part!r} in {text!r}; data: "
                f"{', '.join(_DATA)}; tensor: {', '.join(_TENSOR)}; "
                f"pipeline: {', '.join(_SCHEDULES)}; experts: ep; context: "
                f"{', '.join(_CONTEXT)}"
            )
        if kind in chosen:
            raise ValueError(
                f"--strategy {text}: {chosen[kind]!r} and {part!r} are both {kind} parts; "
                "choose one"
            )
        chosen[kind] = part
    return chosen


def check_axes(strategy: Strategy, spec: MeshSpec) -> None:
    """Refuse a mesh axis nothing uses, and a choice whose axis the mesh lacks."""
    pipe = spec.size("pipe")
    if pipe > 1 and not strategy.schedule:
        raise ValueError(
            f"pp={pipe} needs a pipeline schedule: --strategy manual:dp+1f1b "
            f"(or {', '.join(_SCHEDULES)}, with --microbatches)"
        )
    if strategy.path == "auto":
        if strategy.zero or strategy.tensor or strategy.schedule or strategy.context:
            raise ValueError(
                "per-axis choices (ZeRO stage, tensor mode, pipeline schedule, context form) "
                "are manual; "
                "the auto path takes its layout from the mesh and the rules"
            )
        return
    if strategy.path != "manual":
        raise ValueError(f"unknown path {strategy.path!r}; choose 'auto' or 'manual'")
    label = f"manual:{strategy.name(spec)}"
    t = spec.size("tensor")
    if t > 1 and strategy.tensor is None:
        raise ValueError(
            f"tp={t} is unused by {label}: name a tensor mode, e.g. {label}+tp "
            "(or +tp_sp, +tp_gather)"
        )
    if t == 1 and strategy.tensor is not None:
        raise ValueError(f"{label} needs a tensor axis: add tp=N to the mesh")
    c = spec.size("context")
    if c > 1 and strategy.context is None:
        raise ValueError(
            f"cp={c} is unused by {label}: name a context form, e.g. {label}+cp_ring "
            "(or +cp_gather, +cp_ulysses)"
        )
    if c == 1 and strategy.context is not None:
        raise ValueError(f"{label} needs a context axis: add cp=N to the mesh")
    if strategy.context and strategy.tensor == "gather_output":
        raise ValueError(
            "tp_gather substitutes the attention core itself; context parallelism composes "
            "with tp or tp_sp"
        )
    if strategy.zero and spec.size("data") * spec.size("fsdp") == 1:
        raise ValueError(
            f"zero{strategy.zero} shards over the data axes, but mesh {spec} has "
            "none (add dp=N or fsdp=N)"
        )
    if strategy.zero not in zero.STAGES:
        raise ValueError(f"unknown ZeRO stage {strategy.zero}; choose from {sorted(zero.STAGES)}")
    if strategy.schedule:
        if pipe == 1:
            raise ValueError(f"{label} needs a pipe axis: add pp=N to the mesh")
        if strategy.schedule not in _SCHEDULES:
            raise ValueError(
                f"unknown pipeline schedule {strategy.schedule!r}; choose from "
                f"{', '.join(_SCHEDULES)}"
            )
        interleaved = strategy.schedule == "interleaved"
        if strategy.microbatches < 1 or strategy.virtual_stages < 1:
            raise ValueError("--microbatches and --virtual-stages must be >= 1")
        if interleaved != (strategy.virtual_stages > 1):
            raise ValueError(
                "--virtual-stages > 1 is the interleaved schedule's (and it needs at least 2)"
            )
        if interleaved and strategy.microbatches % pipe:
            raise ValueError(
                f"the interleaved schedule needs --microbatches divisible by pp={pipe}"
            )


def check(strategy: Strategy, tcfg: TrainConfig, n_devices: int) -> MeshSpec:
    """The checks that need no model: the mesh against the devices, every axis used, the batch
    split over the data shards. Returns the resolved mesh spec."""
    try:
        spec = strategy.mesh.resolve(n_devices)
        check_axes(strategy, spec)
    except ValueError as e:
        raise ValueError(f"--mesh {strategy.mesh}: {e}") from None
    data_ways = spec.size("data") * spec.size("fsdp") * spec.size("expert")
    if strategy.schedule:
        if tcfg.grad_accum != 1:
            raise ValueError(
                f"--grad-accum {tcfg.grad_accum}: under a pipeline the microbatches "
                "are the gradient accumulation; use --microbatches"
            )
        rows = tcfg.global_batch // data_ways
        if tcfg.global_batch % data_ways or rows % strategy.microbatches:
            raise ValueError(
                f"--global-batch {tcfg.global_batch} does not divide over the "
                f"{data_ways} data-parallel shards of {spec} in --microbatches "
                f"{strategy.microbatches}"
            )
        return spec
    micro = tcfg.global_batch // tcfg.grad_accum
    if tcfg.global_batch % tcfg.grad_accum or micro % data_ways:
        raise ValueError(
            f"--global-batch {tcfg.global_batch} does not divide over the "
            f"{data_ways} data-parallel shards of {spec} in --grad-accum "
            f"{tcfg.grad_accum} microbatch(es) (of {micro} sequences)"
        )
    return spec


def check_model(strategy: Strategy, cfg: ModelConfig, ways: dict) -> None:
    """The checks that need the model: experts against the expert axis and the composition."""
    if ways["expert"] > 1:
        ep.check(cfg, ways["expert"])
    if strategy.context and cfg.n_experts and cfg.moe_mode != "dropless":
        raise ValueError(
            "an MoE router's capacity slots rank a whole sequence's tokens, which context "
            "parallelism splits over its devices: with --experts use --moe-mode dropless"
        )

    if cfg.n_experts and strategy.tensor == "gather_output":
        raise ValueError(
            "tp_gather is seed 004's dense-MLP composition; an MoE model's experts "
            "split F as megatron does: use manual:tp"
        )
