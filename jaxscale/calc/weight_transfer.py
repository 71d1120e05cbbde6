"""RLHF weight updates: how long moving trained weights to the inference engine takes.

Port of seed 002 ch14 `weight_update_demo.py` (ML Systems Infrastructure Tutorial): time = size /
bandwidth + setup (CUDA IPC: setup only, zero copy), for six methods and three architectures, and
the iteration timeline generation -> transfer -> training -> transfer.

Which methods apply (seed defect 13). The seed filters co-located (one GPU) with
`not method.works_same_gpu`, but every method says True, so it lists NCCL too, and it never filters
disaggregated-same-node, so it lists CUDA IPC, which its own table calls "Same GPU only!".
Corrected: co-located needs a method that works within one GPU (disk, CUDA IPC; NCCL refuses two
ranks on one device), same-node needs one between GPUs (disk, NCCL), cross-node one between nodes.

Transfers per iteration. The seed's timeline moves the weights twice per iteration
(calculate_rlhf_timeline; both arrows of its diagram point train -> infer). Only the trained weights
travel, once, from the trainer to the generator per iteration; the rollouts going the other way are
small. The corrected timeline counts one transfer; `transfers=2` reproduces the seed (50.00 s;
55.70 s, 10.2%).
"""

from dataclasses import dataclass

ARCHITECTURES = ("co-located", "disaggregated-same-node", "disaggregated-cross-node")
SEED_MODEL_SIZE_GB = 140.0  # 70B in FP16 (the seed's main)
SEED_GENERATION_S, SEED_TRAINING_S = 30.0, 20.0  # the timeline example (same)
SEED_TIMELINE_METHODS = ("cuda_ipc", "nccl_ib")
SEED_TRANSFERS_PER_ITERATION = 2


@dataclass(frozen=True)
class TransferMethod:
    name: str  # display name, as the seed prints it
    bandwidth_gb_s: float  # GB/s; inf for zero copy
    setup_ms: float
    across_nodes: bool  # seed's works_across_nodes
    between_gpus: bool  # source and destination on different GPUs
    within_gpu: bool  # source and destination processes on the same GPU


# The seed's methods table; between_gpus / within_gpu replace its all-True works_same_gpu.
TRANSFER_METHODS: dict[str, TransferMethod] = {
    "disk_ssd": TransferMethod("Disk (NVMe SSD)", 7.0, 100, True, True, True),
    "disk_hdd": TransferMethod("Disk (HDD/NFS)", 0.2, 500, True, True, True),
    "nccl_nvlink": TransferMethod("NCCL (NVLink)", 450, 10, False, True, False),
    "nccl_ib": TransferMethod("NCCL (InfiniBand)", 50, 50, True, True, False),
    "nccl_ethernet": TransferMethod("NCCL (Ethernet)", 12.5, 100, True, True, False),
    "cuda_ipc": TransferMethod("CUDA IPC Handle", float("inf"), 1, False, False, True),
}


def transfer_time_s(method: TransferMethod, size_gb: float) -> float:
    """size / bandwidth + setup; zero copy costs the setup only (calculate_transfer_time)."""
    if not size_gb > 0:
        raise ValueError(f"model size must be > 0 GB, got {size_gb!r}")
    if method.bandwidth_gb_s == float("inf"):
        return method.setup_ms / 1000
    return size_gb / method.bandwidth_gb_s + method.setup_ms / 1000


def applicable_methods(architecture: str, *, seed_faithful: bool = False) -> list[str]:
    """Keys of the methods that can move weights in `architecture` (seed defect 13)."""
    if architecture not in ARCHITECTURES:
        raise ValueError(
            f"unknown architecture {architecture!r}; choose: {', '.join(ARCHITECTURES)}"
        )
    if architecture == "disaggregated-cross-node":
        needs = "across_nodes"
    elif seed_faithful:
        return list(TRANSFER_METHODS)  # the seed's filters drop nothing here
    else:
        needs = "within_gpu" if architecture == "co-located" else "between_gpus"
    return [key for key, m in TRANSFER_METHODS.items() if getattr(m, needs)]


def format_duration(seconds: float) -> str:
    """The seed's units: ms below 100 ms, s below a minute, else min (compare_methods)."""
    ms = seconds * 1000
    if ms < 100:
        return f"{ms:.1f} ms"
    if ms < 60000:
        return f"{seconds:.2f} s"
    return f"{ms / 60000:.1f} min"


def rating(method: TransferMethod, seconds: float) -> str:
    """The seed's notes column (compare_methods)."""
    if method.bandwidth_gb_s == float("inf"):
        return "Zero copy!"
    for limit_s, label in ((1, "Excellent"), (10, "Good"), (60, "Acceptable")):
        if seconds < limit_s:
            return label
    return "Slow"


@dataclass(frozen=True)
class RlhfTimeline:
    method: str  # key into TRANSFER_METHODS
    size_gb: float
    generation_s: float
    training_s: float
    transfers: int  # weight transfers per iteration
    transfer_s: float  # one transfer

    @property
    def total_s(self) -> float:
        return self.generation_s + self.training_s + self.transfers * self.transfer_s

    @property
    def overhead(self) -> float:
        """Share of the iteration spent moving weights."""
        return self.transfers * self.transfer_s / self.total_s


def rlhf_timeline(
    method: str,
    size_gb: float = SEED_MODEL_SIZE_GB,
    generation_s: float = SEED_GENERATION_S,
    training_s: float = SEED_TRAINING_S,
    transfers: int = 1,
) -> RlhfTimeline:
    """One RLHF iteration with weight transfers (calculate_rlhf_timeline)."""
    if method not in TRANSFER_METHODS:
        raise ValueError(f"unknown method {method!r}; choose: {', '.join(TRANSFER_METHODS)}")
    if not generation_s >= 0 or not training_s >= 0:
        raise ValueError("generation and training times must be >= 0 s")
    if isinstance(transfers, bool) or not isinstance(transfers, int) or transfers < 0:
        raise ValueError(f"transfers must be a non-negative integer, got {transfers!r}")
    seconds = transfer_time_s(TRANSFER_METHODS[method], size_gb)
    return RlhfTimeline(method, size_gb, generation_s, training_s, transfers, seconds)


def reshard_bytes(leaves: list[tuple[int, int]], devices: int) -> int:
    """Bytes the devices receive when co-located weights go from a sharded training layout to a
    replicated generation layout on the same `devices`: each device holds 1/w of a leaf split
    w ways and needs the rest, so a leaf of b bytes costs devices x b x (1 - 1/w). `leaves` is
    [(bytes, ways)]; a layout that matches costs nothing (zero copy)."""
    if devices < 1 or any(w < 1 or devices % w for _, w in leaves):
        raise ValueError("every leaf's ways must divide the device count")
    return sum(devices * b - devices // w * b for b, w in leaves)


def cross_mesh_bytes(total_bytes: int, devices: int, ways: int = 1) -> int:
    """Bytes disaggregated generation devices receive: each of `devices` gets its whole share
    (1/ways of the weights; replicated: ways = 1) from devices that are not its own."""
    if devices < 1 or ways < 1 or devices % ways:
        raise ValueError("ways must divide the generation devices")
    return devices * total_bytes // ways
