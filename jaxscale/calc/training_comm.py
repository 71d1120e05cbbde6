"""Communication of training parallelism: TP all-reduces, ZeRO/FSDP per stage, tp_mlp volumes.

Sources: seed 001 §7 "Communication Patterns", seed 002 ch5 "Communication Volume Comparison"
(DDP/ZeRO volume table) and ch6 "Communication Analysis" and tp_mlp.py's `analyze_communication`.
Volumes are bytes SENT PER GPU with ring algorithms over N ranks: all-reduce 2(N-1)/N * size,
all-gather and reduce-scatter (N-1)/N * size. Time = latency + bytes / bandwidth per collective (the
alpha-beta model, seed 001 §7).
"""

from dataclasses import dataclass

from jaxscale.checks import non_negative, positive, positive_ints

GB = 1e9


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth_gb_s: float  # GB/s (bytes), per GPU
    latency_us: float


# Seed 001 §7's NetworkSpecs as written: all three labelled GB/s. InfiniBand NDR and 100GbE
# are 400 and 100 Gbit/s, i.e. 50 and 12.5 GB/s, so the seed's IB and Ethernet are 8x too fast.
SEED_LINKS = {
    "nvlink": Link("NVLink", 600.0, 1.0),
    "infiniband": Link("InfiniBand", 400.0, 2.0),
    "ethernet": Link("Ethernet", 100.0, 10.0),
}
CORRECTED_LINKS = {
    "nvlink": Link("NVLink", 600.0, 1.0),
    "infiniband": Link("InfiniBand", 400.0 / 8, 2.0),
    "ethernet": Link("Ethernet", 100.0 / 8, 10.0),
}


def links(seed_faithful: bool = False) -> dict[str, Link]:
    return SEED_LINKS if seed_faithful else CORRECTED_LINKS


def collective_time_ms(message_bytes: float, link: Link) -> float:
    """latency + bytes / bandwidth, in milliseconds (seed 001 §7 `estimate_communication_time`)."""
    non_negative(message_bytes=message_bytes)
    return (link.latency_us * 1e-6 + message_bytes / (link.bandwidth_gb_s * GB)) * 1e3


def ring_allreduce_factor(n: int) -> float:
    return 2 * ring_gather_factor(n)


def ring_gather_factor(n: int) -> float:
    """all-gather or reduce-scatter."""
    positive_ints(ranks=n)
    return (n - 1) / n


@dataclass(frozen=True)
class TPLayerComm:
    """Megatron TP, one transformer layer, FORWARD: all-reduce after attention and after the MLP."""

    activation_bytes: float  # the [B, T, D] tensor each all-reduce sums
    allreduce_bytes_per_gpu: float
    allreduce_ms: float
    allreduces_per_layer: int = 2  # forward; the backward pass adds two more

    @property
    def per_layer_ms(self) -> float:
        return self.allreduces_per_layer * self.allreduce_ms

    @property
    def per_layer_bytes(self) -> float:
        return self.allreduces_per_layer * self.allreduce_bytes_per_gpu


def tp_layer_comm(
    d_model: int,
    tp: int,
    batch_size: int,
    seq_len: int,
    link: Link,
    *,
    bytes_per_value: float = 2,
    seed_faithful: bool = False,
) -> TPLayerComm:
    """Seed 001 §7 `analyze_tp_communication`. The seed moves 2x the tensor per all-reduce whatever
    the TP degree ("2(N-1)/N ~ 2"); corrected uses 2(T-1)/T (1.75 at T=8)."""
    positive_ints(tp=tp)
    positive(d_model=d_model, batch_size=batch_size, seq_len=seq_len)
    activation = batch_size * seq_len * d_model * bytes_per_value
    factor = 2.0 if seed_faithful else ring_allreduce_factor(tp)
    sent = factor * activation
    return TPLayerComm(activation, sent, collective_time_ms(sent, link))


@dataclass(frozen=True)
class ZeroStepComm:
    """Gradient/parameter traffic of one optimizer step per GPU under a ZeRO stage."""

    stage: int
    collectives: str
    bytes_per_gpu: float  # whole step
    step_ms: float
    n_layers: int

    @property
    def per_layer_ms(self) -> float:
        return self.step_ms / self.n_layers


