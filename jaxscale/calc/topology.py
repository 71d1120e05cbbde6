"""GPU topology from `nvidia-smi topo -m`: parser, pair classification and the seed's advice
(seed 002 ch4 topology_inspector.py). Pure Python.

Without GPUs the seed shows a simulated DGX-A100 (8 GPUs, every pair NV12); so do we.
TPU devices have no such matrix; `jaxscale.analysis.topology_devices` lists their coordinates.
"""

import re
import shutil
import subprocess
from dataclasses import dataclass

# Legend, seed 002 ch4 "GPU Topology" and print_simulated_topology.
LEGEND = {
    "X": "self",
    "NV#": "NVLink with # links",
    "SYS": "PCIe across NUMA nodes (through the CPU interconnect; slowest)",
    "NODE": "PCIe within a NUMA node, across host bridges",
    "PHB": "PCIe through one host bridge",
    "PXB": "PCIe across several bridges, no host bridge",
    "PIX": "at most one PCIe bridge (same switch)",
}
PCIE_TOKENS = ("SYS", "NODE", "PHB", "PXB", "PIX")
NVLINK_GBps_PER_LINK = 25.0  # NVLink 2-4 link, per direction (seed 002 ch4's NVLink table)
SYS_GBps = 12.0  # "PCIe 4.0 x16 through CPU", seed 002 ch4

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE_COL = re.compile(r"^(GPU\d+|NIC\d+|mlx\S*)$")

# The seed's simulated matrix (print_simulated_topology): 8 GPUs, all pairs NV12, no affinity.
SIMULATED_DGX_A100 = "\n".join(
    ["        " + "".join(f"GPU{j:<5}" for j in range(8)).rstrip()]
    + [
        (f"GPU{i}    " + "".join(("X" if i == j else "NV12").ljust(8) for j in range(8))).rstrip()
        for i in range(8)
    ]
)

# The seed's 4-GPU sample (ch4 "GPU Topology").
SAMPLE_4_GPU_NV4 = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity
GPU0     X      NV4     NV4     NV4     0-31
GPU1    NV4      X      NV4     NV4     0-31
GPU2    NV4     NV4      X      NV4     0-31
GPU3    NV4     NV4     NV4      X      0-31"""


@dataclass(frozen=True)
class Topology:
    gpus: int
    links: dict  # (i, j) -> token, i != j, GPUs only
    cpu_affinity: dict  # GPU index -> "0-31"
    numa_affinity: dict  # GPU index -> "0"


@dataclass(frozen=True)
class TopologyReport:
    nvlink_pairs: tuple  # (i, j, token) with i < j
    pcie_pairs: tuple
    verdict: str  # "all-nvlink" | "mixed" | "no-nvlink"
    advice: tuple[str, ...]


def parse_topo_matrix(text: str) -> Topology:
    """Parse `nvidia-smi topo -m`. Columns after the device columns are the affinities."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.strip().splitlines()]
    header = next((i for i, line in enumerate(lines) if re.search(r"\bGPU0\b", line)), None)
    if header is None:
        raise ValueError("no GPU0 column header found: is this `nvidia-smi topo -m` output?")
    columns = lines[header].split()
    n_dev = next((k for k, tok in enumerate(columns) if not _DEVICE_COL.match(tok)), len(columns))
    gpu_cols = [k for k, tok in enumerate(columns[:n_dev]) if tok.startswith("GPU")]
    links, cpu, numa = {}, {}, {}
    for line in lines[header + 1 :]:
        parts = line.split()
        if not parts or parts[0].startswith("Legend"):
            break
        m = re.fullmatch(r"GPU(\d+)", parts[0])
        if not m:
            continue  # NIC rows
        i = int(m.group(1))
        cells, extra = parts[1 : 1 + n_dev], parts[1 + n_dev :]
        if len(cells) < n_dev:
            raise ValueError(f"row GPU{i} has {len(cells)} cells for {n_dev} device columns")
        for k in gpu_cols:
            j = int(columns[k][3:])
            token = cells[k]
            if token != "X" and not (re.fullmatch(r"NV\d+", token) or token in PCIE_TOKENS):
                raise ValueError(f"unknown link {token!r} between GPU{i} and GPU{j}")
            if i != j:
                links[(i, j)] = token
        if extra:
            cpu[i] = extra[0]
        if len(extra) > 1:
            numa[i] = extra[1]
    return Topology(len(gpu_cols), links, cpu, numa)


def analyze(topo: Topology) -> TopologyReport:
    """The seed's analysis (analyze_topology): NVLink pairs, PCIe-only pairs, recommendation."""
    nv = tuple(
        (i, j, t) for (i, j), t in sorted(topo.links.items()) if i < j and t.startswith("NV")
    )
    pcie = tuple(
        (i, j, t) for (i, j), t in sorted(topo.links.items()) if i < j and t in PCIE_TOKENS
    )
    n = topo.gpus
    if n > 1 and len(nv) == n * (n - 1) // 2:
        return TopologyReport(
            nv,
            pcie,
            "all-nvlink",
            (
                "All GPU pairs connected via NVLink",
                "-> Ideal for all-reduce operations",
                "-> Can use any GPU grouping (put the tensor-parallel axis anywhere)",
            ),
        )
    if nv:
        return TopologyReport(
            nv,
            pcie,
            "mixed",
            (
                "Mixed NVLink/PCIe topology",
                "-> Group NVLink-connected GPUs together when possible",
                "-> Map the fastest-communicating mesh axis (tensor) onto NVLink groups",
            ),
        )
    return TopologyReport(
        nv,
        pcie,
        "no-nvlink",
        (
            "No NVLink detected",
            "-> Performance will be limited by PCIe bandwidth",
            "-> Prefer data/pipeline parallelism; overlap or shrink communication",
        ),
    )


def link_bandwidth_GBps(token: str) -> float | None:
    """Nominal one-way bandwidth of a link token: NV# x 25 GB/s; SYS ~12 GB/s (as the seed)."""
    if re.fullmatch(r"NV\d+", token):
        return int(token[2:]) * NVLINK_GBps_PER_LINK
    return SYS_GBps if token == "SYS" else None


def simulated_dgx_a100() -> Topology:
    return parse_topo_matrix(SIMULATED_DGX_A100)


def read_nvidia_smi_topology(timeout_s: float = 10.0) -> str | None:
    """`nvidia-smi topo -m` output, or None when there is no nvidia-smi or no GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 and "GPU0" in out.stdout else None


def format_report(topo: Topology, report: TopologyReport) -> str:
    lines = [f"NVLink connections ({len(report.nvlink_pairs)} pairs):"]
    lines += [f"  GPU{i} <-> GPU{j}: {t} ({t[2:]} links)" for i, j, t in report.nvlink_pairs]
    lines += [] if report.nvlink_pairs else ["  None detected"]
    lines.append(f"PCIe-only connections ({len(report.pcie_pairs)} pairs):")
    lines += [f"  GPU{i} <-> GPU{j}: {t}" for i, j, t in report.pcie_pairs]
    lines += [] if report.pcie_pairs else ["  None (all pairs have NVLink)"]
    if topo.cpu_affinity:
        lines.append(
            "CPU affinity: " + ", ".join(f"GPU{g}: {c}" for g, c in topo.cpu_affinity.items())
        )
    lines.append("Recommendations:")
    lines += [f"  {a}" for a in report.advice]
    return "\n".join(lines)
