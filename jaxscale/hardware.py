"""The one hardware table: peak dense bf16 FLOP/s, HBM bandwidth, memory and interconnect per
device kind. MFU (jaxscale/devices.py), the serving and RL calculators and the advisor all read it.

Pure Python (no jax), so the calculators stay instant. Figures are the vendors' datasheets for
dense (not sparse) bf16 matmuls with f32 accumulation; `link_gb_s` is one direction of one
device's fast interconnect (NVLink for the SXM GPUs, one ICI link for TPUs), None where the part
has none (a PCIe card). Where a seed quotes a rounded figure (seed 001's H100 "990 TFLOPS"), the
table keeps the datasheet's and docs/seed-notes.md says so; a calculator that reproduces a
seed's table takes the seed's figure as an explicit, named input, not from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str  # display name
    memory_gb: float  # device memory, decimal GB as vendors quote it
    bf16_tflops: float | None  # dense peak; None where unknown (never guessed)
    hbm_tb_s: float | None  # memory bandwidth, TB/s
    link_gb_s: float | None  # one direction of the device's fast interconnect, GB/s
    jax_kinds: tuple[str, ...] = ()  # jax `device_kind` strings (prefixes) that are this device

    @property
    def flops_per_s(self) -> float | None:
        return None if self.bf16_tflops is None else self.bf16_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float | None:
        return None if self.hbm_tb_s is None else self.hbm_tb_s * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def link_bytes_per_s(self) -> float | None:
        return None if self.link_gb_s is None else self.link_gb_s * 1e9


# Keys are the names accepted on the command line (--gpu / --device).
DEVICES: dict[str, Device] = {
    # NVIDIA: H100/H200 SXM 989.5 TFLOPS (1979 with sparsity), NVLink 4 900 GB/s both ways.
    "h100": Device("H100 80GB", 80, 989.5, 3.35, 450, ("NVIDIA H100",)),
    "h200": Device("H200 141GB", 141, 989.5, 4.8, 450, ("NVIDIA H200",)),
    "a100": Device("A100 80GB", 80, 312, 2.0, 300, ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB")),
    "a100-40": Device("A100 40GB", 40, 312, 1.555, 300, ("NVIDIA A100-SXM4-40GB",)),
    "4090": Device("RTX 4090 24GB", 24, 165.2, 1.008, None, ("NVIDIA GeForce RTX 4090",)),
    # TPUs, per chip (scaling-book tpus.md; v6e: Trillium's 918 TFLOPS); link = one ICI link.
    "tpu-v4": Device("TPU v4", 32, 275, 1.2, 45, ("TPU v4",)),
    "tpu-v5e": Device("TPU v5e", 16, 197, 0.81, 45, ("TPU v5 lite", "TPU v5e")),
    "tpu-v5p": Device("TPU v5p", 95, 459, 2.76, 90, ("TPU v5p", "TPU v5")),
    "tpu-v6e": Device("TPU v6e", 32, 918, 1.64, 90, ("TPU v6 lite", "TPU v6e")),
}


def get_device(name: str) -> Device:
    """The entry called `name` (case-insensitive); ValueError naming the valid choices."""
    key = name.strip().lower()
    if key not in DEVICES:
        raise ValueError(f"unknown device {name!r}; choose one of: {', '.join(DEVICES)}")
    return DEVICES[key]


def for_device_kind(device_kind: str) -> Device | None:
    """The entry for a jax `device_kind` string, or None (CPU, or a device not in the table).

    The longest matching prefix wins, so "TPU v5 lite" is a v5e and not a v5p."""
    best, best_len = None, -1
    for device in DEVICES.values():
        for kind in device.jax_kinds:
            if device_kind.startswith(kind) and len(kind) > best_len:
                best, best_len = device, len(kind)
    return best


def peak_flops(device_kind: str) -> float | None:
    """Peak dense bf16 FLOP/s of a jax device kind, or None when unknown (never guessed)."""
    device = for_device_kind(device_kind)
    return None if device is None else device.flops_per_s
