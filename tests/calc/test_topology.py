"""nvidia-smi topology parser and the seed's recommendations (seed 002 ch4 topology_inspector.py),
plus jax's device coordinates (TPU torus) from jaxscale.analysis.topology_devices."""

import subprocess
import sys

import jax
import pytest

from jaxscale.analysis import topology_devices as td
from jaxscale.calc import topology as topo

# A real-looking layout: two NVLink pairs, NICs, NUMA columns, ANSI bold on the header row.
MIXED = """\
\x1b[4m\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tNV2\tSYS\tSYS\tPIX\tSYS\t0-15\t0\t\tN/A
GPU1\tNV2\t X \tSYS\tSYS\tPIX\tSYS\t0-15\t0\t\tN/A
GPU2\tSYS\tSYS\t X \tNV2\tSYS\tPIX\t16-31\t1\t\tN/A
GPU3\tSYS\tSYS\tNV2\t X \tSYS\tPIX\t16-31\t1\t\tN/A
NIC0\tPIX\tPIX\tSYS\tSYS\t X \tSYS
NIC1\tSYS\tSYS\tPIX\tPIX\tSYS\t X

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
"""


def test_seed_four_gpu_sample():
    t = topo.parse_topo_matrix(topo.SAMPLE_4_GPU_NV4)
    r = topo.analyze(t)
    assert t.gpus == 4 and set(t.links.values()) == {"NV4"}
    assert len(r.nvlink_pairs) == 6 and r.verdict == "all-nvlink"
    assert t.cpu_affinity == {g: "0-31" for g in range(4)}


def test_simulated_dgx_a100_has_all_28_pairs_on_nvlink():
    t = topo.simulated_dgx_a100()
    r = topo.analyze(t)
    assert len(r.nvlink_pairs) == 8 * 7 // 2 == 28  # seed 002 ch4: n(n-1)/2
    assert r.pcie_pairs == () and r.verdict == "all-nvlink"
    assert all(tok == "NV12" for _, _, tok in r.nvlink_pairs)
    assert "All GPU pairs connected via NVLink" in topo.format_report(t, r)


def test_mixed_topology_with_nics_and_numa():
    t = topo.parse_topo_matrix(MIXED)
    r = topo.analyze(t)
    assert t.gpus == 4
    assert [(i, j) for i, j, _ in r.nvlink_pairs] == [(0, 1), (2, 3)]
    assert len(r.pcie_pairs) == 4 and {tok for *_, tok in r.pcie_pairs} == {"SYS"}
    assert r.verdict == "mixed"
    assert t.cpu_affinity[2] == "16-31" and t.numa_affinity[3] == "1"


def test_no_nvlink_verdict():
    text = "\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n"
    r = topo.analyze(topo.parse_topo_matrix(text))
    assert r.verdict == "no-nvlink" and r.nvlink_pairs == ()
    assert "PCIe" in r.advice[1]


def test_link_bandwidths_give_the_seed_ratio():
    assert topo.link_bandwidth_GBps("NV12") == 300.0
    assert topo.link_bandwidth_GBps("NV12") / topo.link_bandwidth_GBps("SYS") == 25.0  # as the seed
    assert topo.link_bandwidth_GBps("PIX") is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("Tue Jan 1\nno matrix here", "GPU0"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNVX\t X \n", "unknown link"),
        ("\tGPU0\tGPU1\nGPU0\t X \n", "cells"),
    ],
)
def test_bad_topology_text(text, message):
    with pytest.raises(ValueError, match=message):
        topo.parse_topo_matrix(text)


def test_importing_topology_does_not_import_jax():
    code = "import sys, jaxscale.calc.topology; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_device_rows_on_cpu_have_no_coordinates():
    rows = td.device_rows()
    assert len(rows) == jax.device_count()
    assert all(r.coords is None for r in rows) and td.torus_shape(rows) is None
    assert "no device coordinates" in td.format_devices(rows)


def test_torus_extent_from_tpu_like_coordinates():
    rows = [td.DeviceRow(i, 0, "tpu", "TPU v5 lite", (i % 2, i // 2, 0), 0) for i in range(8)]
    assert td.torus_shape(rows) == (2, 4, 1)
    assert "torus extent: 2x4x1" in td.format_devices(rows)
