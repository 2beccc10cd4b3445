"""`Placement`: the device of every op, and its conversions.

A Placement maps op (or group) names to full device names. Internally placers work with an int
array over the nodes of an OpGraph and the devices of a Cluster (`to_indices`/`from_indices`).
On disk it is the `tfplaceto.Placement` proto (protos/placement.proto), written and read through
`tfplaceto.outputs`; `load` also takes a placed GraphDef (`from_graph_def`: its nodes' devices).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import Cluster
from tfplaceto.graph.op_graph import OpGraph
from tfplaceto.outputs import atomic_write, read_proto
from tfplaceto.protos import placement_pb2


class Placement(Mapping[str, str]):
    """An immutable mapping op name -> device name, with the method that produced it."""

    def __init__(self, op_device: Mapping[str, str], method: str = "", notes: str = ""):
        self._op_device = dict(op_device)
        self.method = method
        self.notes = notes

    def __getitem__(self, op_name: str) -> str:
        return self._op_device[op_name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._op_device)

    def __len__(self) -> int:
        return len(self._op_device)

    def __repr__(self) -> str:
        devices = sorted(set(self._op_device.values()))
        return f"Placement({len(self)} ops on {len(devices)} devices, method={self.method!r})"

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(sorted(set(self._op_device.values())))

    # -- arrays ----------------------------------------------------------------------------------
    @classmethod
    def from_indices(cls, op_graph: OpGraph, cluster: Cluster, device_of: np.ndarray,
                     method: str = "", notes: str = "") -> Placement:
        device_of = np.asarray(device_of)
        if device_of.shape != (op_graph.num_ops,):
            raise ValueError(f"expected {op_graph.num_ops} device indices, got shape {device_of.shape}")
        names = cluster.device_names
        return cls({op: names[int(d)] for op, d in zip(op_graph.names, device_of)}, method, notes)

    def to_indices(self, op_graph: OpGraph, cluster: Cluster) -> np.ndarray:
        """Device index per node of op_graph. Every node must be placed on a cluster device."""
        missing = [n for n in op_graph.names if n not in self._op_device]
        if missing:
            raise errors.InvalidGraphError(
                f"the placement has no device for {len(missing)} ops, e.g. {missing[:3]}; "
                "place the same graph you simulate")
        lookup = {}
        result = np.empty(op_graph.num_ops, np.int32)
        for i, op in enumerate(op_graph.names):
            device = self._op_device[op]
            if device not in lookup:
                lookup[device] = cluster.index(device)
            result[i] = lookup[device]
        return result

    # -- proto and files -------------------------------------------------------------------------
    def to_proto(self) -> placement_pb2.Placement:
        return placement_pb2.Placement(op_device=self._op_device, method=self.method, notes=self.notes)

    @classmethod
    def from_proto(cls, proto: placement_pb2.Placement) -> Placement:
        return cls(dict(proto.op_device), proto.method, proto.notes)

    def save(self, path: str | os.PathLike) -> None:
        atomic_write(path, self.to_proto().SerializeToString(deterministic=True))

    @classmethod
    def from_graph_def(cls, graph_def, method: str = "", notes: str = "") -> Placement:
        """The devices a GraphDef's nodes carry (a placed graph: `optimize(...).graph_def`)."""
        return cls({node.name: node.device for node in graph_def.node if node.device}, method, notes)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Placement:
        """A Placement proto (`save`, `tfplaceto place --placement-out`) or a placed GraphDef
        (`tfplaceto place --out`, binary or .pbtxt): the devices its nodes carry."""
        graph_def = _placed_graph_def(path)
        if graph_def is not None:
            return cls.from_graph_def(graph_def, notes=f"devices of the GraphDef {os.fspath(path)}")
        proto = read_proto(path, placement_pb2.Placement, errors.InvalidGraphError)
        # An unplaced GraphDef parses as an empty Placement, or as op -> op type.
        if not proto.op_device or any(not device.startswith("/") for device in proto.op_device.values()):
            raise errors.InvalidGraphError(
                f"{os.fspath(path)} is neither a tfplaceto Placement proto (written by `tfplaceto place "
                "--placement-out` or Placement.save) nor a GraphDef whose ops carry devices (written by "
                "`tfplaceto place --out`)")
        return cls.from_proto(proto)


def as_placement(placement: Placement | Mapping[str, str]) -> Placement:
    return placement if isinstance(placement, Placement) else Placement(placement)


def _placed_graph_def(path: str | os.PathLike):
    """The GraphDef in path if it is one whose nodes carry devices, else None. (A Placement proto
    parses as a GraphDef too, protobuf being lenient, but its "nodes" never have a device.)"""
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None  # read_proto reports it
    graph_def = graph_pb2.GraphDef()
    try:
        graph_def.ParseFromString(data)
    except Exception:  # protobuf's DecodeError: maybe text
        try:
            graph_def = text_format.Parse(data.decode("utf-8"), graph_pb2.GraphDef())
        except Exception:
            return None
    if graph_def.node and any(node.device for node in graph_def.node) and all(node.op for node in graph_def.node):
        return graph_def
    return None
