"""``--numa-binding``: bind each worker to the CPUs near the GPU of its local rank (torchrun's
``node``, ``socket``, ``exclusive`` and ``core-complex`` modes), read from sysfs without torch.

GPU ``r`` is the r-th NVIDIA device in PCI bus order (through ``$CUDA_VISIBLE_DEVICES`` when it
lists indices), as CUDA numbers them. Its NUMA node comes from ``/sys/bus/pci/devices/<bus>/
numa_node``; the node's CPUs from ``/sys/devices/system/node/node<N>/cpulist``, within the
agent's own affinity. The set is applied in the worker before exec (binaries) or before the
function's module is loaded (functions): no ``numactl`` needed, unlike torch.

Where the host cannot (no NVIDIA GPU for a rank, no NUMA information) ``NumaBinding`` raises
a ``UsageError`` naming the cause, before any worker starts: torchrun fails there too.
"""

from __future__ import annotations

import os
from typing import Any

from xrun.errors import UsageError

__all__ = ["MODES", "NumaBinding"]

MODES = ("node", "socket", "exclusive", "core-complex")


def parse_cpulist(text: str) -> set[int]:
    """``"0-3,8,10-11"`` -> {0, 1, 2, 3, 8, 10, 11}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


class NumaBinding:
    """The CPU set of each local rank for one ``mode``, computed once per launch."""

    def __init__(self, mode: str, nprocs: int, sysfs: str = "/sys", procfs: str = "/proc") -> None:
        if mode not in MODES:
            raise UsageError(
                f"--numa-binding {mode!r} is invalid: expected one of {', '.join(MODES)}"
            )
        self.mode = mode
        self._sys = sysfs
        self._proc = procfs
        self._allowed = set(os.sched_getaffinity(0))
        gpus = self._gpu_bus_ids()
        if len(gpus) < nprocs:
            raise UsageError(
                f"--numa-binding {mode} binds local rank r to the CPUs near GPU r, but this host "
                f"has {len(gpus)} NVIDIA GPU(s) for {nprocs} workers: drop --numa-binding"
            )
        self._node_of = [self._numa_node(bus) for bus in gpus]
        self._cpus = {r: self._compute(r) for r in range(nprocs)}

    @classmethod
    def from_options(cls, options: Any, nprocs: int) -> NumaBinding:
        """From torch's ``NumaOptions`` (or anything with ``affinity_mode``) or a mode name."""
        mode = getattr(options, "affinity_mode", options)
        return cls(str(getattr(mode, "value", mode)), nprocs)

    def cpus(self, local_rank: int) -> set[int]:
        return self._cpus[local_rank]

    # -- sysfs ---------------------------------------------------------------------------------

    def _read(self, *parts: str) -> str:
        with open(os.path.join(*parts)) as fp:
            return fp.read().strip()

    def _gpu_bus_ids(self) -> list[str]:
        try:
            buses = sorted(os.listdir(os.path.join(self._proc, "driver", "nvidia", "gpus")))
        except OSError:
            return []
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and all(v.strip().isdigit() for v in visible.split(",") if v):
            return [buses[int(v)] for v in visible.split(",") if v and int(v) < len(buses)]
        return buses

    def _numa_node(self, bus: str) -> int:
        try:
            node = int(self._read(self._sys, "bus", "pci", "devices", bus.lower(), "numa_node"))
        except (OSError, ValueError):
            node = -1
        if node < 0:
            raise UsageError(
                f"--numa-binding: the kernel reports no NUMA node for GPU {bus} "
                "(a single-node or virtualised host): drop --numa-binding"
            )
        return node

    def _node_cpus(self, node: int) -> set[int]:
        cpus = parse_cpulist(
            self._read(self._sys, "devices", "system", "node", f"node{node}", "cpulist")
        )
        return cpus & self._allowed

    def _cpu_topology(self, cpu: int, name: str) -> str:
        return self._read(self._sys, "devices", "system", "cpu", f"cpu{cpu}", name)

    def _compute(self, rank: int) -> set[int]:
        node = self._node_of[rank]
        cpus = self._node_cpus(node)
        if self.mode == "socket":
            socket = {self._cpu_topology(c, "topology/physical_package_id") for c in cpus}
            nodes = {n for n in set(self._node_of) | {node}}
            for entry in os.listdir(os.path.join(self._sys, "devices", "system", "node")):
                if entry.startswith("node") and entry[4:].isdigit():
                    nodes.add(int(entry[4:]))
            for n in nodes:
                other = self._node_cpus(n)
                if {self._cpu_topology(c, "topology/physical_package_id") for c in other} & socket:
                    cpus |= other
        elif self.mode in ("exclusive", "core-complex"):
            peers = sorted(r for r, n in enumerate(self._node_of) if n == node)
            key = (
                "topology/thread_siblings_list"
                if self.mode == "exclusive"
                else "cache/index3/shared_cpu_list"
            )
            groups = sorted(
                {frozenset(parse_cpulist(self._cpu_topology(c, key)) & cpus) for c in cpus}, key=min
            )
            share = len(groups) // len(peers) if self.mode == "exclusive" else 1
            if share < 1 or (self.mode == "core-complex" and len(groups) < len(peers)):
                raise UsageError(
                    f"--numa-binding {self.mode}: NUMA node {node} has {len(groups)} "
                    f"{'cores' if self.mode == 'exclusive' else 'core complexes'} for "
                    f"{len(peers)} GPUs: use --numa-binding node"
                )
            i = peers.index(rank)
            extra = len(groups) % len(peers) if self.mode == "exclusive" else 0
            start = i * share + min(i, extra)
            cpus = set().union(*groups[start : start + share + (1 if i < extra else 0)])
        if not cpus:
            raise UsageError(
                f"--numa-binding {self.mode}: no CPU of NUMA node {node} is allowed to this agent"
            )
        return cpus
