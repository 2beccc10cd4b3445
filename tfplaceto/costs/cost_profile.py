"""`CostProfile`: compute seconds of every op on every device kind of a cluster.

A CostProfile is an (ops x device kinds) array aligned with an OpGraph's nodes: seconds per
step, so an op in a while-loop body counts all its iterations. Device kinds
are `Device.kind` strings ("GPU:V100", "CPU:host"); `per_device(cluster)` expands the columns to
one per device of the cluster, which is what the simulator and placers use. `grouped` sums the
costs of the ops of each group. On disk it is the `tfplaceto.CostProfile` proto.
`profiled_graph_def` is the check both profilers (analytical, measured) make first: only an
imported OpGraph (one with a GraphDef, so not a grouped graph) can be profiled.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import Cluster
from tfplaceto.graph.op_graph import OpGraph
from tfplaceto.outputs import atomic_write, read_proto
from tfplaceto.protos import cost_profile_pb2


@dataclasses.dataclass(frozen=True, eq=False)
class CostProfile:
    """compute_s[i, k]: seconds op `op_names[i]` takes on a device of kind `device_kinds[k]`."""

    op_names: tuple[str, ...]
    device_kinds: tuple[str, ...]
    compute_s: np.ndarray
    source: str = ""
    graph_fingerprint: str = ""

    def __post_init__(self):
        compute = np.asarray(self.compute_s, dtype=np.float64)
        if compute.shape != (len(self.op_names), len(self.device_kinds)):
            raise errors.CostProfileError(
                f"compute_s has shape {compute.shape}, expected ({len(self.op_names)}, {len(self.device_kinds)})")
        if not np.all(np.isfinite(compute)) or (compute < 0).any():
            raise errors.CostProfileError("compute times must be finite and >= 0")
        compute.flags.writeable = False
        object.__setattr__(self, "compute_s", compute)

    def per_device(self, op_graph: OpGraph, cluster: Cluster) -> np.ndarray:
        """(num_ops, num_devices) compute seconds, checked against the graph and the cluster.

        Each device's column is its kind's times its `compute_scale` (1 unless calibrated).
        """
        self.check(op_graph)
        missing = [k for k in cluster.kinds if k not in self.device_kinds]
        if missing:
            raise errors.CostProfileError(
                f"the cost profile has no costs for device kinds {missing} (it has "
                f"{list(self.device_kinds)}); profile the graph for this cluster")
        columns = [self.device_kinds.index(d.kind) for d in cluster.devices]
        compute = np.ascontiguousarray(self.compute_s[:, columns])
        scales = cluster.compute_scales
        # A calibrated device computes at its own speed: its kind's column times its scale.
        return compute * scales if (scales != 1.0).any() else compute

    def check(self, op_graph: OpGraph) -> None:
        if tuple(op_graph.names) != self.op_names:
            raise errors.CostProfileError(
                f"the cost profile covers {len(self.op_names)} ops that differ from the graph's "
                f"{op_graph.num_ops}; profile this graph (tp.profile)")

    def grouped(self, op_to_group: np.ndarray, group_names: tuple[str, ...]) -> CostProfile:
        """Costs of groups: the sum over each group's ops."""
        sums = np.zeros((len(group_names), len(self.device_kinds)))
        np.add.at(sums, np.asarray(op_to_group), self.compute_s)
        return CostProfile(tuple(group_names), self.device_kinds, sums, self.source + "+grouped")

    # -- proto and files -------------------------------------------------------------------------
    def to_proto(self) -> cost_profile_pb2.CostProfile:
        proto = cost_profile_pb2.CostProfile(source=self.source, graph_fingerprint=self.graph_fingerprint,
                                             device_kinds=self.device_kinds)
        for name, row in zip(self.op_names, self.compute_s):
            proto.ops.add(op_name=name, compute_s=row.tolist())
        return proto

    @classmethod
    def from_proto(cls, proto: cost_profile_pb2.CostProfile) -> CostProfile:
        names = tuple(op.op_name for op in proto.ops)
        if any(len(op.compute_s) != len(proto.device_kinds) for op in proto.ops):
            raise errors.CostProfileError(
                f"every op of a cost profile needs {len(proto.device_kinds)} costs (one per device "
                "kind); the file is damaged: profile the graph again")
        compute = np.array([list(op.compute_s) for op in proto.ops], dtype=np.float64).reshape(
            len(names), len(proto.device_kinds))
        return cls(names, tuple(proto.device_kinds), compute, proto.source, proto.graph_fingerprint)

    def save(self, path: str | os.PathLike) -> None:
        atomic_write(path, self.to_proto().SerializeToString(deterministic=True))

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostProfile:
        return cls.from_proto(read_proto(path, cost_profile_pb2.CostProfile, errors.CostProfileError))


def profiled_graph_def(op_graph: OpGraph):
    """The GraphDef a profile is taken of: an imported OpGraph's (CostProfileError for anything
    else, a grouped graph included)."""
    if not isinstance(op_graph, OpGraph):
        raise errors.CostProfileError(
            f"expected a tfplaceto OpGraph, got {type(op_graph).__name__}; import the graph first "
            "(tp.import_graph)")
    if op_graph.graph_def is None:
        raise errors.CostProfileError(
            "this OpGraph has no GraphDef (it is a grouped graph): profile the op graph it was "
            "grouped from, then use CostProfile.grouped(grouping.op_to_group, "
            "grouping.graph.names)")
    return op_graph.graph_def