def zero_step_comm(
    n_params: float,
    n_layers: int,
    dp: int,
    zero_stage: int,
    link: Link,
    *,
    bytes_per_param: float = 2,
    seed_faithful: bool = False,
) -> ZeroStepComm:
    """FSDP/ZeRO communication per step (seed 001 §7 `analyze_fsdp_communication`).

    Corrected (ring volumes, as in the ZeRO paper): DDP all-reduces the gradients, 2(N-1)/N * G;
    ZeRO-1/2 reduce-scatter the gradients and all-gather the updated parameters, the same 2(N-1)/N;
    ZeRO-3 per layer all-gathers the parameters for forward and again for backward and
    reduce-scatters the gradients, 3(N-1)/N * G in all (1.5x DDP).
    seed_faithful: all-reduce of 2G (stages 0/1), reduce-scatter alone for ZeRO-2 (no parameter
    all-gather, so ZeRO-2 looks 2x cheaper than ZeRO-1), one all-gather + one reduce-scatter per
    layer for ZeRO-3.
    """
    positive(n_params=n_params)
    positive_ints(n_layers=n_layers, dp=dp)
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be one of 0, 1, 2, 3, got {zero_stage!r}")
    grads = n_params * bytes_per_param
    layer = grads / n_layers
    part = ring_gather_factor(dp)
    if seed_faithful:
        if zero_stage <= 1:
            name, sizes = "all-reduce", [2 * grads]
        elif zero_stage == 2:
            name, sizes = "reduce-scatter", [part * grads]
        else:
            name, sizes = "all-gather + reduce-scatter per layer", [part * layer] * 2 * n_layers
    elif zero_stage == 0:
        name, sizes = "all-reduce", [ring_allreduce_factor(dp) * grads]
    elif zero_stage <= 2:
        name, sizes = "reduce-scatter + all-gather", [part * grads] * 2
    else:
        name, sizes = "2 all-gathers + reduce-scatter per layer", [part * layer] * 3 * n_layers
    time_ms = sum(collective_time_ms(size, link) for size in sizes)
    return ZeroStepComm(zero_stage, name, sum(sizes), time_ms, n_layers)


# Seed 002 ch5 "Communication Volume Comparison": per-GPU volume in units of the model size D,
# (forward, backward, optimizer step).
SEED_ZERO_VOLUME_D = {0: (0, 2, 0), 1: (0, 2, 1), 2: (0, 1, 1), 3: (2, 2, 1)}
# ZeRO paper (Rajbhandari et al., 2020, §7): 2Ψ for DDP, ZeRO-1 and ZeRO-2; 3Ψ for ZeRO-3.
PAPER_ZERO_VOLUME_D = {0: 2, 1: 2, 2: 2, 3: 3}


@dataclass(frozen=True)
class ZeroVolumeRow:
    stage: int
    forward_d: float
    backward_d: float
    optimizer_d: float
    paper_total_d: float

    @property
    def total_d(self) -> float:
        return self.forward_d + self.backward_d + self.optimizer_d


def zero_volume_table() -> list[ZeroVolumeRow]:
    """Seed 002's table with totals; ZeRO-3 / DDP = 5D / 2D = 2.5x (the seed's prose says 3x)."""
    return [ZeroVolumeRow(s, *SEED_ZERO_VOLUME_D[s], PAPER_ZERO_VOLUME_D[s]) for s in range(4)]


@dataclass(frozen=True)
class TPMLPComm:
    """Seed 002 ch6 tp_mlp.py `analyze_communication`: one all-reduce per MLP forward."""

    elements_per_allreduce: int  # [B, T, H]
    bytes_per_allreduce: float
    ring_bytes_per_gpu: float
    ring_bytes_total: float  # all GPUs together

    @property
    def layer_fwd_bwd_bytes_per_gpu(self) -> float:
        """4 all-reduces per layer (attention and MLP, forward and backward): 8*B*T*H*(T-1)/T
        values. The seed's table (ch6 "Communication Analysis") writes each row as 2*B*T*H/T; the
        ring volume is 2*B*T*H*(T-1)/T, which its own total line uses."""
        return 4 * self.ring_bytes_per_gpu


def tp_mlp_comm(
    hidden_size: int, batch_size: int, seq_len: int, tp: int, bytes_per_element: float = 4
) -> TPMLPComm:
    positive_ints(tp=tp)
    positive(hidden_size=hidden_size, batch_size=batch_size, seq_len=seq_len)
    elements = batch_size * seq_len * hidden_size
    size = elements * bytes_per_element
    ring = ring_allreduce_factor(tp) * size
    return TPMLPComm(elements, size, ring, ring * tp)


def mlp_params_per_gpu(hidden_size: int, tp: int = 1) -> float:
    """W1 [H, 4H/T] + W2 [4H/T, H] = 8H^2/T (seed 002 ch6 tp_mlp.py `compare_scaling`)."""
    positive_ints(tp=tp)
    positive(hidden_size=hidden_size)
    return 8 * hidden_size * hidden_size / tp
