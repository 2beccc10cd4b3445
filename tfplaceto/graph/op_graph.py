"""`OpGraph`: the one data structure every stage after import works on.

An OpGraph is an immutable bundle of numpy arrays describing a dataflow DAG (graph_nets style:
one namedtuple-like value, pure functions over it). Its nodes are TensorFlow ops, or groups of ops
after `tfplaceto.graph.grouping.group`; the same fields serve both, so the simulator, the
baselines and the policy work at either level.

Fields (N nodes, T tensors, E data edges, C control edges):
  names        (N,) str      op (or group) names; `index_of(name)` maps back.
  types        (N,) str      op types ("Conv2D", ...; "Group" for groups).
  tensor_producer (T,) int32 node producing each tensor that crosses an edge.
  tensor_bytes (T,) int64    bytes of each such tensor (static shapes, batch filled in).
  edge_tensor  (E,) int32    tensor carried by each data edge ...
  edge_consumer (E,) int32   ... to this node. One edge per (tensor, consumer) pair.
  control_senders, control_receivers (C,) int32: ordering-only edges (no bytes moved).
  output_bytes (N,) int64    bytes of all outputs of a node (transient memory it allocates).
  persistent_bytes (N,) int64 bytes held for the whole step (variables, optimizer slots, consts).
  colocation   (N,) int32    colocation group id; nodes with equal ids must share a device.
  kernels      (N, 2) bool   has a kernel for DEVICE_TYPES ("CPU", "GPU").
  topo_order   (N,) int32    a topological order of nodes (data and control edges).
  graph_def    the TensorFlow GraphDef the ops come from (None for a grouped graph).
  fetches      names of the fetched ops (the graph's sinks by default).
  variable_values  name -> ndarray of variable values known at import (may be empty).
  iterations   (N,) int64    times each node runs per step: 1 outside loops, the trips of its
                             loop frame(s) inside a while-loop body (see graph/loops.py).
  tensor_iterations (T,) int64 times each tensor crosses its edges per step (a body's tensors
                             move every iteration; a tensor entering or leaving a loop once).
  loops        the LoopFrames of the graph (name, parent, trips, source), () without loops.
  frame        (N,) int32    the loop frame (index into `loops`) each node runs in, -1 outside
                             loops (and for a group whose ops are not all in one frame).
  implementations  which alternative of each function with alternatives (a Keras LSTM/GRU's
                             cuDNN kernel or standard loop) the import kept: ImplementationChoices
                             (graph/implementations.py), () when there were none.
  unknown_shapes (N,) bool   a node reads a tensor of unknown static shape because a graph input
                             (a shapeless variable or queue) has one: its cost is a guess. All
                             False when not recorded (groups, hand-made graphs).

`senders`/`receivers` give the edges as node pairs (what a graph_nets GraphsTuple wants).
`csr(keys, n, values)` groups values by a node (or tensor) key: the one CSR builder the grouping,
the simulator's plan and the baselines' instance use.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import DEVICE_TYPES


@dataclasses.dataclass(frozen=True, eq=False)
class OpGraph:
    """A dataflow DAG of ops (or groups) as arrays; see the module docstring for the fields."""

    names: tuple[str, ...]
    types: tuple[str, ...]
    tensor_producer: np.ndarray
    tensor_bytes: np.ndarray
    edge_tensor: np.ndarray
    edge_consumer: np.ndarray
    control_senders: np.ndarray
    control_receivers: np.ndarray
    output_bytes: np.ndarray
    persistent_bytes: np.ndarray
    colocation: np.ndarray
    kernels: np.ndarray
    topo_order: np.ndarray
    graph_def: object | None = None
    fetches: tuple[str, ...] = ()
    variable_values: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    iterations: np.ndarray | None = None
    tensor_iterations: np.ndarray | None = None
    loops: tuple = ()
    frame: np.ndarray | None = None
    unknown_shapes: np.ndarray | None = None
    implementations: tuple = ()

    def __post_init__(self):
        if self.unknown_shapes is None:
            object.__setattr__(self, "unknown_shapes", np.zeros(len(self.names), bool))
        # Graphs without loops run every node and move every tensor once.
        if self.iterations is None:
            object.__setattr__(self, "iterations", np.ones(len(self.names), np.int64))
        if self.tensor_iterations is None:
            object.__setattr__(self, "tensor_iterations", np.ones(len(self.tensor_producer), np.int64))
        if self.frame is None:
            object.__setattr__(self, "frame", np.full(len(self.names), -1, np.int32))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
        object.__setattr__(self, "_index", {n: i for i, n in enumerate(self.names)})

    # -- sizes and lookups -----------------------------------------------------------------------
    @property
    def num_ops(self) -> int:
        return len(self.names)

    @property
    def op_names(self) -> tuple[str, ...]:
        return self.names

    @property
    def num_edges(self) -> int:
        return len(self.edge_tensor)

    def index_of(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise errors.InvalidGraphError(f"no op named {name!r} in the graph") from None

    @property
    def senders(self) -> np.ndarray:
        """Producer node of each data edge."""
        return self.tensor_producer[self.edge_tensor]

    @property
    def receivers(self) -> np.ndarray:
        """Consumer node of each data edge."""
        return self.edge_consumer

    @property
    def edge_bytes(self) -> np.ndarray:
        return self.tensor_bytes[self.edge_tensor]

    @property
    def scratch_bytes(self) -> np.ndarray:
        """(N,) int64: each node's output bytes beyond the tensors it makes (outputs nobody reads;
        a group's largest inside output), held only while the node runs; its tensors are held
        until their last reader (tfplaceto/sim/kernel.py)."""
        made = np.bincount(self.tensor_producer, weights=self.tensor_bytes, minlength=self.num_ops)
        return np.maximum(self.output_bytes - made, 0).astype(np.int64)

    def fingerprint(self) -> str:
        """A stable hash of the structure, sizes and constraints (not of variable values)."""
        digest = hashlib.sha256()
        digest.update("\0".join(self.names).encode())
        digest.update("\0".join(self.types).encode())
        for array in (self.tensor_producer, self.tensor_bytes, self.edge_tensor, self.edge_consumer,
                      self.control_senders, self.control_receivers, self.output_bytes,
                      self.persistent_bytes, self.colocation, self.kernels):
            digest.update(np.ascontiguousarray(array).tobytes())
        if self.has_loops:  # loop-free graphs keep their fingerprints (and cached profiles)
            for array in (self.iterations, self.tensor_iterations):
                digest.update(np.ascontiguousarray(array, np.int64).tobytes())
        return digest.hexdigest()[:16]

    @property
    def has_loops(self) -> bool:
        """Whether some node or tensor runs more than once per step (a while-loop body)."""
        return bool((self.iterations > 1).any() or (self.tensor_iterations > 1).any())

    def loop_report(self) -> list[dict]:
        """One dict per loop frame: name, parent (None at top level), trips, iterations per
        step (nested loops multiply), ops in its body, source of the count (for report.json)."""
        per_step = {}
        for f, frame in enumerate(self.loops):
            per_step[f] = frame.trips * (1 if frame.parent < 0 else per_step[frame.parent])
        return [{"name": frame.name, "parent": None if frame.parent < 0 else self.loops[frame.parent].name,
                 "trips": frame.trips, "iterations_per_step": per_step[f], "source": frame.source}
                for f, frame in enumerate(self.loops)]

    def implementation_report(self) -> list[dict]:
        """One dict per function with alternatives (a Keras LSTM/GRU layer): the layer, the
        device type it was imported for, the kernel kept ("cuDNN" or "standard"), the function
        kept and its call sites (for report.json)."""
        return [choice.as_dict() for choice in self.implementations]

    def __repr__(self) -> str:
        loops = f", {len(self.loops)} loops" if self.loops else ""
        return f"OpGraph({self.num_ops} ops, {self.num_edges} edges, {len(self.fetches)} fetches{loops})"


def make_op_graph(names: Sequence[str], types: Sequence[str], tensor_producer, tensor_bytes,
                  edge_tensor, edge_consumer, control_senders=(), control_receivers=(),
                  output_bytes=None, persistent_bytes=None, colocation=None, kernels=None,
                  graph_def=None, fetches: Sequence[str] = (),
                  variable_values: Mapping[str, np.ndarray] | None = None,
                  iterations=None, tensor_iterations=None, loops: Sequence = (),
                  frame=None, unknown_shapes=None) -> OpGraph:
    """Builds an OpGraph from plain sequences, filling defaults and checking it is a DAG.

    Defaults: output_bytes = sum of the node's tensor bytes, no persistent memory, every node its
    own colocation group, kernels on every device type, fetches = sinks, no loops (every node
    and tensor once per step).
    Raises InvalidGraphError for out-of-range indices or a cycle.
    """
    n = len(names)
    tensor_producer = np.asarray(tensor_producer, dtype=np.int32).reshape(-1)
    tensor_bytes = np.asarray(tensor_bytes, dtype=np.int64).reshape(-1)
    edge_tensor = np.asarray(edge_tensor, dtype=np.int32).reshape(-1)
    edge_consumer = np.asarray(edge_consumer, dtype=np.int32).reshape(-1)
    control_senders = np.asarray(control_senders, dtype=np.int32).reshape(-1)
    control_receivers = np.asarray(control_receivers, dtype=np.int32).reshape(-1)
    if len(types) != n:
        raise errors.InvalidGraphError("names and types differ in length")
    if len(tensor_producer) != len(tensor_bytes) or len(edge_tensor) != len(edge_consumer):
        raise errors.InvalidGraphError("tensor or edge arrays differ in length")
    if len(control_senders) != len(control_receivers):
        raise errors.InvalidGraphError("control edge arrays differ in length")
    for label, array, bound in (("tensor_producer", tensor_producer, n), ("edge_tensor", edge_tensor, len(tensor_producer)),
                                ("edge_consumer", edge_consumer, n), ("control_senders", control_senders, n),
                                ("control_receivers", control_receivers, n)):
        if array.size and (array.min() < 0 or array.max() >= bound):
            raise errors.InvalidGraphError(f"{label} has an index out of range")
    if output_bytes is None:
        output_bytes = np.bincount(tensor_producer, weights=tensor_bytes, minlength=n)
    output_bytes = np.asarray(output_bytes, dtype=np.int64)
    persistent_bytes = np.zeros(n, np.int64) if persistent_bytes is None else np.asarray(persistent_bytes, np.int64)
    colocation = np.arange(n, dtype=np.int32) if colocation is None else np.asarray(colocation, np.int32)
    kernels = np.ones((n, len(DEVICE_TYPES)), bool) if kernels is None else np.asarray(kernels, bool)
    iterations = _counts(iterations, n, "iterations")
    tensor_iterations = _counts(tensor_iterations, len(tensor_producer), "tensor_iterations")
    senders = tensor_producer[edge_tensor]
    topo = topological_order(n, np.concatenate([senders, control_senders]),
                             np.concatenate([edge_consumer, control_receivers]), names)
    if not fetches:
        has_out = np.zeros(n, bool)
        has_out[senders] = True
        has_out[control_senders] = True
        fetches = tuple(names[i] for i in range(n) if not has_out[i])
    return OpGraph(tuple(names), tuple(types), tensor_producer, tensor_bytes, edge_tensor, edge_consumer,
                   control_senders, control_receivers, output_bytes, persistent_bytes, colocation,
                   kernels, topo, graph_def, tuple(fetches), dict(variable_values or {}),
                   iterations, tensor_iterations, tuple(loops),
                   None if frame is None else np.asarray(frame, np.int32),
                   None if unknown_shapes is None else np.asarray(unknown_shapes, bool))


def _counts(values, n: int, label: str) -> np.ndarray:
    if values is None:
        return np.ones(n, np.int64)
    values = np.asarray(values, np.int64).reshape(-1)
    if len(values) != n or (values < 1).any():
        raise errors.InvalidGraphError(f"{label} needs {n} counts >= 1")
    return values


def joined_classes(n: int, pairs) -> np.ndarray:
    """Class id (0..C-1, numbered in order of each class's first item) of items 0..n-1 when each
    pair (a, b) puts a and b in one class: the connected components of the pairs' graph.
    `pairs`: a sequence of (a, b) or an (P, 2) int array."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    joined = coo_matrix((np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, labels = connected_components(joined, directed=False)
    return labels.astype(np.int64)


def topological_order(n: int, senders: np.ndarray, receivers: np.ndarray,
                      names: Sequence[str] = ()) -> np.ndarray:
    """Kahn's algorithm (ties by node index, so the order is deterministic).

    Raises InvalidGraphError naming a node on a cycle when the graph is not a DAG.
    """
    import heapq

    senders = np.asarray(senders, np.int64)
    receivers = np.asarray(receivers, np.int64)
    order = np.argsort(senders, kind="stable")
    starts = np.searchsorted(senders[order], np.arange(n + 1))
    succ = receivers[order]
    indegree = np.bincount(receivers, minlength=n)
    ready = [i for i in range(n) if indegree[i] == 0]
    heapq.heapify(ready)
    result = []
    while ready:
        node = heapq.heappop(ready)
        result.append(node)
        for child in succ[starts[node]:starts[node + 1]]:
            indegree[child] -= 1
            if indegree[child] == 0:
                heapq.heappush(ready, int(child))
    if len(result) != n:
        stuck = [i for i in range(n) if indegree[i] > 0]
        label = names[stuck[0]] if len(names) else str(stuck[0])
        raise errors.InvalidGraphError(
            f"the graph has a cycle through {label!r} ({len(stuck)} ops on or after cycles); "
            "only DAGs and TF while loops (NextIteration back edges) are supported")
    return np.asarray(result, dtype=np.int32)


def csr(keys, n: int, values=None, dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Compressed sparse rows: (ptr, grouped), where grouped[ptr[k]:ptr[k + 1]] are the values
    whose key is k (keys in [0, n)), in their original order; without `values`, their positions.

    ptr is int64; grouped a new C-contiguous array of `dtype`.
    """
    keys = np.asarray(keys, np.int64)
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    grouped = order if values is None else np.asarray(values)[order]
    return ptr, np.array(grouped, dtype=dtype, order="C", copy=True)
