"""``--numa-binding``: the CPU set of each mode, from a sysfs laid out like a two-socket GPU
host (a real one is not available to the suite: CI has no GPU), and the affinity a worker
really gets from the kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from xrun.errors import UsageError
from xrun.runtime.workers.child import make_preexec
from xrun.runtime.workers.numa import NumaBinding, parse_cpulist

# 2 sockets x 1 NUMA node; node 0: cores 0-3 (+ HT siblings 8-11), node 1: cores 4-7 (+12-15);
# L3 shared per 2 cores; GPUs 0,1 on node 0, GPUs 2,3 on node 1.
BUSES = ["0000:1a:00.0", "0000:1b:00.0", "0000:8a:00.0", "0000:8b:00.0"]


def _host(tmp_path: Path) -> tuple[str, str]:
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    for i, bus in enumerate(BUSES):
        (procfs / "driver/nvidia/gpus" / bus).mkdir(parents=True)
        dev = sysfs / "bus/pci/devices" / bus
        dev.mkdir(parents=True)
        (dev / "numa_node").write_text(f"{i // 2}\n")
    for node, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15")):
        d = sysfs / f"devices/system/node/node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    for cpu in range(16):
        core = cpu % 8
        d = sysfs / f"devices/system/cpu/cpu{cpu}"
        (d / "topology").mkdir(parents=True)
        (d / "cache/index3").mkdir(parents=True)
        (d / "topology/physical_package_id").write_text(f"{core // 4}\n")
        (d / "topology/thread_siblings_list").write_text(f"{core},{core + 8}\n")
        pair = core - core % 2
        (d / "cache/index3/shared_cpu_list").write_text(
            f"{pair}-{pair + 1},{pair + 8}-{pair + 9}\n"
        )
    return str(sysfs), str(procfs)


@pytest.fixture
def all_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-2,8,10-11\n") == {0, 1, 2, 8, 10, 11}


def test_node_socket_exclusive_core_complex(tmp_path: Path, all_cpus: None) -> None:
    sysfs, procfs = _host(tmp_path)
    node = NumaBinding("node", 4, sysfs, procfs)
    assert node.cpus(0) == node.cpus(1) == {0, 1, 2, 3, 8, 9, 10, 11}
    assert node.cpus(3) == {4, 5, 6, 7, 12, 13, 14, 15}
    # one NUMA node per socket here, so socket == node (torch says the same)
    assert NumaBinding("socket", 4, sysfs, procfs).cpus(2) == node.cpus(2)
    # exclusive: node 0's four physical cores split between its two GPUs
    excl = NumaBinding("exclusive", 4, sysfs, procfs)
    assert (excl.cpus(0), excl.cpus(1)) == ({0, 1, 8, 9}, {2, 3, 10, 11})
    assert excl.cpus(3) == {6, 7, 14, 15}
    # core-complex: one L3 group each
    cc = NumaBinding("core-complex", 4, sysfs, procfs)
    assert (cc.cpus(0), cc.cpus(1)) == ({0, 1, 8, 9}, {2, 3, 10, 11})


def test_visible_devices_pick_the_gpus(tmp_path: Path, all_cpus: None, monkeypatch) -> None:
    sysfs, procfs = _host(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    b = NumaBinding("node", 2, sysfs, procfs)
    assert b.cpus(0) == {4, 5, 6, 7, 12, 13, 14, 15} and b.cpus(1) == {0, 1, 2, 3, 8, 9, 10, 11}


def test_hosts_that_cannot_bind_fail_in_one_line(tmp_path: Path, all_cpus: None) -> None:
    sysfs, procfs = _host(tmp_path)
    with pytest.raises(UsageError, match="4 NVIDIA GPU\\(s\\) for 5 workers"):
        NumaBinding("node", 5, sysfs, procfs)
    (Path(sysfs) / "bus/pci/devices" / BUSES[0] / "numa_node").write_text("-1\n")
    with pytest.raises(UsageError, match="no NUMA node for GPU"):
        NumaBinding("node", 1, sysfs, procfs)
    with pytest.raises(UsageError, match="expected one of node, socket"):
        NumaBinding("nodes", 1, sysfs, procfs)


def test_the_worker_gets_the_cpu_set_from_the_kernel() -> None:
    cpu = min(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        preexec_fn=make_preexec(os.getpid(), {cpu}),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert out == f"[{cpu}]\n"
