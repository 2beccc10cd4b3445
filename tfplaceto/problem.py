"""`Problem`: everything a placer needs, as arrays: the DAG to place, devices, costs, constraints.

Placers (baselines and the policy) see only a Problem and return an int array: the device index
of every node. `make_problem` builds it from an op graph, a cluster and a cost profile, grouping
the graph first when it is large (placers then place groups, and `expand` maps back to ops).
Constraints every placer honours:
- `allowed[i, d]`: node i has a kernel on device d's type (for its whole colocation class);
- ties: nodes with equal `graph.colocation` share a device (`tie` enforces it);
- memory: a device's persistent bytes must fit (`fits`), checked by the simulator for peaks.
`Best` keeps the best placement a placer has simulated (lexicographic (OOM, step time)).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import DEVICE_TYPES, Cluster
from tfplaceto.costs.cost_profile import CostProfile
from tfplaceto.graph.grouping import DEFAULT_MAX_GROUPS, Grouping, group
from tfplaceto.graph.op_graph import OpGraph
from tfplaceto.sim import Simulator

# Graphs up to this many ops are placed op by op; larger ones are grouped first.
GROUPING_THRESHOLD = 512


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """A placement problem over `graph` (ops, or groups of `grouping.op_graph`)."""

    graph: OpGraph
    cluster: Cluster
    compute_s: np.ndarray  # (N, D) seconds of node i on device d
    allowed: np.ndarray  # (N, D) bool
    grouping: Grouping | None = None

    @property
    def num_nodes(self) -> int:
        return self.graph.num_ops

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    @property
    def memory_bytes(self) -> np.ndarray:
        return self.cluster.memory_bytes

    def simulator(self):
        """The compiled simulator for this problem (built once, cached)."""
        cached = self.__dict__.get("_simulator")
        if cached is None:
            cached = Simulator(self.graph, self.cluster, self.compute_s)
            object.__setattr__(self, "_simulator", cached)
        return cached

    def tie(self, device_of: np.ndarray) -> np.ndarray:
        """device_of with every colocation class moved to the device of its first node."""
        classes = self.graph.colocation
        first = np.full(classes.max() + 1, -1)
        for node in range(self.num_nodes):
            if first[classes[node]] < 0:
                first[classes[node]] = device_of[node]
        return first[classes].astype(np.int32)

    def expand(self, device_of: np.ndarray) -> np.ndarray:
        """Device index of every op of the original op graph."""
        return self.grouping.expand(device_of) if self.grouping is not None else np.asarray(device_of)

    def persistent_fits(self, device_of: np.ndarray) -> bool:
        used = np.bincount(device_of, weights=self.graph.persistent_bytes, minlength=self.num_devices)
        return bool((used <= self.memory_bytes).all())


@dataclasses.dataclass
class Best:
    """The best placement simulated so far: lexicographic (oom, step_time_s)."""

    step_time_s: float = np.inf
    oom: bool = True
    placement: np.ndarray | None = None

    def offer(self, step_time_s: float, oom: bool, placement: np.ndarray) -> bool:
        if (oom, step_time_s) < (self.oom, self.step_time_s):
            self.step_time_s, self.oom, self.placement = float(step_time_s), bool(oom), placement.copy()
            return True
        return False


def make_problem(op_graph: OpGraph, cluster: Cluster, costs: CostProfile,
                 max_groups: int = DEFAULT_MAX_GROUPS, grouping_threshold: int = GROUPING_THRESHOLD) -> Problem:
    """A Problem for op_graph; grouped when it has more than grouping_threshold ops."""
    compute = costs.per_device(op_graph, cluster)
    grouping = None
    graph = op_graph
    if op_graph.num_ops > grouping_threshold:
        grouping = group(op_graph, max_groups, weights=compute.min(1))
        graph = grouping.graph
        summed = np.zeros((graph.num_ops, compute.shape[1]))
        np.add.at(summed, grouping.op_to_group, compute)
        compute = summed
    allowed = allowed_devices(graph, cluster)
    _check_fits_somewhere(op_graph, cluster, allowed_devices(op_graph, cluster))
    return Problem(graph, cluster, compute, allowed, grouping)


def _check_fits_somewhere(op_graph: OpGraph, cluster: Cluster, allowed: np.ndarray) -> None:
    """UnplaceableError for a colocation class whose persistent memory fits no allowed device."""
    classes = op_graph.colocation
    need = np.bincount(classes, weights=op_graph.persistent_bytes)
    room = np.where(allowed, cluster.memory_bytes[None, :], 0).max(1)
    class_room = np.full(len(need), np.inf)
    np.minimum.at(class_room, classes, room)
    too_big = np.flatnonzero(need > class_room)
    if len(too_big):
        cls = int(too_big[0])
        members = np.flatnonzero(classes == cls)
        op = int(members[np.argmax(op_graph.persistent_bytes[members])])
        raise errors.UnplaceableError(
            f"{op_graph.names[op]!r} and the ops colocated with it hold {errors.format_bytes(need[cls])} "
            f"of variables, more than any device that can run them has "
            f"({errors.format_bytes(class_room[cls])}); use devices with more memory or shard the variable")


def allowed_devices(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """(N, D): node i has a kernel on device d's type, for every member of its colocation class."""
    classes = graph.colocation
    class_kernels = np.ones((classes.max() + 1, graph.kernels.shape[1]), bool)
    np.logical_and.at(class_kernels, classes, graph.kernels)
    type_column = np.array([DEVICE_TYPES.index(d.type) for d in cluster.devices])
    allowed = class_kernels[classes][:, type_column]
    stuck = np.flatnonzero(~allowed.any(1))
    if len(stuck):
        node = int(stuck[0])
        types = sorted({d.type for d in cluster.devices})
        raise errors.UnplaceableError(
            f"{graph.names[node]!r} (op type {graph.types[node]}) and the ops colocated with it have "
            f"no common kernel on this cluster's device types {types}; add a device type that has "
            "one (e.g. the host CPU) or remove the op")
    return allowed
