"""Serving hardware presets: memory, peak dense bf16 FLOP/s and HBM bandwidth per GPU.

Only the seeds' own figures are used: H100 990 TFLOPS and 3.35 TB/s (shared/seeds/001_*.txt
L1065-1067), A100 312 TFLOPS and 2 TB/s (shared/seeds/003_*.txt L17), the memory sizes of the KV
calculator's --gpu choices (shared/seeds/002_*.txt L7280-7285) and H200 141 GB (001 L237, L253).
A figure the seeds do not give is None; commands then ask for it explicitly instead of inventing it.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str  # display name, as the seeds print it
    memory_gb: float  # device memory as the seeds quote it ("80 GB")
    bf16_tflops: float | None  # dense peak, TFLOP/s; None where no seed gives it
    hbm_tb_s: float | None  # memory bandwidth, TB/s; None where no seed gives it

    @property
    def flops_per_s(self) -> float | None:
        return None if self.bf16_tflops is None else self.bf16_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float | None:
        return None if self.hbm_tb_s is None else self.hbm_tb_s * 1e12


# Keys are the names accepted on the command line (--gpu).
GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("H100 80GB", 80, 990, 3.35),
    "a100": GpuSpec("A100 80GB", 80, 312, 2.0),
    "a100-40": GpuSpec("A100 40GB", 40, 312, None),
    "4090": GpuSpec("RTX 4090 24GB", 24, None, None),
    "h200": GpuSpec("H200 141GB", 141, 990, None),
}


def get_gpu(name: str) -> GpuSpec:
    """The preset called `name` (case-insensitive); ValueError naming the valid choices."""
    key = name.strip().lower()
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; choose one of: {', '.join(GPUS)}")
    return GPUS[key]
